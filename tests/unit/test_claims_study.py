"""The claims study's ablation grids and table (diloco.studies.claims): every factor one change from the reference,
and the table's means, standard errors and differences against closed forms."""

from __future__ import annotations

import math

import pytest

from diloco.scaling.sweep import GridSpec, expand
from diloco.studies.claims import ABLATION, BASE, SEEDS, ablation_grids, ablation_table, factor_of


def test_each_factor_is_one_change_from_the_reference_and_the_grids_are_seed_major():
    grids = ablation_grids()
    assert len(grids) == len(ABLATION) * len(SEEDS)
    assert [g["seed"] for g in grids.values()] == [s for s in SEEDS for _ in ABLATION]
    ref = ABLATION["streaming-fp4"][1]
    for factor, (_method, extra) in ABLATION.items():
        changed = {k for k in {**ref, **extra} if ref.get(k) != extra.get(k)}
        assert factor in ("streaming-fp4", "diloco", "diloco-tuned") or len(changed) == 1, (factor, changed)
    runs = [run for g in grids.values() for run in expand(GridSpec(**{k: v for k, v in g.items() if k[0] != "_"}))]
    assert len({r["run_id"] for r in runs}) == len(runs)  # no two points share a run
    assert [factor_of(r) for r in runs[: len(ABLATION)]] == list(ABLATION)


def _record(factor: str, seed: int, loss: float, status: str = "ok") -> dict:
    method, extra = ABLATION[factor]
    return {"method": method, "base": {**BASE, **extra}, "seed": seed, "eval_loss": loss, "status": status}


def test_the_table_gives_seed_means_their_errors_and_the_differences():
    records = [_record("streaming-fp4", s, x) for s, x in enumerate([4.0, 4.2, 4.1])]
    records += [_record("diloco", s, x) for s, x in enumerate([4.0, 4.0, 4.0])]
    records += [_record("fp32", 0, 9.9, status="failed"), _record("fp32", 0, 4.1)]
    rows = {r["factor"]: r for r in ablation_table(records)}
    assert set(rows) == {"streaming-fp4", "diloco", "fp32"}
    ref = rows["streaming-fp4"]
    assert ref["mean"] == pytest.approx(4.1) and ref["se"] == pytest.approx(0.1 / math.sqrt(3))
    assert rows["diloco"]["se"] == 0.0 and rows["fp32"]["se"] is None  # one seed: no error
    assert rows["diloco"]["vs_streaming_pct"] == pytest.approx(100 * (4.0 - 4.1) / 4.1)
    assert rows["diloco"]["vs_streaming_se_pct"] == pytest.approx(100 * math.hypot(0.0, 0.1 / math.sqrt(3)) / 4.1)
    assert ref["vs_diloco_pct"] == pytest.approx(100 * 0.1 / 4.0) and ref["vs_streaming_pct"] is None
    assert ref["vs_diloco_tuned_pct"] is None  # no run of it among these records


def test_diloco_tuned_is_diloco_at_its_own_outer_momentum_and_the_batch_brackets_runs_are_not_it():
    from diloco.studies.claims import batch_grids

    assert {**ABLATION["diloco"][1], **ABLATION["diloco-tuned"][1]} == {"outer_momentum": 0.5}
    tuned = {**_record("diloco-tuned", 0, 4.5), "replicas": 2, "global_batch": 16, "inner_lr": 0.008}
    assert factor_of(tuned) == "diloco-tuned"
    grid = batch_grids()["batch-cpu-0.25m-diloco-m2-b32-s0"]  # the same base, another batch and lr
    other = {**tuned, "global_batch": 32, "inner_lr": grid["inner_lr"][1], "base": grid["base"]}
    assert factor_of(other) is None
    rows = {r["factor"]: r for r in ablation_table([tuned, _record("streaming-fp4", 0, 4.41)])}
    assert rows["streaming-fp4"]["vs_diloco_tuned_pct"] == pytest.approx(100 * (4.41 - 4.5) / 4.5)


def test_the_batch_bracket_scales_each_methods_lr_with_the_root_of_the_batch_and_brackets_it():
    from diloco.studies.claims import BATCH_METHODS, BATCHES, batch_grids

    grids = batch_grids()
    assert len(grids) == len(BATCH_METHODS) * len(BATCHES)
    for name, (method, m, lr16, _) in BATCH_METHODS.items():
        for batch in BATCHES:
            g = grids[f"batch-cpu-0.25m-{name}-b{batch}-s0"]
            low, mid, high = g["inner_lr"]
            assert (g["methods"], g["replicas"], g["global_batch"]) == ([method], [m], [batch])
            assert mid == pytest.approx(lr16 * math.sqrt(batch / 16), rel=1e-5)
            assert high / mid == pytest.approx(math.sqrt(2), rel=1e-4) and mid / low == pytest.approx(
                math.sqrt(2), rel=1e-4
            )


def _batch_record(name: str, batch: int, lr: float, seed: int, loss: float) -> dict:
    from diloco.studies.claims import BATCH_METHODS, batch_grids

    grid = batch_grids(seed)[f"batch-cpu-0.25m-{name}-b{batch}-s{seed}"]
    method, m, _, _ = BATCH_METHODS[name]
    return {
        "method": method,
        "replicas": m,
        "size": "cpu-0.25m",
        "global_batch": batch,
        "inner_lr": lr,
        "seed": seed,
        "base": grid["base"],
        "eval_loss": loss,
        "status": "ok",
    }


def test_the_batch_table_finds_each_batchs_best_lr_and_each_methods_best_batch():
    from diloco.studies.claims import batch_of, batch_table

    recs = [_batch_record("dp", 16, lr, 0, x) for lr, x in ((0.01, 4.3), (0.02, 4.2), (0.03, 4.25))]
    recs += [_batch_record("dp", 32, lr, 0, x) for lr, x in ((0.02, 4.4), (0.03, 4.35))]
    recs += [_batch_record("diloco-m2", 32, 0.01, s, x) for s, x in ((0, 4.1), (1, 4.3))]
    recs += [_batch_record("diloco-m2", 32, 0.02, 0, 4.15)]  # worse at the bracket seed, though below 4.2
    recs += [_batch_record("diloco-m2", 16, 0.01, 0, 4.0)]  # lowest at seed 0, but one seed against two
    recs.append({**recs[0], "status": "failed", "eval_loss": 1.0})  # a failed run: not counted
    assert batch_of(recs[0]) == ("dp", 16) and batch_of({**recs[0], "replicas": 2}) is None
    ablation = {"method": "diloco", "replicas": 2, "size": "cpu-0.25m", "global_batch": 16, "base": {**BASE}}
    assert batch_of(ablation) is None  # the ablation's DiLoCo (outer momentum 0.9) is no point of the bracket
    table = batch_table(recs)
    dp = table["dp"]
    assert dp["batches"][16]["best_lr"] == 0.02 and not dp["batches"][16]["best_at_edge"]
    assert dp["batches"][32]["best_lr"] == 0.03 and dp["batches"][32]["best_at_edge"]  # two lrs: no bracket
    assert dp["best_batch"] == dp["bracket_best_batch"] == 16
    m2 = table["diloco-m2"]
    b32 = m2["batches"][32]
    assert b32["best_lr"] == 0.01 and b32["seeds"] == [0, 1] and b32["best_mean"] == pytest.approx(4.2)
    assert b32["best_se"] == pytest.approx(0.1) and b32["bracket_lrs"] == [0.01, 0.02]
    assert m2["batches"][16]["best_se"] is None
    assert m2["bracket_best_batch"] == m2["best_batch"] == 16  # seed 0 decides until the best has seeds 0-2
    recs += [_batch_record("diloco-m2", b, 0.01, s, x) for b, x in ((16, 4.2), (32, 4.05)) for s in (1, 2)]
    m2 = batch_table(recs)["diloco-m2"]
    assert m2["bracket_best_batch"] == 16 and m2["best_batch"] == 32  # then the means over seeds 0-2 decide
    assert "diloco-m1" not in table


def _stage1(name: str, best_batch: int, edge: int | None = None) -> list[dict]:
    """Stage 1 of one method: every batch at its three bracket lrs, seed 0; the loss is lowest at ``best_batch``
    and at each batch's middle lr, except at batch ``edge``, where it is lowest at the largest lr; no two lrs of a
    batch are tied (the next best is 1.25 % higher)."""
    from diloco.studies.claims import BATCHES, batch_grids

    recs = []
    for batch in BATCHES:
        for i, lr in enumerate(batch_grids()[f"batch-cpu-0.25m-{name}-b{batch}-s0"]["inner_lr"]):
            shape = (2 - i) if batch == edge else abs(i - 1)
            recs.append(
                _batch_record(name, batch, lr, 0, 4.0 + 0.1 * abs(math.log2(batch / best_batch)) + 0.05 * shape)
            )
    return recs


def test_the_bracket_widens_a_best_lr_at_its_edge_before_it_runs_more_seeds():
    from diloco.studies.claims import batch_grids, batch_next_grids

    recs = _stage1("dp", 16, edge=32)
    assert batch_next_grids(recs[:-1]) == {}  # stage 1 unfinished: nothing yet
    todo = batch_next_grids(recs)
    high = batch_grids()["batch-cpu-0.25m-dp-b32-s0"]["inner_lr"][2]
    assert list(todo) == [f"batch-cpu-0.25m-dp-b32-lr{high * math.sqrt(2):.6g}-s0"]
    (grid,) = todo.values()
    assert grid["inner_lr"] == [pytest.approx(high * math.sqrt(2), rel=1e-5)] and grid["seed"] == 0
    assert {k: v for k, v in grid.items() if k not in ("inner_lr", "_comment")} == {
        k: v for k, v in batch_grids()["batch-cpu-0.25m-dp-b32-s0"].items() if k not in ("inner_lr", "_comment")
    }
    wider = _batch_record("dp", 32, grid["inner_lr"][0], 0, 4.2)  # worse than the old edge: the bracket closes
    assert set(batch_next_grids([*recs, wider])) == {
        f"batch-cpu-0.25m-dp-b{b}-s{s}" for b in (8, 16, 32) for s in (1, 2)
    }


def test_stage_two_runs_two_more_seeds_at_the_best_batch_and_its_neighbours_at_their_best_lrs():
    from diloco.studies.claims import batch_grids, batch_next_grids, batch_table

    recs = _stage1("diloco-m1", 32)
    todo = batch_next_grids(recs)
    assert set(todo) == {f"batch-cpu-0.25m-diloco-m1-b{b}-s{s}" for b in (16, 32, 64) for s in (1, 2)}
    for name, grid in todo.items():
        batch = grid["global_batch"][0]
        assert grid["inner_lr"] == [batch_grids()[f"batch-cpu-0.25m-diloco-m1-b{batch}-s0"]["inner_lr"][1]]
        assert grid["seed"] == int(name[-1]) and grid["methods"] == ["diloco"] and grid["replicas"] == [1]
    more = [_batch_record("diloco-m1", g["global_batch"][0], g["inner_lr"][0], g["seed"], 4.0) for g in todo.values()]
    table = batch_table(recs + more)["diloco-m1"]
    assert [len(table["batches"][b]["seeds"]) for b in (8, 16, 32, 64)] == [1, 3, 3, 3]
    assert table["best_batch"] == 32  # 4.0 at every added seed, so seed 0 decides
    assert set(batch_next_grids(recs + more)) == set(todo)  # the same grids again: the sweep skips their runs


def test_stage_two_seeds_a_runner_up_lr_tied_with_the_best_and_the_batch_counts_at_the_lower_mean():
    from diloco.studies.claims import LR_TIE, batch_grids, batch_next_grids, batch_table

    lrs = batch_grids()["batch-cpu-0.25m-diloco-m1-b64-s0"]["inner_lr"]
    recs = _stage1("diloco-m1", 32)
    tie = 4.1 * (1 + LR_TIE / 2)  # batch 64's best is lrs[1] at 4.1; lrs[2] is now within LR_TIE of it
    recs = [r if (r["global_batch"], r["inner_lr"]) != (64, lrs[2]) else {**r, "eval_loss": tie} for r in recs]
    assert batch_table(recs)["diloco-m1"]["batches"][64]["tied_lrs"] == lrs[1:]
    todo = batch_next_grids(recs)
    runner_up = {f"batch-cpu-0.25m-diloco-m1-b64-lr{lrs[2]:g}-s{s}" for s in (1, 2)}
    assert set(todo) == runner_up | {f"batch-cpu-0.25m-diloco-m1-b{b}-s{s}" for b in (16, 32, 64) for s in (1, 2)}
    assert {todo[n]["inner_lr"][0] for n in runner_up} == {lrs[2]}
    # seeds 1-2 put the runner-up's mean below the best's, and below batch 32's: batch 64 counts at it, and wins
    more = [
        _batch_record("diloco-m1", g["global_batch"][0], g["inner_lr"][0], g["seed"], 3.9 if n in runner_up else 4.2)
        for n, g in todo.items()
    ]
    b64 = batch_table(recs + more)["diloco-m1"]["batches"][64]
    assert b64["best_lr"] == lrs[1] and b64["stage_lr"] == lrs[2]
    assert b64["stage_mean"] == pytest.approx((tie + 3.9 + 3.9) / 3)
    assert batch_table(recs + more)["diloco-m1"]["best_batch"] == 64
    # a runner-up just outside LR_TIE is not seeded
    apart = [r if r["eval_loss"] != tie else {**r, "eval_loss": 4.1 * (1 + 2 * LR_TIE)} for r in recs]
    assert not any("-lr" in n for n in batch_next_grids(apart))


def test_a_best_batch_at_the_edge_of_the_batches_adds_the_next_batch():
    from diloco.studies.claims import batch_next_grids

    todo = batch_next_grids(_stage1("diloco-m2", 64))
    assert list(todo) == ["batch-cpu-0.25m-diloco-m2-b128-s0"]
    assert todo["batch-cpu-0.25m-diloco-m2-b128-s0"]["inner_lr"][1] == pytest.approx(
        0.008 * math.sqrt(128 / 16), rel=1e-5
    )
    assert list(batch_next_grids(_stage1("dp", 8))) == ["batch-cpu-0.25m-dp-b4-s0"]
    both = batch_next_grids(_stage1("dp", 64, edge=8))  # a best lr at its edge and the best batch at the edge
    assert set(both) == {"batch-cpu-0.25m-dp-b8-lr0.0226274-s0", "batch-cpu-0.25m-dp-b128-s0"}


def test_the_study_grids_on_file_are_the_ones_the_code_writes():
    from diloco.studies.claims import GRIDS, batch_grids
    from diloco.studies.grid_files import read_grids

    on_file = read_grids(GRIDS)
    for name, grid in {**ablation_grids(), **batch_grids()}.items():
        assert on_file[name] == grid, name


def _seeded(name: str, curve: dict[int, float], seeds=(0, 1, 2), spread: float = 0.01) -> list[dict]:
    """Each batch of ``curve`` at one lr and ``seeds``, its losses ``curve[batch]`` -/+ ``spread`` (mean exact)."""
    offsets = [spread * (i - (len(seeds) - 1) / 2) for i in range(len(seeds))]
    return [_batch_record(name, b, 0.01, s, x + o) for b, x in curve.items() for s, o in zip(seeds, offsets)]


def test_the_fitted_best_batch_is_the_parabolas_vertex_in_log2_batch():
    from diloco.studies.claims import batch_table

    vertex = math.log2(16) + 0.3  # loss = 4 + 0.05 (log2 b - vertex)^2, exactly a parabola in log2 batch
    curve = {b: 4.0 + 0.05 * (math.log2(b) - vertex) ** 2 for b in (8, 16, 32, 64)}
    t = batch_table(_seeded("dp", curve))["dp"]
    assert t["best_batch"] == 16 and t["fitted_best_batch"] == pytest.approx(2**vertex, rel=1e-9)
    assert t["batches"][16]["stage_mean"] == pytest.approx(curve[16])
    assert t["batches"][16]["stage_se"] == pytest.approx(0.01 / math.sqrt(3))
    edge = batch_table(_seeded("dp", {b: 5.0 - 0.1 * math.log2(b) for b in (8, 16, 32, 64)}))["dp"]
    assert edge["best_batch"] == 64 and edge["fitted_best_batch"] is None  # no batch above the best: no vertex
    short = [r for r in _seeded("dp", curve) if not (r["global_batch"] == 32 and r["seed"] == 2)]
    assert batch_table(short)["dp"]["fitted_best_batch"] is None  # a neighbour short of seeds: no vertex yet


def test_the_best_batch_is_chosen_at_the_stage_seeds_alone():
    from diloco.studies.claims import batch_table

    recs = _seeded("diloco-m2", {8: 4.0, 16: 4.1})  # batch 8 lower at seeds 0-2
    recs += [_batch_record("diloco-m2", 16, 0.01, s, 3.0) for s in (3, 4)]  # two more seeds at 16 only, far lower
    t = batch_table(recs)["diloco-m2"]
    assert t["batches"][16]["seeds"] == [0, 1, 2, 3, 4] and t["batches"][16]["stage_seeds"] == [0, 1, 2]
    assert t["batches"][16]["best_mean"] < 4.0 < t["batches"][16]["stage_mean"]
    assert t["best_batch"] == 8


def test_claim_two_compares_each_diloco_method_with_data_parallel_at_each_batch_both_seeded():
    from diloco.studies.claims import against_dp, batch_table

    recs = _seeded("dp", {16: 4.0, 32: 4.2}) + _seeded("diloco-m1", {16: 3.96}, spread=0.02)
    recs += _seeded("diloco-m1", {32: 4.0}, seeds=(0,))  # one seed: no error, so no row
    (row,) = against_dp(batch_table(recs))
    assert (row["method"], row["batch"], row["seeds"]) == ("diloco-m1", 16, [0, 1, 2])
    assert row["pct"] == pytest.approx(-1.0)
    assert row["se_pct"] == pytest.approx(100 * math.hypot(0.01, 0.02) / math.sqrt(3) / 4.0)


def test_the_docs_show_the_tables_the_records_give():
    from diloco.files import read_jsonl
    from diloco.studies.claims import HERE
    from diloco.studies.claims_docs import docs_tables

    docs = (HERE.parents[1] / "docs" / "results" / "index.md").read_text().splitlines()
    from diloco.studies.claims_common import REEVAL

    for lines in docs_tables(read_jsonl(HERE / "results.jsonl"), read_jsonl(REEVAL)).values():
        for line in lines:
            assert line in docs, f"docs/results/index.md lacks {line!r}: run studies/claims/report.py, copy its tables"


def test_the_slope_checks_run_both_ends_at_their_best_lr_with_one_setting_changed():
    from diloco.studies.claims import BETA2_BATCH, batch_of, batch_table, check_grids, check_table, factor_of

    recs = [{**r, "steps": 4816 * 8 // r["global_batch"]} for r in _stage1("dp", 16)]
    best = batch_table(recs)["dp"]["batches"]
    wd, clip, beta2 = (check_grids(recs, c) for c in ("wd", "clip", "beta2"))
    assert set(wd) == {"wd-cpu-0.25m-dp-b8-s0", "wd-cpu-0.25m-dp-b64-s0"}
    assert set(clip) == {"clip-cpu-0.25m-dp-b8-s0", "clip-cpu-0.25m-dp-b64-s0"}
    assert set(beta2) == {"beta2-cpu-0.25m-dp-b8-s0"} and BETA2_BATCH == 64  # at 64 the rule gives the bracket's 0.99
    for batch in (8, 64):
        for grids in (wd, clip):
            grid = next(g for n, g in grids.items() if f"-b{batch}-" in n)
            assert grid["inner_lr"] == [best[batch]["best_lr"]] and grid["seed"] == 0
        assert wd[f"wd-cpu-0.25m-dp-b{batch}-s0"]["base"]["weight_decay"] == pytest.approx(batch / (4816 * 8), rel=1e-5)
        assert clip[f"clip-cpu-0.25m-dp-b{batch}-s0"]["base"]["grad_clip"] == 0.0
    # the second moment's half-life in tokens is batch 64's at 0.99: 8 steps at batch 8 decay it as 1 step at 64
    assert beta2["beta2-cpu-0.25m-dp-b8-s0"]["base"]["beta2"] ** 8 == pytest.approx(0.99, rel=1e-5)
    with pytest.raises(ValueError, match="unknown slope check 'lr': one of wd, clip, beta2"):
        check_grids(recs, "lr")

    runs = [
        {**_batch_record("dp", 64, best[64]["best_lr"], 0, 3.9), "base": wd["wd-cpu-0.25m-dp-b64-s0"]["base"]},
        {**_batch_record("dp", 8, best[8]["best_lr"], 0, 4.2), "base": beta2["beta2-cpu-0.25m-dp-b8-s0"]["base"]},
    ]
    assert all(batch_of(r) is None and factor_of(r) is None for r in runs)  # the checks' runs are no point of it
    rows = {r["batch"]: r for r in check_table([*recs, *runs])}
    assert rows[64]["checks"]["wd"] == {
        "value": pytest.approx(64 / (4816 * 8), rel=1e-5),
        "loss": 3.9,
        "is_bracket": False,
    }
    assert rows[64]["bracket"] == best[64]["bracket_loss"]
    assert rows[8]["checks"]["wd"] is None and rows[8]["checks"]["clip"] is None and rows[64]["checks"]["clip"] is None
    assert rows[8]["checks"]["beta2"]["loss"] == 4.2  # a run of one check is not taken for another's
    assert rows[64]["checks"]["beta2"] == {"value": None, "loss": best[64]["bracket_loss"], "is_bracket": True}
    assert batch_table([*recs, *runs]) == batch_table(recs)


def test_a_larger_batch_is_added_only_while_its_run_keeps_two_warmups_of_steps():
    from diloco.studies.claims import BASE, MIN_WARMUPS, batch_next_grids

    steps = 4816 * 8  # the steps at batch 1 of this size's budget: 602 at batch 64, 301 at 128, 150 at 256
    assert steps // 128 >= MIN_WARMUPS * BASE["warmup_steps"] > steps // 256
    recs = [{**r, "steps": steps // r["global_batch"]} for r in _stage1("dp", 64)]
    assert list(batch_next_grids(recs)) == ["batch-cpu-0.25m-dp-b128-s0"]
    grid = batch_next_grids(recs)["batch-cpu-0.25m-dp-b128-s0"]
    at128 = [
        {**_batch_record("dp", 64, lr, 0, 3.9 + 0.05 * abs(i - 1)), "global_batch": 128, "inner_lr": lr, "steps": 301}
        for i, lr in enumerate(grid["inner_lr"])
    ]
    todo = batch_next_grids(recs + at128)  # best at 128, the largest: 256 would leave 150 steps, so stage 2 instead
    assert set(todo) == {f"batch-cpu-0.25m-dp-b{b}-s{s}" for b in (64, 128) for s in (1, 2)}


def test_stage_two_follows_the_best_batch_when_its_seeds_move_it():
    from diloco.studies.claims import batch_next_grids, batch_table

    recs = _stage1("diloco-m1", 32)  # seed 0 puts the best at 32: stage 2 at 16, 32 and 64
    best = {b: v["best_lr"] for b, v in batch_table(recs)["diloco-m1"]["batches"].items()}
    recs += [_batch_record("diloco-m1", 32, best[32], s, 4.5) for s in (1, 2)]  # 32 is worse at seeds 1-2
    recs += [_batch_record("diloco-m1", b, best[b], s, 4.1) for b in (16, 64) for s in (1, 2)]
    t = batch_table(recs)["diloco-m1"]
    assert t["bracket_best_batch"] == 32 and t["best_batch"] == 16
    assert set(batch_next_grids(recs)) == {f"batch-cpu-0.25m-diloco-m1-b{b}-s{s}" for b in (8, 16, 32) for s in (1, 2)}


def test_on_one_validation_set_a_run_counts_by_its_own_set_its_re_evaluation_or_its_rerun():
    from diloco.studies.claims import batch_table
    from diloco.studies.claims_common import COMMON_EVAL, common_of, common_table, on_common_set, own_set_is_common

    assert COMMON_EVAL == 128 * 16  # batch 128's own set: eval_batches (16) batches of 128 windows
    at64 = _batch_record("dp", 64, 0.03, 0, 4.2)
    at128 = {**_batch_record("dp", 64, 0.04, 0, 4.25), "global_batch": 128}
    rerun8 = {**_batch_record("dp", 8, 0.01, 0, 4.05), "run_id": "rerun8"}
    rerun8["base"] = {**rerun8["base"], "eval_sequences": COMMON_EVAL}
    old8 = {**_batch_record("dp", 8, 0.01, 0, 4.4), "run_id": "old8"}  # the same run on batch 8's own 128 windows
    at64["run_id"], at128["run_id"] = "at64", "at128"
    assert [own_set_is_common(r) for r in (at64, at128, rerun8, old8)] == [False, True, True, False]
    assert common_of(rerun8) == ("dp", 8) and batch_table([rerun8]) == {}  # a rerun is no point of the bracket itself
    reeval = [{"run_id": "at64", "eval_sequences": COMMON_EVAL, "eval_loss": 4.1}]
    got = {r["global_batch"]: r["eval_loss"] for r in on_common_set([old8, at64, at128, rerun8], reeval)}
    assert got == {8: 4.05, 64: 4.1, 128: 4.25}  # old8: neither re-evaluated nor on the set: left out, its rerun counts
    t = common_table([old8, at64, at128, rerun8], reeval)["dp"]
    assert t["best_batch"] == 8 and batch_table([old8, at64, at128])["dp"]["best_batch"] == 64


def test_the_reruns_on_one_validation_set_are_the_runs_with_no_checkpoint_seed_0_first():
    from diloco.studies.claims import batch_table
    from diloco.studies.claims_common import COMMON_EVAL, common_grids

    recs = _stage1("dp", 16)
    best = batch_table(recs)["dp"]["batches"]
    recs += [_batch_record("dp", b, best[b]["best_lr"], s, 4.0) for b in (8, 16, 32) for s in (1, 2)]
    for i, r in enumerate(recs):
        r["run_id"] = f"r{i}"
    kept = {r["run_id"] for r in recs if r["global_batch"] == 16}  # batch 16's checkpoints are on disk
    todo = common_grids(recs, lambda r: r["run_id"] in kept)
    want = [(b, 0) for b in (8, 32, 64)] + [(b, s) for s in (1, 2) for b in (8, 32)]
    assert [(g["global_batch"][0], g["seed"]) for g in todo.values()] == want
    for g in todo.values():
        assert g["inner_lr"] == [best[g["global_batch"][0]]["best_lr"]] and g["base"]["eval_sequences"] == COMMON_EVAL
    recs += [
        {**_batch_record("dp", 64, 0.04, 0, 4.1), "global_batch": 128, "run_id": "b128"}
    ]  # batch 128 is on the common set itself
    assert not any("-b128-" in n for n in common_grids(recs, lambda r: r["run_id"] in kept))


def test_on_one_validation_set_the_next_runs_follow_its_best_batch():
    from diloco.studies.claims import batch_table
    from diloco.studies.claims_common import COMMON_EVAL, common_next_grids, common_table, lr_choices

    recs = _stage1("dp", 16)  # on each batch's own set the best batch is 16
    for i, r in enumerate(recs):
        r["run_id"] = f"r{i}"
    lrs = {b: x["stage_lr"] for b, x in batch_table(recs)["dp"]["batches"].items()}
    assert lr_choices(recs, [])["dp"] == lrs
    chosen = {r["run_id"]: r["global_batch"] for r in recs if r["inner_lr"] == lrs[r["global_batch"]]}
    on_set = {8: 3.9, 16: 4.0, 32: 4.1, 64: 4.2}  # on one set the loss rises with the batch
    reeval = [{"run_id": k, "eval_sequences": COMMON_EVAL, "eval_loss": on_set[b]} for k, b in chosen.items()]

    def no_checkpoint(r):
        return False

    assert common_next_grids(recs, reeval[:-1], no_checkpoint) == {}  # the curve lacks a batch: its reruns first
    t = common_table(recs, reeval)["dp"]
    assert t["complete"] and t["best_batch"] == 8 and [t["batches"][b]["lr"] for b in (8, 64)] == [lrs[8], lrs[64]]

    todo = common_next_grids(recs, reeval, no_checkpoint)  # the best is the smallest: batch 4, bracketed
    four = [lrs[8] * 0.5**0.5 * f for f in (0.5**0.5, 1, 2**0.5)]  # around batch 8's lr, scaled by sqrt(batch)
    assert sorted(g["inner_lr"][0] for g in todo.values()) == pytest.approx(four, rel=1e-5)
    assert lrs[8] == 0.0113137 and 0.008 in {g["inner_lr"][0] for g in todo.values()}  # on the bracket's lattice
    assert all(g["base"]["eval_sequences"] == COMMON_EVAL and g["global_batch"] == [4] for g in todo.values())

    ran4 = []
    for i, g in enumerate(sorted(todo.values(), key=lambda g: g["inner_lr"][0])):
        rec = {**_batch_record("dp", 8, g["inner_lr"][0], 0, 4.0 + 0.05 * abs(i - 1)), "global_batch": 4}
        ran4.append({**rec, "base": g["base"], "run_id": f"four{i}"})  # batch 4: best at its middle lr, above 8
    t = common_table(recs + ran4, reeval)["dp"]
    assert sorted(t["batches"]) == [4, 8, 16, 32, 64] and t["best_batch"] == 8
    todo = common_next_grids(recs + ran4, reeval, no_checkpoint)  # stage 2 at 4, 8 and 16, on the set
    assert sorted((g["global_batch"][0], g["seed"]) for g in todo.values()) == [
        (b, s) for b in (4, 8, 16) for s in (1, 2)
    ]
    seeded = [{**_batch_record("dp", 16, lrs[16], s, 4.4), "run_id": f"s{s}"} for s in (1, 2)]  # on disk: re-evaluable
    todo = common_next_grids(recs + ran4 + seeded, reeval, lambda r: r["run_id"] in ("s1", "s2"))
    assert sorted((g["global_batch"][0], g["seed"]) for g in todo.values()) == [(b, s) for b in (4, 8) for s in (1, 2)]
