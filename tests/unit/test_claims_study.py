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
    recs += [_batch_record("diloco-m2", 16, 0.01, 0, 4.3)]
    recs.append({**recs[0], "status": "failed", "eval_loss": 1.0})  # a failed run: not counted
    assert batch_of(recs[0]) == ("dp", 16) and batch_of({**recs[0], "replicas": 2}) is None
    ablation = {"method": "diloco", "replicas": 2, "size": "cpu-0.25m", "global_batch": 16, "base": {**BASE}}
    assert batch_of(ablation) is None  # the ablation's DiLoCo (outer momentum 0.9) is no point of the bracket
    table = batch_table(recs)
    dp = table["dp"]
    assert dp["batches"][16]["best_lr"] == 0.02 and not dp["batches"][16]["best_at_edge"]
    assert dp["batches"][32]["best_lr"] == 0.03 and dp["batches"][32]["best_at_edge"]  # two lrs: no bracket
    assert dp["best_batch"] == 16
    m2 = table["diloco-m2"]
    assert m2["batches"][32]["best_mean"] == pytest.approx(4.2) and m2["batches"][32]["seeds"] == {0.01: [0, 1]}
    assert m2["best_batch"] == 32 and "diloco-m1" not in table
