"""The frontier study's grids (diloco.studies.frontier, written by studies/frontier/write_grids.py and
gpu_grids.py): the grids that probe another batch and that bracket each method's best inner lr, written from the
report's rows; and grids.jsonl, every grid the study's sweeps ran."""

import json
from pathlib import Path

import pytest

from diloco.studies import frontier
from diloco.studies.grid_files import grid_text, read_grids, write_grid_files

ROOT = Path(__file__).parents[2]


@pytest.fixture(scope="module")
def wg():
    return frontier


def _row(method, best, tried, batch=8, size="cpu-0.1m"):
    return {"size": size, "global_batch": batch, "method": method, "inner_lr": best, "lrs_tried": tried}


def test_bracketing_halves_and_doubles_one_lr_and_steps_past_an_edge(wg):
    rows = [
        _row("dp", 0.032, [0.032]),  # one lr: both neighbours
        _row("stat2-ef0.9", 0.016, [0.016, 0.032]),  # best at the low edge: half it
        _row("stat4-ef0.9", 0.032, [0.016, 0.032]),  # best at the high edge: twice it
        _row("streaming-fp4-tau1", 0.016, [0.008, 0.016, 0.032]),  # bracketed: nothing
        _row("dp", 0.032, [0.032], batch=16),  # another batch: not this one's
        _row("no-such-method", 0.01, [0.01]),
    ]  # not a method of the study: skipped
    out = wg.bracketing("cpu-0.1m", 8, rows)
    assert {name: g["inner_lr"] for name, g in out.items()} == {
        "cpu-0.1m-b8-dp-lr0.016": [0.016],
        "cpu-0.1m-b8-dp-lr0.064": [0.064],
        "cpu-0.1m-b8-stat2-ef0.9-lr0.008": [0.008],
        "cpu-0.1m-b8-stat4-ef0.9-lr0.064": [0.064],
    }
    grid = out["cpu-0.1m-b8-stat4-ef0.9-lr0.064"]
    template = wg.grids("cpu-0.1m", (8,))["cpu-0.1m-b8-stat4-ef0.9"]
    assert grid["base"] == template["base"] and grid["global_batch"] == [8] and grid["outer_lr"] == template["outer_lr"]
    assert "0.032 of 0.016, 0.032 tried" in grid["_comment"]


def test_another_batch_at_each_methods_best_lr(wg):
    rows = [
        _row("dp", 0.032, [0.016, 0.032, 0.064], batch=16),
        _row("eager-fp4-mom0.5", 0.016, [0.016], batch=16),
        _row("dp", 0.008, [0.008], batch=32),
    ]
    out = wg.at_best_lr("cpu-0.1m", 8, 16, rows)
    assert {name: g["inner_lr"] for name, g in out.items()} == {
        "cpu-0.1m-b8-dp-lr0.032": [0.032],
        "cpu-0.1m-b8-eager-fp4-mom0.5-lr0.016": [0.016],
    }
    assert out["cpu-0.1m-b8-eager-fp4-mom0.5-lr0.016"]["base"]["eager"] is True


@pytest.fixture(scope="module")
def gg():
    return frontier


def test_the_grids_file_holds_what_the_grid_writers_write():
    """Every grid that write_grids.py (16 and 32 at each size) and gpu_grids.py (the first stage) write today is in
    grids.jsonl as it ran, byte for byte; the others there were written by hand or from an earlier summary."""
    committed = read_grids(frontier.GRIDS)
    written = {name: g for size in frontier.INNER_LRS for name, g in frontier.grids(size, (16, 32)).items()}
    written |= {f"gpu/{name}": g for name, g in frontier.gpu_grids("cpu-1m").items()}
    by_hand = {"cpu-0.1m-b16-dp-muon"}  # widened by hand to a third lr (0.064) before it ran
    ran = {name: g for name, g in written.items() if name in committed and name not in by_hand}
    assert len(ran) >= 45 and len(committed) >= 300
    assert {name: grid_text(g) for name, g in ran.items()} == {name: grid_text(committed[name]) for name in ran}


def test_grid_files_are_written_back_as_they_ran_and_never_rewritten(tmp_path):
    names = ["cpu-0.1m-b16-dp", "gpu/cpu-1m-b128-dp"]
    paths = write_grid_files(frontier.GRIDS, tmp_path, names)
    assert [p.relative_to(tmp_path).as_posix() for p in paths] == [f"{n}.json" for n in names]
    assert json.loads(paths[1].read_text()) == read_grids(frontier.GRIDS)["gpu/cpu-1m-b128-dp"]
    paths[0].write_text("{}\n")
    write_grid_files(frontier.GRIDS, tmp_path, names)
    assert paths[0].read_text() == "{}\n"


def test_every_gpu_grid_is_its_cpu_grid_but_for_device_data_files_and_folder(wg, gg):
    """The GPU runs are the CPU study's runs: a grid of studies/frontier/grids/gpu differs from write_grids.py's grid
    of its method and batch only in the device, the corpus's token files, the runs folder, the lrs and the seed."""
    import re

    committed = read_grids(frontier.GRIDS)
    gpu = {name.removeprefix("gpu/"): g for name, g in committed.items() if name.startswith("gpu/")}
    assert len(gpu) >= 60
    methods = sorted(wg.METHODS, key=len, reverse=True)
    for stem, grid in sorted(gpu.items()):
        m = re.fullmatch(r"(cpu-[0-9.]+m)-b(\d+)-(.+?)(-lr[0-9.e-]+|-seed\d+)?", stem)
        size, batch, method = m.group(1), int(m.group(2)), m.group(3)
        assert method in methods, stem
        cpu = wg.grids(size, (batch,))[f"{size}-b{batch}-{method}"]
        base = dict(grid["base"])
        assert base.pop("device") == "cuda"
        assert base.pop("sources") == [f"{gg.TOKENS}/train.bin", f"{gg.TOKENS}/val.bin"]
        assert base.pop("runs_dir") == f"runs/frontier-gpu/{size}"
        cpu_base = dict(cpu["base"])
        assert cpu_base.pop("sources") == ["large"] and cpu_base.pop("runs_dir") == f"runs/frontier/{size}"
        assert base == cpu_base, stem
        same = ("sizes", "global_batch", "tokens_per_param", "methods", "replicas", "sync_every", "outer_lr", "runner")
        assert {k: grid[k] for k in same} == {k: cpu[k] for k in same}, stem
        if m.group(4) and m.group(4).startswith("-seed"):
            assert grid["seed"] == int(m.group(4)[5:]) and len(grid["inner_lr"]) == 1
        else:
            assert grid["seed"] == 0
    orders = sorted((ROOT / "studies" / "frontier").glob("gpu-stage*-order.txt"))
    assert len(orders) == 2
    for order in orders:
        for line in order.read_text().split():
            assert line.startswith("studies/frontier/grids/gpu/") and line.endswith(".json"), order.name
            assert "gpu/" + line.removeprefix("studies/frontier/grids/gpu/").removesuffix(".json") in committed


def _rec(method, batch, lr, loss, seed=0):
    from_cpu = {
        "dp": ("dp", 0.7, {}),
        "streaming-fp4-tau1": (
            "streaming",
            0.7,
            {"num_fragments": 3, "overlap_steps": 1, "merge_alpha": 0.5, "codec": "fp4_e3m0", "outer_momentum": 0.9},
        ),
    }[method]
    return {
        "status": "ok",
        "size": "cpu-1m",
        "method": from_cpu[0],
        "outer_lr": from_cpu[1],
        "base": from_cpu[2],
        "global_batch": batch,
        "inner_lr": lr,
        "eval_loss": loss,
        "seed": seed,
    }


def test_the_second_gpu_stage_steps_past_edges_and_adds_seeds(gg):
    records = [
        _rec("dp", 128, 0.008, 3.4),
        _rec("dp", 128, 0.016, 3.3),  # best at the high edge
        _rec("dp", 64, 0.008, 3.45),
        _rec("dp", 64, 0.016, 3.5),  # best at the low edge
        _rec("dp", 256, 0.016, 3.6),
        _rec("dp", 128, 0.016, 3.0, seed=1),  # another seed: not a choice
        _rec("streaming-fp4-tau1", 64, 0.004, 3.5),
        _rec("streaming-fp4-tau1", 64, 0.008, 3.4),
        _rec("streaming-fp4-tau1", 64, 0.016, 3.45),
        _rec("streaming-fp4-tau1", 128, 0.008, 3.6),
    ]
    out = gg.next_stage("cpu-1m", records)
    assert {k: (g["global_batch"], g["inner_lr"], g["seed"]) for k, g in out.items()} == {
        "cpu-1m-b64-dp-lr0.004": ([64], [0.004], 0),
        "cpu-1m-b128-dp-lr0.032": ([128], [0.032], 0),
        "cpu-1m-b256-dp-lr0.008": ([256], [0.008], 0),
        "cpu-1m-b256-dp-lr0.032": ([256], [0.032], 0),  # one lr
        "cpu-1m-b128-dp-seed1": ([128], [0.016], 1),
        "cpu-1m-b128-dp-seed2": ([128], [0.016], 2),
        "cpu-1m-b32-streaming-fp4-tau1": ([32], [0.004, 0.008], 0),  # best batch 64 at the low edge of 64, 128
        "cpu-1m-b128-streaming-fp4-tau1-lr0.004": ([128], [0.004], 0),  # one lr tried at 128: both neighbours
        "cpu-1m-b128-streaming-fp4-tau1-lr0.016": ([128], [0.016], 0),
        "cpu-1m-b64-streaming-fp4-tau1-seed1": ([64], [0.008], 1),
        "cpu-1m-b64-streaming-fp4-tau1-seed2": ([64], [0.008], 2),
    }
    assert [g["global_batch"][0] for g in out.values()] == sorted(g["global_batch"][0] for g in out.values())


def test_the_gpu_eval_curves_end_at_the_records_losses():
    """eval-curves-gpu.json (seeds.py --collect, what seeds.png is drawn from) holds every finished GPU run, and
    each curve ends at its record's final eval loss, after the record's token budget."""
    import json

    folder = ROOT / "studies" / "frontier"
    curves = json.loads((folder / "eval-curves-gpu.json").read_text())["curves"]
    records = [json.loads(line) for line in (folder / "results-gpu.jsonl").read_text().splitlines() if line.strip()]
    done = {r["run_id"]: r for r in records if r["status"] == "ok"}
    assert set(curves) == set(done) and len(done) >= 100
    for run_id, points in curves.items():
        (tokens, loss), rec = points[-1], done[run_id]
        assert loss == rec["eval_loss"] and tokens >= rec["tokens"] - rec["global_batch"] * 128, run_id
        assert [t for t, _ in points] == sorted(t for t, _ in points)
