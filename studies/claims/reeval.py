"""Re-evaluate the batch bracket's runs on one validation set (``diloco.studies.claims_common``): each run whose
final checkpoint is still on disk and whose own set was not the common one is evaluated on the first
``COMMON_EVAL`` validation windows, and one line per run is appended to ``common-eval.jsonl`` (resumable: a run
already there is skipped). It first re-evaluates one run whose own set is the common one and stops unless that
gives its recorded loss, so that the re-evaluation is shown to measure what the trainer measured.

    .venv/bin/python studies/claims/reeval.py      # about 15 s a run on one core
"""

from __future__ import annotations

import sys
import time

import torch

from diloco.files import append_jsonl, default_cache_dir, read_jsonl
from diloco.studies.claims import HERE
from diloco.studies.claims_common import COMMON_EVAL, REEVAL, common_of, has_final_checkpoint, own_set_is_common
from diloco.train.evaluation import evaluate
from diloco.train.export import global_model
from diloco.train.inputs import run_data

#: every run is evaluated in batches of batch 128's windows (its own set is the common one)
EVAL_BATCH = 128
#: the recorded loss and the re-evaluation of the same parameters on the same windows agree to float rounding
MATCH = 1e-5


def main() -> int:
    torch.set_num_threads(1)
    from diloco.data import eval_batches

    records = [r for r in read_jsonl(HERE / "results.jsonl") if r.get("status") == "ok" and common_of(r) is not None]
    done = {e["run_id"] for e in read_jsonl(REEVAL)} if REEVAL.exists() else set()
    todo = [r for r in records if not own_set_is_common(r) and r["run_id"] not in done and has_final_checkpoint(r)]
    check = next((r for r in records if own_set_is_common(r) and has_final_checkpoint(r)), None)
    if not todo:
        print(f"nothing to re-evaluate ({len(done)} runs in {REEVAL.name})")
        return 0
    root = HERE.parents[1]
    cache, val, val_key = default_cache_dir(), None, None

    def loss_of(r: dict) -> float:
        nonlocal val, val_key
        model, _meta, cfg = global_model(root / r["run_dir"], cache_dir=cache)
        key = (tuple(cfg.sources), cfg.vocab_size, cfg.seq_len, cfg.val_fraction)
        if key != val_key:
            data, _ = run_data(cfg, cache)
            val = list(
                eval_batches(
                    data.val, batch_size=EVAL_BATCH, seq_len=cfg.seq_len, max_batches=COMMON_EVAL // EVAL_BATCH
                )
            )
            val_key = key
        return evaluate(model, val, cfg.bf16)

    if check is not None:
        got = loss_of(check)
        print(f"check: run {check['run_id']} (batch {check['global_batch']}) recorded {check['eval_loss']:.6f}, "
              f"re-evaluated {got:.6f}")  # fmt: skip
        if abs(got - check["eval_loss"]) > MATCH:
            print("the re-evaluation does not reproduce the trainer's loss: stopping", file=sys.stderr)
            return 1
    with open(REEVAL, "a") as fh:
        for i, r in enumerate(todo, 1):
            t = time.perf_counter()
            loss = loss_of(r)
            append_jsonl(fh, {"run_id": r["run_id"], "eval_sequences": COMMON_EVAL, "eval_loss": loss})
            name, batch = common_of(r)
            print(
                f"[{i}/{len(todo)}] {name} batch {batch} lr {r['inner_lr']:g} seed {r['seed']}: own set "
                f"{r['eval_loss']:.4f}, common {loss:.4f} ({time.perf_counter() - t:.0f} s)",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
