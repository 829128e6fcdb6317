"""The batch bracket of the claims study (:mod:`diloco.studies.claims`) measured on one validation set.

Each bracket run evaluated on the first ``eval_batches`` x ``global_batch`` windows of the validation split (the
trainer's default): 128 windows at batch 8, 2,048 at batch 128. That text differs in difficulty: one data-parallel
model of batch 128 scores 4.63 on the first 128 windows and 4.20 on the first 2,048. Losses at different batches
were measured on different text, so the bracket's comparisons across batches (its best batch, the loss's slope
with batch) are the text's as much as the runs'. Comparisons at one batch (each batch's best lr, claim 2 with seeds,
the ablation, at batch 16 throughout) are on one set and stand.

Here every bracket run counts on the same ``COMMON_EVAL`` windows: a run whose own set they are (batch 128) as it
is; a run whose final checkpoint is on disk re-evaluated (``studies/claims/reeval.py`` writes
``common-eval.jsonl``); a run without one rerun with ``eval_sequences = COMMON_EVAL`` (``common_grids``).
"""

from __future__ import annotations

import math
from pathlib import Path

from diloco.seed_stats import mean_se
from diloco.studies.claims import (
    BASE,
    BRACKET_SEED,
    HERE,
    MORE_SEEDS,
    SIZE,
    STAGE_SEEDS,
    _batch_grid,
    _lr,
    batch_of,
    batch_table,
    method_summary,
)

#: the validation windows every bracket run is compared on: the first 2,048 (264 K tokens), batch 128's own set,
#: the largest any bracket run used
COMMON_EVAL = 2048
REEVAL = HERE / "common-eval.jsonl"
#: the bracket's lrs lie on 0.016 x sqrt(2) ** k (``BATCH_METHODS``' batch-16 lrs, 0.016 and 0.008, are on it)
LATTICE = 0.016


def common_of(record: dict) -> tuple[str, int] | None:
    """The bracket point (method name, batch) of a rerun on the common set, or of a bracket run itself."""
    base = record.get("base", {})
    if base.get("eval_sequences") == COMMON_EVAL:
        base = {k: v for k, v in base.items() if k != "eval_sequences"}
    return batch_of({**record, "base": base})


def own_set_is_common(record: dict) -> bool:
    """Whether a run evaluated on the common windows itself: by ``eval_sequences``, or as its batch's own set."""
    base = record.get("base", {})
    if base.get("eval_sequences"):
        return base["eval_sequences"] == COMMON_EVAL
    return int(record.get("global_batch", 0)) * int(base.get("eval_batches", BASE["eval_batches"])) == COMMON_EVAL


def on_common_set(records: list[dict], reeval: list[dict]) -> list[dict]:
    """The bracket's records with their loss on the common windows, as bracket records (``batch_table`` reads
    them): a run evaluated there itself as it is; another by its entry in ``reeval`` (``{"run_id",
    "eval_sequences", "eval_loss"}``), else left out."""
    again = {e["run_id"]: float(e["eval_loss"]) for e in reeval if e.get("eval_sequences") == COMMON_EVAL}
    out = []
    for r in records:
        if r.get("status") != "ok" or common_of(r) is None:
            continue
        loss = r.get("eval_loss") if own_set_is_common(r) else again.get(r.get("run_id"))
        if loss is not None:
            base = {k: v for k, v in r.get("base", {}).items() if k != "eval_sequences"}
            out.append({**r, "base": base, "eval_loss": float(loss)})
    return out


def lr_choices(records: list[dict], reeval: list[dict]) -> dict[str, dict[int, float]]:
    """Per method and batch, the inner lr its curve on the common set counts at: the lr its seeds count at on the
    batch's own set (``stage_lr``: a choice made on one set, one lr per batch, so no batch gains from having more
    lrs measured on the common set); a batch first run on the common set chooses there."""
    own = batch_table(records)
    extra = [
        r
        for r in on_common_set(records, reeval)
        if common_of(r)[1] not in own.get(common_of(r)[0], {}).get("batches", {})
    ]
    out: dict[str, dict[int, float]] = {}
    for table in (own, batch_table(extra)):
        for name, t in table.items():
            out.setdefault(name, {}).update({b: x["stage_lr"] for b, x in t["batches"].items()})
    return {name: dict(sorted(v.items())) for name, v in out.items()}


def common_table(records: list[dict], reeval: list[dict]) -> dict[str, dict]:
    """Claim 3 on the common windows: per method and batch (of ``lr_choices``), the lr, the loss by seed there,
    the bracket seed's (``bracket_loss``) and the mean and s.e. over ``STAGE_SEEDS`` (``stage_*``); per method, the
    best batch (the lowest at the bracket seed until that batch has every one of ``STAGE_SEEDS``, then the lowest
    mean among the batches that have them all, as ``batch_table`` chooses) and ``fitted_best_batch``."""
    losses: dict[tuple[str, int, float], dict[int, float]] = {}
    for r in on_common_set(records, reeval):
        name, batch = common_of(r)
        losses.setdefault((name, batch, float(r["inner_lr"])), {})[int(r["seed"])] = float(r["eval_loss"])
    out = {}
    for name, lrs in lr_choices(records, reeval).items():
        batches = {}
        for batch, lr in lrs.items():
            by_seed = dict(sorted(losses.get((name, batch, lr), {}).items()))
            if BRACKET_SEED not in by_seed:
                continue
            stage = [by_seed[s] for s in STAGE_SEEDS if s in by_seed]
            mean, se = mean_se(stage)
            batches[batch] = {
                "lr": lr,
                "losses": by_seed,
                "bracket_loss": by_seed[BRACKET_SEED],
                "stage_seeds": [s for s in STAGE_SEEDS if s in by_seed],
                "stage_mean": mean,
                "stage_se": se,
            }
        if not batches:
            continue
        out[name] = {**method_summary(batches), "complete": set(batches) == set(lrs)}
    return out


def common_next_grids(records: list[dict], reeval: list[dict], has_checkpoint) -> dict[str, dict]:
    """``{name: grid}``: what claim 3 on the common set needs next, per method whose curve there is complete at the
    bracket seed (every batch of ``lr_choices``): where its best batch is the smallest, the next smaller one,
    bracketed (three lrs a factor sqrt(2) apart around the smallest batch's lr scaled by sqrt(1 / 2), at the bracket
    seed; one more a factor sqrt(2) further out where its best lr is at the edge); else stage 2 (as the bracket's: ``MORE_SEEDS`` at the best batch and its neighbours, at their
    lrs), each a run with ``eval_sequences = COMMON_EVAL`` where no run of that point can be re-evaluated (none ran,
    or its checkpoint is gone). The largest batch is never passed (``MIN_WARMUPS``: batch 256 leaves too few steps)."""
    common = common_table(records, reeval)
    ran = {}
    for r in records:
        key = common_of(r)
        if key is not None and r.get("status") == "ok":
            ran.setdefault((*key, float(r["inner_lr"]), int(r["seed"])), []).append(r)
    on_set = {(*common_of(r), float(r["inner_lr"]), int(r["seed"])) for r in on_common_set(records, reeval)}
    out: dict[str, dict] = {}

    def add(name: str, batch: int, lr: float, seed: int, why: str) -> None:
        point = (name, batch, lr, seed)
        if point in on_set or any(has_checkpoint(r) for r in ran.get(point, [])):
            return  # measured there, or reeval.py measures it
        grid = _batch_grid(name, batch, [lr], seed, f"Claim 3 on one validation set at {SIZE}: {name}, {why}.")
        grid["base"]["eval_sequences"] = COMMON_EVAL
        out[f"common-{SIZE}-{name}-b{batch}-lr{lr:g}-s{seed}"] = grid

    for name, t in common.items():
        if not t["complete"]:
            continue  # the reruns of common_grids first
        batches = sorted(t["batches"])
        if t["bracket_best_batch"] == batches[0] and batches[0] > 1:
            smaller = batches[0] // 2
            # around the smallest batch's lr scaled by sqrt(batch), on the bracket's lattice of lrs a factor sqrt(2)
            # apart (so that 0.0113137 / sqrt(2) is 0.008, as the bracket writes it)
            k = round(2 * math.log2(t["batches"][batches[0]]["lr"] / LATTICE)) - 1
            lrs = [_lr(LATTICE * 2 ** (j / 2)) for j in (k - 1, k, k + 1)]
            measured = {lr: ran.get((name, smaller, lr, BRACKET_SEED)) for lr in lrs}
            if all(measured.values()):  # its bracket ran: widen it where its best lr sits at an edge
                own = batch_table(on_common_set(records, reeval)).get(name, {}).get("batches", {}).get(smaller)
                if own is not None and own["best_at_edge"]:
                    lr = _lr(own["best_lr"] * (2**0.5 if own["best_lr"] == max(own["bracket_lrs"]) else 2**-0.5))
                    add(name, smaller, lr, BRACKET_SEED, f"global batch {smaller}, its bracket widened")
            for lr in lrs:
                add(name, smaller, lr, BRACKET_SEED, f"global batch {smaller}, inner lr bracketed")
            continue
        i = batches.index(t["best_batch"])
        for batch in batches[max(0, i - 1) : i + 2]:
            for seed in MORE_SEEDS:
                add(name, batch, t["batches"][batch]["lr"], seed, f"global batch {batch}, seed {seed}")
    return out


def common_grids(records: list[dict], has_checkpoint) -> dict[str, dict]:
    """``{name: grid}``: the reruns the common set needs: each bracket run at a batch's best lr and at the lr its
    seeds count at (``best_lr``, ``stage_lr``), at ``STAGE_SEEDS``, that ran, is not measured on the common windows
    and has no checkpoint to re-evaluate (``has_checkpoint(record)``), rerun with ``eval_sequences``; the bracket
    seed's first, then seed-major, so that a sweep stopped part way has whole curves at its seeds."""
    table = batch_table(records)
    latest = {}
    for r in records:
        key = batch_of(r)
        if key is not None and r.get("status") == "ok":
            latest[(*key, float(r["inner_lr"]), int(r["seed"]))] = r
    todo = []
    for name, t in table.items():
        for batch, b in t["batches"].items():
            for lr in sorted({b["best_lr"], b["stage_lr"]}):
                for seed in STAGE_SEEDS:
                    r = latest.get((name, batch, lr, seed))
                    if r is not None and not own_set_is_common(r) and not has_checkpoint(r):
                        todo.append((seed != BRACKET_SEED, seed, name, batch, lr))
    out = {}
    for _later, seed, name, batch, lr in sorted(todo):
        comment = (
            f"Claim 3 batch bracket at {SIZE} on one validation set: {name} at global batch {batch}, lr {lr:g}, "
            f"seed {seed}, evaluated on the first {COMMON_EVAL} validation windows."
        )
        grid = _batch_grid(name, batch, [lr], seed, comment)
        grid["base"]["eval_sequences"] = COMMON_EVAL
        out[f"common-{SIZE}-{name}-b{batch}-lr{lr:g}-s{seed}"] = grid
    return out


def has_final_checkpoint(record: dict, root: Path = HERE.parents[1]) -> bool:
    """Whether a record's run folder (relative to the repository) still holds a checkpoint to re-evaluate."""
    run_dir = record.get("run_dir")
    return bool(run_dir) and (root / run_dir / "checkpoints" / "latest.json").is_file()
