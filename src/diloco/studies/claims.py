"""The papers' quality claims study (studies/claims): the grids of its ablation from Streaming DiLoCo toward DiLoCo.

Claim 1 of the Streaming DiLoCo paper: fragments, overlap and a 4-bit exchange reach about DiLoCo's quality. The
ablation starts at the best Streaming point of studies/outer-tuning at ``cpu-0.25m`` (M = 2, H = 30, P = 3
strided fragments, tau = 1, FP4 E3M0, alpha = 0.5, outer lr 0.7 with Nesterov 0.9, inner lr 0.008, global batch
16 x 128, 20 tokens per parameter, warmup 120, bf16 + torch.compile, one thread, the large corpus: its record
there, seed 0, is 4.5303) and changes one factor at a time toward DiLoCo, ending at DiLoCo itself at the same H
and outer optimizer, and DiLoCo at its own tuned outer momentum (0.5: its best in studies/outer-tuning at this size,
the fair comparison for "similar quality to DiLoCo"). Every point runs at seeds 0-4; the grids are ordered seed-major, so a sweep stopped part way
has the same seeds of every factor.
"""

from __future__ import annotations

from diloco.seed_stats import mean_se
from diloco.studies import STUDIES
from diloco.studies.grid_files import train_grid

HERE = STUDIES / "claims"
GRIDS = HERE / "grids.jsonl"
SIZE = "cpu-0.25m"
SEEDS = (0, 1, 2, 3, 4)

BASE = {
    "vocab_size": 4096,
    "seq_len": 128,
    "warmup_steps": 120,
    "eval_every": 400,
    "eval_batches": 16,
    "threads": 1,
    "sources": ["large"],
    "bf16": True,
    "compile": True,
    "outer_momentum": 0.9,
    "runs_dir": f"runs/claims/{SIZE}",
}
STREAM = {"num_fragments": 3, "overlap_steps": 1, "merge_alpha": 0.5, "codec": "fp4_e3m0"}

#: factor -> (method, settings on top of BASE): the reference, then one change each, then DiLoCo at the reference's
#: outer optimizer (0.7 / 0.9) and at its own best (0.7 / 0.5)
ABLATION = {
    "streaming-fp4": ("streaming", STREAM),
    "P1": ("streaming", {**STREAM, "num_fragments": 1}),
    "tau0": ("streaming", {**STREAM, "overlap_steps": 0}),
    "fp32": ("streaming", {**STREAM, "codec": "fp32"}),
    "alpha0": ("streaming", {**STREAM, "merge_alpha": 0.0}),
    "alpha1": ("streaming", {**STREAM, "merge_alpha": 1.0}),
    "diloco": ("diloco", {}),
    "diloco-tuned": ("diloco", {"outer_momentum": 0.5}),
}


def ablation_grids(seeds: tuple[int, ...] = SEEDS) -> dict[str, dict]:
    """``{name: grid}``: one grid per factor and seed, seed-major."""
    out = {}
    for seed in seeds:
        for factor, (method, extra) in ABLATION.items():
            comment = f"Claim 1 ablation at {SIZE}: {factor} (one change from the best Streaming point)."
            out[f"ablation-{SIZE}-{factor}-s{seed}"] = _grid(comment, method, 2, 16, [0.008], seed, {**BASE, **extra})
    return out


def _grid(comment: str, method: str, m: int, batch: int, lrs: list[float], seed: int, base: dict) -> dict:
    """One grid of the study: ``method`` with ``m`` replicas at global ``batch`` and inner ``lrs``, H = 30, outer lr
    0.7, at ``SIZE``."""
    return train_grid(
        comment, size=SIZE, batch=batch, method=method, replicas=m, sync_every=[30], outer_lr=[0.7], inner_lr=lrs,
        seed=seed, base=base,
    )  # fmt: skip


#: claim 3 (DiLoCo's best batch is larger than data-parallel's): method name -> (method, M, inner lr best at batch
#: 16 in studies/outer-tuning at this size, outer momentum); each batch starts at that lr scaled by sqrt(batch / 16)
#: and its two neighbours a factor sqrt(2) away, so every batch's lr is bracketed from the start
BATCH_METHODS = {
    "dp": ("dp", 1, 0.016, None),
    "diloco-m1": ("diloco", 1, 0.016, 0.5),
    "diloco-m2": ("diloco", 2, 0.008, 0.5),
}
BATCHES = (8, 16, 32, 64)
#: the batch bracket's stages: stage 1 brackets each batch's inner lr at this seed; stage 2 runs these further seeds
#: at each method's best batch and its two neighbours, each at its best lr
BRACKET_SEED = 0
MORE_SEEDS = (1, 2)
#: the bracket adds a larger batch only while its run keeps this many warmups of steps: at the fixed token budget a
#: batch of 256 leaves 150 steps at this size, 120 of them warmup; past that the best batch is the largest run
MIN_WARMUPS = 2
#: the seeds every batch of stage 2 runs: the best batch is chosen by its mean over these alone, so that a batch with
#: more seeds (DiLoCo M = 2 at batch 16 is also the ablation's tuned DiLoCo, with 5) is compared at the same seeds
STAGE_SEEDS = (BRACKET_SEED, *MORE_SEEDS)
#: a batch's second-best lr at the bracket seed is tied with its best where its loss there is within this fraction of
#: the best's: a seed moves a loss by 0.2-0.6 % at this size (s.d. over seeds 0-2 at the seeded batches), so the
#: difference of two lrs' losses at one seed has an s.d. of about 0.5 %. Stage 2 seeds both, and the batch counts at
#: the one with the lower mean (at batch 128 DiLoCo M = 1's best lr at seed 0, 0.064, was 0.1 % ahead of 0.032 and 5 %
#: behind it at seeds 1 and 2). Only the runner-up: near its best the loss is flat in the lr, and more lrs would
#: double stage 2 for little
LR_TIE = 0.005


def _lr(x: float) -> float:
    return float(f"{x:.6g}")


def _batch_grid(name: str, batch: int, lrs: list[float], seed: int, comment: str) -> dict:
    method, m, _lr16, momentum = BATCH_METHODS[name]
    base = {k: v for k, v in BASE.items() if k != "outer_momentum"}
    if momentum is not None:
        base["outer_momentum"] = momentum
    return _grid(comment, method, m, batch, lrs, seed, base)


def _bracket(name: str, batch: int, seed: int) -> tuple[str, dict]:
    centre = BATCH_METHODS[name][2] * (batch / 16) ** 0.5
    lrs = [_lr(centre * f) for f in (2**-0.5, 1.0, 2**0.5)]
    comment = f"Claim 3 batch bracket at {SIZE}: {name} at global batch {batch}, inner lr bracketed."
    return f"batch-{SIZE}-{name}-b{batch}-s{seed}", _batch_grid(name, batch, lrs, seed, comment)


def batch_grids(seed: int = BRACKET_SEED) -> dict[str, dict]:
    """``{name: grid}``: the batch bracket's first stage, one grid per method and batch, three inner lrs each."""
    return dict(_bracket(name, batch, seed) for name in BATCH_METHODS for batch in BATCHES)


def batch_next_grids(records: list[dict]) -> dict[str, dict]:
    """``{name: grid}``: what the batch bracket needs next, from its records, per method whose stage 1 is complete
    (three inner lrs at the bracket seed at every batch it has). Where a batch's best lr is at its bracket's edge:
    one more lr a factor sqrt(2) further out; where the best batch is the largest or the smallest: the next batch
    (x2 or /2; a larger one only while its run keeps ``MIN_WARMUPS`` warmups of steps), bracketed as stage 1 is (both at once: the one does not wait for the other). With neither, stage 2: ``MORE_SEEDS`` at the best batch and its neighbours,
    each at its best lr and at the runner-up tied with it (``LR_TIE``). A method with nothing left adds nothing; a grid already run is named the same again (its
    runs are then skipped by the sweep)."""
    table = batch_table(records)
    out: dict[str, dict] = {}
    for name in BATCH_METHODS:
        t = table.get(name)
        if (
            t is None
            or set(BATCHES) - set(t["batches"])
            or any(len(b["bracket_lrs"]) < 3 for b in t["batches"].values())
        ):
            continue  # stage 1 not finished
        widen = {}
        for batch, b in t["batches"].items():
            if b["best_at_edge"]:
                lrs = b["bracket_lrs"]
                lr = _lr(b["best_lr"] * (2**0.5 if b["best_lr"] == max(lrs) else 2**-0.5))
                comment = f"Claim 3 batch bracket at {SIZE}: {name} at global batch {batch}, its bracket widened."
                widen[f"batch-{SIZE}-{name}-b{batch}-lr{lr:g}-s{BRACKET_SEED}"] = _batch_grid(
                    name, batch, [lr], BRACKET_SEED, comment
                )
        out.update(widen)
        batches = sorted(t["batches"])
        first = t["bracket_best_batch"]
        if first in (batches[0], batches[-1]):
            more = first * 2 if first == batches[-1] else first // 2
            steps = _steps(records, name, first)
            if more >= 1 and (steps is None or steps * first // more >= MIN_WARMUPS * BASE["warmup_steps"]):
                out.update([_bracket(name, more, BRACKET_SEED)])
                continue
        if widen:
            continue
        i = batches.index(t["best_batch"])  # seed 0's best, or the seeded one once stage 2 has moved it
        for batch in batches[max(0, i - 1) : i + 2]:
            b = t["batches"][batch]
            for seed in MORE_SEEDS:
                comment = f"Claim 3 batch bracket at {SIZE}: {name} at global batch {batch}, its best lr, seed {seed}."
                out[f"batch-{SIZE}-{name}-b{batch}-s{seed}"] = _batch_grid(name, batch, [b["best_lr"]], seed, comment)
                for lr in b["tied_lrs"]:
                    if lr != b["best_lr"]:
                        comment = (
                            f"Claim 3 batch bracket at {SIZE}: {name} at global batch {batch}, lr {lr:g} (tied with "
                            f"its best at seed {BRACKET_SEED}), seed {seed}."
                        )
                        grid = _batch_grid(name, batch, [lr], seed, comment)
                        out[f"batch-{SIZE}-{name}-b{batch}-lr{lr:g}-s{seed}"] = grid
    return out


def factor_of(record: dict) -> str | None:
    """The ablation factor a sweep record belongs to (None if it is none of them)."""
    base = record.get("base", {})
    point = {"size": SIZE, "replicas": 2, "global_batch": 16, "inner_lr": 0.008, "sync_every": 30, "outer_lr": 0.7}
    if any(k in record and record[k] != v for k, v in point.items()):  # e.g. the batch bracket's DiLoCo M = 2 runs
        return None
    for factor, (method, extra) in ABLATION.items():
        want = {**BASE, **extra}
        if record.get("method") == method and all(base.get(k) == v for k, v in want.items()):
            if set(base) - set(want) <= {"seed"}:
                return factor
    return None


def ablation_table(records: list[dict]) -> list[dict]:
    """One row per factor with finished runs: the seeds, the mean eval loss and its standard error (s.d. / sqrt n),
    and the difference of means to the reference (``streaming-fp4``), to ``diloco`` and to ``diloco-tuned`` in
    percent of theirs, with the standard error of that difference (the two errors in quadrature). A seed's latest ok record counts."""
    import math

    by: dict[str, dict[int, float]] = {}
    for r in records:
        factor = factor_of(r)
        if factor is not None and r.get("status") == "ok" and r.get("eval_loss") is not None:
            by.setdefault(factor, {})[int(r["seed"])] = float(r["eval_loss"])

    got = {f: mean_se(list(s.values())) for f, s in by.items()}

    def diff(f: str, ref: str) -> tuple[float | None, float | None]:
        if ref not in got or f == ref:
            return None, None
        (m, e), (mr, er) = got[f], got[ref]
        return 100 * (m - mr) / mr, (None if e is None or er is None else 100 * math.hypot(e, er) / mr)

    rows = []
    for factor in ABLATION:
        if factor in got:
            mean, se = got[factor]
            vs_ref, vs_ref_se = diff(factor, "streaming-fp4")
            vs_dil, vs_dil_se = diff(factor, "diloco")
            vs_tuned, vs_tuned_se = diff(factor, "diloco-tuned")
            rows.append(
                {
                    "factor": factor,
                    "seeds": sorted(by[factor]),
                    "mean": mean,
                    "se": se,
                    "vs_streaming_pct": vs_ref,
                    "vs_streaming_se_pct": vs_ref_se,
                    "vs_diloco_pct": vs_dil,
                    "vs_diloco_se_pct": vs_dil_se,
                    "vs_diloco_tuned_pct": vs_tuned,
                    "vs_diloco_tuned_se_pct": vs_tuned_se,
                }
            )
    return rows


def batch_of(record: dict) -> tuple[str, int] | None:
    """The batch bracket's (method name, global batch) a sweep record belongs to (None if it is no point of it)."""
    base = record.get("base", {})
    for name, (method, m, _lr16, momentum) in BATCH_METHODS.items():
        want = {k: v for k, v in BASE.items() if k != "outer_momentum"}
        if momentum is not None:
            want["outer_momentum"] = momentum
        if (record.get("method"), record.get("replicas"), record.get("size")) != (method, m, SIZE):
            continue
        if all(base.get(k) == v for k, v in want.items()) and set(base) - set(want) <= {"seed"}:
            return name, int(record["global_batch"])
    return None


def batch_table(records: list[dict]) -> dict[str, dict]:
    """Claim 3's table: per method, per batch, each inner lr's eval loss by seed; the batch's best lr (the lowest
    loss at the bracket seed, the one seed every lr of the bracket ran) and whether it is at the edge of those lrs
    (then the bracket does not show it is the best); ``tied_lrs``: it and the runner-up there where that is within ``LR_TIE``;
    ``stage_lr``, the tied lr with the lowest mean over ``STAGE_SEEDS`` among those that have them all (the best lr
    until one has); the seed mean and standard error at ``stage_lr``, over all its seeds (``seeds``, ``best_mean``,
    ``best_se``) and over ``STAGE_SEEDS`` alone (``stage_*``). Per method, the bracket's best batch (the lowest loss at the
    bracket seed, which decides where stage 2 runs its seeds), the best batch (once the bracket's best batch has all of
    ``STAGE_SEEDS`` at its best lr, the lowest mean over them among the batches that have them all; before, the
    bracket's best batch) and ``fitted_best_batch`` (see ``fitted_best_batch``).
    A seed's latest ok record counts."""
    losses: dict[str, dict[int, dict[float, dict[int, float]]]] = {}
    for r in records:
        key = batch_of(r)
        if key is not None and r.get("status") == "ok" and r.get("eval_loss") is not None:
            name, batch = key
            by_lr = losses.setdefault(name, {}).setdefault(batch, {})
            by_lr.setdefault(float(r["inner_lr"]), {})[int(r["seed"])] = float(r["eval_loss"])
    out: dict[str, dict] = {}
    for name in BATCH_METHODS:
        if name not in losses:
            continue
        batches = {}
        for batch in sorted(losses[name]):
            by_lr = dict(sorted(losses[name][batch].items()))
            at_seed = {lr: s[BRACKET_SEED] for lr, s in by_lr.items() if BRACKET_SEED in s}
            if not at_seed:
                continue  # only stage-2 seeds so far: no bracket to read a best lr from
            best = min(at_seed, key=at_seed.get)
            ranked = sorted(at_seed, key=at_seed.get)
            tied = sorted(ranked[:1] + [lr for lr in ranked[1:2] if at_seed[lr] <= at_seed[best] * (1 + LR_TIE)])
            seeded = [lr for lr in tied if set(STAGE_SEEDS) <= set(by_lr[lr])]
            stage_lr = min(seeded, key=lambda lr: mean_se([by_lr[lr][s] for s in STAGE_SEEDS])[0]) if seeded else best
            mean, se = mean_se(list(by_lr[stage_lr].values()))
            stage = {s: x for s, x in by_lr[stage_lr].items() if s in STAGE_SEEDS}
            stage_mean, stage_se = mean_se(list(stage.values()))
            batches[batch] = {
                "losses": by_lr,
                "bracket_lrs": sorted(at_seed),
                "best_lr": best,
                "bracket_loss": at_seed[best],
                "best_at_edge": len(at_seed) < 3 or best in (min(at_seed), max(at_seed)),
                "tied_lrs": tied,
                "stage_lr": stage_lr,
                "seeds": sorted(by_lr[stage_lr]),
                "best_mean": mean,
                "best_se": se,
                "stage_seeds": sorted(stage),
                "stage_mean": stage_mean,
                "stage_se": stage_se,
            }
        if not batches:
            continue
        out[name] = method_summary(batches)
    return out


def method_summary(batches: dict[int, dict]) -> dict:
    """A method's row of a batch table from its ``batches`` (each with ``bracket_loss`` and ``stage_seeds`` /
    ``stage_mean``): ``bracket_best_batch``, the lowest at the bracket seed; ``best_batch``, once that batch has every
    one of ``STAGE_SEEDS`` the lowest mean over them among the batches that have them all, else the bracket's best;
    and ``fitted_best_batch``."""
    first = min(batches, key=lambda b: batches[b]["bracket_loss"])
    seeded = [b for b in batches if len(batches[b]["stage_seeds"]) == len(STAGE_SEEDS)]
    best = min(seeded, key=lambda b: batches[b]["stage_mean"]) if first in seeded else first
    return {
        "batches": batches,
        "bracket_best_batch": first,
        "best_batch": best,
        "fitted_best_batch": fitted_best_batch(batches, best),
    }


def fitted_best_batch(batches: dict[int, dict], best: int) -> float | None:
    """The best batch between the grid's powers of 2: the vertex of the parabola in log2(batch) through the stage
    means at ``best`` and its two neighbours (x2 and /2), each with every one of ``STAGE_SEEDS``. None where ``best``
    is the smallest or largest batch run, a neighbour lacks seeds, or the three means are equal. As ``best`` is the
    lowest of the three, the vertex lies within a factor sqrt(2) of it."""
    three = [batches.get(b) for b in (best // 2, best, best * 2)]
    if best % 2 or any(b is None or len(b["stage_seeds"]) < len(STAGE_SEEDS) for b in three):
        return None
    f0, f1, f2 = (b["stage_mean"] for b in three)
    curve = f0 - 2 * f1 + f2
    if curve <= 0:
        return None
    return best * 2 ** (0.5 * (f0 - f2) / curve)


def against_dp(table: dict[str, dict]) -> list[dict]:
    """Claim 2 with seeds: each DiLoCo method against data-parallel at every batch where both have at least two of
    ``STAGE_SEEDS`` at their best lr: the difference of the stage means in percent of data-parallel's, with its
    standard error (unpaired, the two errors in quadrature)."""
    import math

    dp = table.get("dp", {}).get("batches", {})
    rows = []
    for name, t in table.items():
        if name == "dp":
            continue
        for batch, b in t["batches"].items():
            d = dp.get(batch)
            if d is None or min(len(b["stage_seeds"]), len(d["stage_seeds"])) < 2:
                continue
            rows.append(
                {
                    "method": name,
                    "batch": batch,
                    "seeds": sorted(set(b["stage_seeds"]) & set(d["stage_seeds"])),
                    "pct": 100 * (b["stage_mean"] - d["stage_mean"]) / d["stage_mean"],
                    "se_pct": 100 * math.hypot(b["stage_se"], d["stage_se"]) / d["stage_mean"],
                }
            )
    return rows


#: the checks of the bracket's slope (every method's loss falls with the batch at this budget): each reruns
#: ``CHECK_METHODS`` at the smallest and largest batch of stage 1, each at its best lr there, at the bracket seed, with
#: one setting changed, to see how much of the slope is that setting's. name -> (setting, its value at a batch of a
#: run of T steps, or None where the check does not run that batch; what the docs call it):
#: - wd: the bracket keeps AdamW's weight decay at 0.1 a step, as the frontier study did, so a small batch (more
#:   steps) decays more in all; the scaling-laws paper sets it to 1 / T.
#: - clip: the bracket clips each gradient's norm at 1; a small batch's noisier gradient is clipped more often.
#: - beta2: the bracket keeps AdamW's beta2 at 0.99 a step, so a small batch averages its second moment over fewer
#:   tokens; ``BETA2_REF ** (batch / BETA2_BATCH)`` keeps that average's half-life in tokens the largest batch's
#:   (the rule of Marek et al. 2025, "Small batch size training for language models"); at that batch it is the
#:   bracket's own run, so only the small batch runs.
BETA2_REF = 0.99
BETA2_BATCH = BATCHES[-1]
SLOPE_CHECKS = {
    "wd": ("weight_decay", lambda batch, steps: float(f"{1 / steps:.6g}"), "weight decay 1 / T"),
    "clip": ("grad_clip", lambda batch, steps: 0.0, "no gradient clipping"),
    "beta2": (
        "beta2",
        lambda batch, steps: None if batch == BETA2_BATCH else float(f"{BETA2_REF ** (batch / BETA2_BATCH):.6g}"),
        f"β2 {BETA2_REF} ^ (batch / {BETA2_BATCH})",
    ),
}
CHECK_METHODS = ("dp", "diloco-m1")
CHECK_BATCHES = (BATCHES[0], BATCHES[-1])


def _steps(records: list[dict], name: str, batch: int) -> int | None:
    for r in records:
        if batch_of(r) == (name, batch) and r.get("steps"):
            return int(r["steps"])
    return None


def check_grids(records: list[dict], check: str) -> dict[str, dict]:
    """``{name: grid}``: the slope check ``check``'s runs (one of ``SLOPE_CHECKS``), for each of ``CHECK_METHODS``
    whose stage 1 has the batches of ``CHECK_BATCHES``: its setting changed, at the batch's best lr, seed
    ``BRACKET_SEED``."""
    if check not in SLOPE_CHECKS:
        raise ValueError(f"unknown slope check {check!r}: one of {', '.join(SLOPE_CHECKS)}")
    setting, value_at, words = SLOPE_CHECKS[check]
    table = batch_table(records)
    out = {}
    for name in CHECK_METHODS:
        batches = table.get(name, {}).get("batches", {})
        for batch in CHECK_BATCHES:
            steps = _steps(records, name, batch)
            value = None if batch not in batches or steps is None else value_at(batch, steps)
            if value is None:
                continue
            comment = f"Claim 3 slope check at {SIZE}: {name} at global batch {batch}, {words}."
            grid = _batch_grid(name, batch, [batches[batch]["best_lr"]], BRACKET_SEED, comment)
            grid["base"][setting] = value
            out[f"{check}-{SIZE}-{name}-b{batch}-s{BRACKET_SEED}"] = grid
    return out


def check_table(records: list[dict]) -> list[dict]:
    """The slope checks beside the bracket: per method of ``CHECK_METHODS`` and batch of ``CHECK_BATCHES``, the eval
    loss at the best lr and the bracket seed in the bracket (``bracket``) and, per check, ``{check: {"value",
    "loss"}}`` (the setting's value and the loss at it; None where not run yet; ``is_bracket`` and the bracket's
    loss where the check's setting at that batch is the bracket's own, so that it does not run there)."""
    table = batch_table(records)
    rows = []
    for name in CHECK_METHODS:
        for batch in CHECK_BATCHES:
            b = table.get(name, {}).get("batches", {}).get(batch)
            if b is None:
                continue
            want = _batch_grid(name, batch, [b["best_lr"]], BRACKET_SEED, "")["base"]
            row = {"method": name, "batch": batch, "inner_lr": b["best_lr"], "bracket": b["bracket_loss"], "checks": {}}
            steps = _steps(records, name, batch)
            for check, (setting, value_at, _words) in SLOPE_CHECKS.items():
                if steps is not None and value_at(batch, steps) is None:
                    row["checks"][check] = {"value": None, "loss": b["bracket_loss"], "is_bracket": True}
                    continue
                runs = [
                    r
                    for r in records
                    if r.get("status") == "ok"
                    and r.get("global_batch") == batch
                    and r.get("seed") == BRACKET_SEED
                    and r.get("inner_lr") == b["best_lr"]
                    and (r.get("method"), r.get("replicas")) == BATCH_METHODS[name][:2]
                    and {k: v for k, v in r.get("base", {}).items() if k not in (setting, "seed")} == want
                    and r.get("base", {}).get(setting) is not None
                ]
                row["checks"][check] = (
                    {"value": runs[-1]["base"][setting], "loss": float(runs[-1]["eval_loss"]), "is_bracket": False}
                    if runs
                    else None
                )
            rows.append(row)
    return rows
