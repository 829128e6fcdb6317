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

from pathlib import Path

from diloco.studies.claims import (
    BASE,
    BRACKET_SEED,
    HERE,
    SIZE,
    STAGE_SEEDS,
    _batch_grid,
    batch_of,
    batch_table,
)

#: the validation windows every bracket run is compared on: the first 2,048 (264 K tokens), batch 128's own set,
#: the largest any bracket run used
COMMON_EVAL = 2048
REEVAL = HERE / "common-eval.jsonl"


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


def common_table(records: list[dict], reeval: list[dict]) -> dict[str, dict]:
    """Claim 3's table on the common windows (``batch_table`` of ``on_common_set``): per method and batch, the lrs
    measured there, the best batch, and the fitted one."""
    return batch_table(on_common_set(records, reeval))


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
