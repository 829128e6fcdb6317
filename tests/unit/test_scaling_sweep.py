"""Sweeps: grid expansion, stable run ids, resuming, failures, interruptions (in process and SIGKILL)."""

import fcntl
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from diloco.scaling.sweep import (
    GridSpec,
    expand,
    get_runner,
    ladder,
    read_results,
    register_runner,
    run_id_of,
    run_sweep,
)

ROOT = Path(__file__).resolve().parents[2]


def small_grid(**kw) -> GridSpec:
    spec = dict(
        sizes=("35M", "90M"),
        inner_lr=[1e-3, 2e-3],
        global_batch=[8, 16],
        replicas=(1, 2, 4),
        outer_lr=(0.4, 0.8),
        runner="synthetic",
    )
    spec.update(kw)
    return GridSpec(**spec)


class Counter:
    """A run function that counts its calls and can fail or interrupt on chosen calls."""

    def __init__(self, fail_on=(), interrupt_on=None):
        self.calls = []
        self.fail_on, self.interrupt_on = set(fail_on), interrupt_on

    def __call__(self, cfg):
        self.calls.append(cfg["run_id"])
        k = len(self.calls)
        if k == self.interrupt_on:
            raise KeyboardInterrupt
        if k in self.fail_on:
            raise RuntimeError("out of memory")
        return {"eval_loss": 3.0 + 1e-3 * k, "num_params": cfg["num_params"]}


def test_ladder_is_powers_of_the_factor():
    assert ladder(1e-3, 4e-3, "sqrt2") == (1e-3, 0.00141421, 2e-3, 0.00282843, 4e-3)
    assert ladder(16, 256, 2) == (16, 32, 64, 128, 256)
    assert ladder(16, 255, "2") == (16, 32, 64, 128)
    with pytest.raises(ValueError, match="factor"):
        ladder(1, 2, "cube")


def test_expand_counts_tokens_and_dp_shape():
    grid = small_grid()
    configs = expand(grid)
    per_size = 2 * 2  # lr x batch
    assert len(configs) == 2 * (per_size + 3 * 2 * 1 * per_size)  # sizes x (dp + M x outer_lr x H)
    for c in configs:
        assert c["tokens"] == 20 * c["num_params"]
        if c["method"] == "dp":
            assert (c["replicas"], c["outer_lr"], c["sync_every"]) == (1, None, None)
    assert [c["size"] for c in configs] == sorted((c["size"] for c in configs), key=["35M", "90M"].index)
    assert len({c["run_id"] for c in configs}) == len(configs)


def test_run_ids_are_stable_and_depend_on_every_setting():
    a, b = expand(small_grid()), expand(small_grid())
    assert [c["run_id"] for c in a] == [c["run_id"] for c in b]
    assert all(c["run_id"] == run_id_of(c) for c in a)
    changed = expand(small_grid(base={"seq_len": 256}))
    assert not {c["run_id"] for c in a} & {c["run_id"] for c in changed}


def test_grid_validation_names_the_problem():
    with pytest.raises(ValueError, match="do not divide"):
        small_grid(global_batch=[2, 6], replicas=(4,))
    with pytest.raises(ValueError, match="unknown size 'cpu-9m'"):
        small_grid(sizes=("cpu-9m",))
    with pytest.raises(ValueError, match="unknown grid keys"):
        GridSpec.from_dict({"sizes": ["35M"], "inner_lr": [1e-3], "global_batch": [8], "lr": 1})
    with pytest.raises(ValueError, match="per-size"):
        small_grid(inner_lr={"35M": [1e-3]})
    with pytest.raises(ValueError, match="methods"):
        small_grid(methods=("fedavg",))
    with pytest.raises(ValueError, match="repeats a value"):
        small_grid(inner_lr=[1e-3, 2e-3, 1e-3])
    with pytest.raises(ValueError, match="must be a number"):
        small_grid(outer_lr=["0.7"])
    with pytest.raises(ValueError, match="whole numbers"):
        small_grid(global_batch=[8, 12.5])
    assert small_grid(sizes=("cpu-9m",), num_params={"cpu-9m": 9_000_000}).size_params("cpu-9m") == 9_000_000


def test_grid_from_json_accepts_ladders_and_per_size_lists(tmp_path):
    path = tmp_path / "g.json"
    path.write_text(
        json.dumps(
            {
                "sizes": ["35M", "90M"],
                "runner": "synthetic",
                "inner_lr": {"35M": {"start": 2e-3, "stop": 4e-3, "factor": "sqrt2"}, "90M": [1e-3]},
                "global_batch": {"start": 8, "stop": 32, "factor": 2},
            }
        )
    )
    grid = GridSpec.from_json(path)
    assert grid.inner_lr == {"35M": (2e-3, 0.00282843, 4e-3), "90M": (1e-3,)}
    assert grid.global_batch["90M"] == (8, 16, 32)
    (tmp_path / "bad.json").write_text("{'sizes': [}")
    with pytest.raises(ValueError, match="not valid JSON"):
        GridSpec.from_json(tmp_path / "bad.json")


def test_finished_runs_are_skipped(tmp_path):
    grid, out = small_grid(), tmp_path / "r.jsonl"
    total = len(expand(grid))
    first = Counter()
    s1 = run_sweep(grid, results_path=out, run_fn=first, progress=False)
    assert (len(first.calls), s1.ran, s1.skipped) == (total, total, 0)
    again = Counter()
    s2 = run_sweep(grid, results_path=out, run_fn=again, progress=False)
    assert again.calls == [] and s2.skipped == total
    # Widen the grid: only the new points run.
    wider = small_grid(inner_lr=[1e-3, 2e-3, 4e-3])
    third = Counter()
    run_sweep(wider, results_path=out, run_fn=third, progress=False)
    assert len(third.calls) == len(expand(wider)) - total
    records = read_results(out)
    assert sorted(r["run_id"] for r in records) == sorted(c["run_id"] for c in expand(wider))
    fields = {
        "run_id",
        "size",
        "num_params",
        "method",
        "replicas",
        "inner_lr",
        "global_batch",
        "outer_lr",
        "sync_every",
        "tokens",
        "eval_loss",
        "wall_time_s",
        "status",
        "error",
    }
    assert all(fields <= set(r) and r["status"] == "ok" for r in records)


def test_failures_are_recorded_and_retried_only_on_request(tmp_path):
    grid, out = small_grid(), tmp_path / "r.jsonl"
    total = len(expand(grid))
    s = run_sweep(grid, results_path=out, run_fn=Counter(fail_on={2, 5}), progress=False)
    assert s.failed == 2
    failed = [r for r in read_results(out) if r["status"] == "failed"]
    assert len(failed) == 2 and all(
        r["error"] == "RuntimeError: out of memory" and r["eval_loss"] is None for r in failed
    )
    assert run_sweep(grid, results_path=out, run_fn=Counter(), progress=False).ran == 0
    retry = Counter()
    run_sweep(grid, results_path=out, run_fn=retry, progress=False, retry_failed=True)
    assert sorted(retry.calls) == sorted(r["run_id"] for r in failed)
    assert len(read_results(out)) == total + 2


def test_a_diverged_run_is_a_failure_not_a_nan(tmp_path):
    out = tmp_path / "r.jsonl"
    run_sweep(small_grid(sizes=("35M",)), results_path=out, run_fn=lambda c: {"eval_loss": math.nan}, progress=False)
    text = out.read_text()
    assert "NaN" not in text
    assert all(r["status"] == "failed" and "diverged" in r["error"] for r in read_results(out))


def test_keyboard_interrupt_loses_only_the_run_in_progress(tmp_path):
    grid, out = small_grid(), tmp_path / "r.jsonl"
    total = len(expand(grid))
    with pytest.raises(KeyboardInterrupt):
        run_sweep(grid, results_path=out, run_fn=Counter(interrupt_on=7), progress=False)
    assert len(read_results(out)) == 6
    rest = Counter()
    run_sweep(grid, results_path=out, run_fn=rest, progress=False)
    assert len(rest.calls) == total - 6
    ids = [r["run_id"] for r in read_results(out)]
    assert len(ids) == len(set(ids)) == total


def test_a_truncated_last_line_is_tolerated_and_repaired(tmp_path):
    grid, out = small_grid(), tmp_path / "r.jsonl"
    configs = expand(grid)
    good = {**configs[0], "eval_loss": 3.1, "status": "ok", "error": None, "wall_time_s": 1.0}
    out.write_text(json.dumps(good) + "\n" + json.dumps({**configs[1], "eval_loss": 3.2})[:40])
    with pytest.warns(UserWarning, match="r.jsonl:2: skipped an unfinished last line"):
        assert [r["run_id"] for r in read_results(out)] == [configs[0]["run_id"]]
    counter = Counter()
    run_sweep(grid, results_path=out, run_fn=counter, progress=False)
    assert len(counter.calls) == len(configs) - 1  # the half-written run is run again
    lines = out.read_text().splitlines()
    assert len(lines) == len(configs) and all(json.loads(line) for line in lines)


def test_a_corrupt_line_in_the_middle_is_an_error(tmp_path):
    out = tmp_path / "r.jsonl"
    out.write_text('{"run_id": "a"}\nnot json\n{"run_id": "b"}\n')
    with pytest.raises(ValueError, match=r"r.jsonl:2"):
        read_results(out)


def test_two_sweeps_cannot_write_one_file(tmp_path):
    out = tmp_path / "r.jsonl"
    with out.open("a") as holder:
        fcntl.flock(holder, fcntl.LOCK_EX)
        with pytest.raises(ValueError, match="another sweep"):
            run_sweep(small_grid(), results_path=out, run_fn=Counter(), progress=False)


@pytest.mark.parametrize("how", ["replaced", "removed"])
def test_a_results_file_replaced_or_removed_mid_sweep_loses_no_record(tmp_path, how):
    """``git stash`` or an editor's save puts a new file at the results path (here: an older copy of it, 2 records);
    a removal leaves none. The sweep writes on into the file the path names, with its records the new file lacks."""
    grid, out = small_grid(sizes=("35M",)), tmp_path / "r.jsonl"
    total = len(expand(grid))

    class Replacer(Counter):
        def __call__(self, cfg):
            if len(self.calls) == 4:  # 4 records written: the path now names another file
                if how == "replaced":
                    older = tmp_path / "older.jsonl"
                    older.write_text("".join(out.read_text().splitlines(keepends=True)[:2]))
                    os.replace(older, out)
                else:
                    out.unlink()
            return super().__call__(cfg)

    run = Replacer()
    with pytest.warns(
        UserWarning, match=rf"r.jsonl was replaced while the sweep ran.*the {2 if how == 'replaced' else 4} record"
    ):
        s = run_sweep(grid, results_path=out, run_fn=run, progress=False)
    assert s.ran == total
    ids = [r["run_id"] for r in read_results(out)]
    assert ids == run.calls and len(set(ids)) == total  # every record once, in the order they were written
    assert run_sweep(grid, results_path=out, run_fn=Counter(), progress=False).ran == 0  # nothing to run again


def test_runner_registry():
    assert (
        get_runner("synthetic")(
            {
                "num_params": 35e6,
                "replicas": 2,
                "method": "diloco",
                "inner_lr": 3e-3,
                "global_batch": 32,
                "outer_lr": 0.6,
            }
        )["synthetic"]
        is True
    )
    with pytest.raises(ValueError, match="unknown runner"):
        get_runner("nope")
    with pytest.raises(ValueError, match="must be a callable"):
        register_runner("bad", "diloco.train.sweep_runner:run_config")  # no import strings any more
    assert get_runner("train").__module__ == "diloco.scaling.sweep"  # a plain (lazy) import of the trainer


def _sweep_cmd(grid_path: Path, out: Path, delay: float) -> list[str]:
    return [
        sys.executable,
        "-m",
        "diloco",
        "sweep",
        "--grid",
        str(grid_path),
        "--out",
        str(out),
        "--runner",
        "synthetic",
        "--synthetic-delay",
        str(delay),
        "--no-progress",
    ]


def test_sigkill_midway_then_restart_loses_only_the_run_in_progress(tmp_path):
    grid = {
        "sizes": ["35M", "90M"],
        "inner_lr": [1e-3, 2e-3, 4e-3],
        "global_batch": [8, 16],
        "replicas": [1, 2],
        "outer_lr": [0.6],
    }
    grid_path, out = tmp_path / "grid.json", tmp_path / "results.jsonl"
    grid_path.write_text(json.dumps(grid))
    all_ids = {c["run_id"] for c in expand(GridSpec.from_dict({**grid, "runner": "synthetic"}))}
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}

    proc = subprocess.Popen(_sweep_cmd(grid_path, out, 0.05), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and (not out.exists() or out.read_text().count("\n") < 6):
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    before = read_results(out)
    assert 6 <= len(before) < len(all_ids), "the kill must land midway through the sweep"

    done = subprocess.run(_sweep_cmd(grid_path, out, 0.0), env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    after = read_results(out)
    ids = [r["run_id"] for r in after]
    assert sorted(ids) == sorted(all_ids)  # every grid point exactly once
    assert after[: len(before)] == before  # nothing written before the kill was lost or rewritten
    assert summary == {"total": len(all_ids), "skipped": len(before), "ran": len(all_ids) - len(before), "failed": 0}
    assert all(r["synthetic"] is True and r["runner"] == "synthetic" for r in after)


def test_sizes_outside_the_paper_table_come_from_the_model_zoo():
    sizes = pytest.importorskip("diloco.models.sizes")
    from diloco.models.transformer import count_params

    grid = small_grid(sizes=("cpu-1m",), base={"vocab_size": 512, "seq_len": 64})
    expected = count_params(sizes.make_config("cpu-1m", vocab_size=512, seq_len=64), embeddings=False)
    assert grid.size_params("cpu-1m") == expected
    assert expand(grid)[0]["tokens"] == 20 * expected


def test_a_sweep_over_batches_is_warned_when_each_batch_has_its_own_validation_set():
    from diloco.scaling.eval_sets import mixed_eval_sets
    from diloco.scaling.sweep import expand_grids

    one = dict(sizes=("35M",), replicas=(1,), outer_lr=(0.4,), runner="train")
    apart = expand_grids([small_grid(**one, global_batch=[8]), small_grid(**one, global_batch=[64])])
    (warning,) = mixed_eval_sets(apart)
    assert "35M at global batches 8, 64" in warning and "set base.eval_sequences" in warning
    fixed = dict(one, base={"eval_sequences": 2048})
    assert mixed_eval_sets(expand_grids([small_grid(**fixed, global_batch=[8, 64])])) == []
    assert mixed_eval_sets(expand_grids([small_grid(**one, global_batch=[8])])) == []  # one batch: nothing to compare
    assert mixed_eval_sets(expand(small_grid())) == []  # the synthetic runner evaluates nothing
