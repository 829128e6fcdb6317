"""How large is an honest outer gradient next to its reference? The contribution guard's ratios on healthy runs.

Trains the tiny preset (``diloco train``'s trainer, in-process replicas) with every method the guard serves and
records every ratio the guard judges (norm / the round's median, or / the running median of accepted norms;
:mod:`diloco.algorithm.guard`): the synchronous replicas' own outer gradients (diloco, streaming) and each
learner's report at the syncer (decoupled, K = M, K = 2 and K = 1, RDA at outer lr 0.7 / sqrt(M) and the mean).
No fault is injected: the largest ratio seen is what the default bar (``guard_ratio``) must stay above.

    PYTHONPATH=src python benchmarks/guard_ratios.py            # a few minutes on 2 cores
    PYTHONPATH=src python benchmarks/guard_ratios.py --steps 40 # the preset's length, ~1 minute

Prints a table (per run: syncs judged, median, p99 and max ratio, events) and writes
``benchmarks/results/guard_ratios.json`` (``--runs``: those rows replaced, the others kept). Runs with
1 < K < M can hang at the end (learners closing wait on each other's last rounds, with or without the
guard): rerun that one with ``--runs``.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import tempfile
import time
from pathlib import Path

from diloco.algorithm.guard import NormGuard
from diloco.bench import result_path, write_result
from diloco.files import default_cache_dir
from diloco.train.config import TrainConfig, load_preset
from diloco.train.trainer import train_model

RUNS = {
    "diloco M=2": dict(method="diloco", replicas=2),
    "diloco M=4": dict(method="diloco", replicas=4),
    # the running median's hardest case: outer gradients that grow sync after sync (a long inner lr warmup)
    "diloco M=2 warmup=steps/2": dict(method="diloco", replicas=2, warmup_steps=-2),
    "streaming M=2 H=2 warmup=steps/2": dict(
        method="streaming", replicas=2, sync_every=2, num_fragments=2, warmup_steps=-2
    ),
    "streaming M=2 (preset)": dict(
        method="streaming", replicas=2, num_fragments=3, overlap_steps=1, merge_alpha=0.5, codec="fp4_e3m0"
    ),
    "streaming M=4 P=3": dict(method="streaming", replicas=4, num_fragments=3, overlap_steps=1),
    "decoupled M=3 K=3 mean": dict(
        method="decoupled", replicas=3, quorum=3, merge="mean", num_fragments=3, overlap_steps=1
    ),
    "decoupled M=3 K=3 rda": dict(
        method="decoupled",
        replicas=3,
        quorum=3,
        merge="rda",
        num_fragments=3,
        overlap_steps=1,
        outer_lr=0.7 / math.sqrt(3),
    ),
    "decoupled M=3 K=2 rda": dict(
        method="decoupled",
        replicas=3,
        quorum=2,
        merge="rda",
        num_fragments=3,
        overlap_steps=1,
        outer_lr=0.7 / math.sqrt(3),
    ),
    "decoupled M=3 K=1 rda": dict(
        method="decoupled",
        replicas=3,
        quorum=1,
        merge="rda",
        num_fragments=3,
        overlap_steps=1,
        outer_lr=0.7 / math.sqrt(3),
    ),
}


def _recording(ratios: list[float]):
    """NormGuard.judge, also appending every ratio it judges to ``ratios`` (the guard's own code is unchanged)."""
    judge = NormGuard.judge

    def recorded(self, fragment, norm, round_norms=(), *, sender=None):
        verdict = judge(self, fragment, norm, round_norms, sender=sender)
        if verdict.ratio is not None:
            ratios.append(verdict.ratio)
        return verdict

    return judge, recorded


def _quantile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=160, help="steps per run (the preset: 40)")
    ap.add_argument("--runs", default="", help="comma-separated run names (default: all)")
    ap.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="train each run this many times (the decoupled ones "
        "differ from one time to the next: the learners' threads keep their own pace)",
    )
    args = ap.parse_args()
    base = load_preset("tiny")["base"]
    cache = default_cache_dir()
    rows = []
    names = [n for n in RUNS if not args.runs or n in args.runs.split(",")]
    for name in names:
        ratios: list[float] = []
        judge, recorded = _recording(ratios)
        run = dict(RUNS[name])
        if run.get("warmup_steps") == -2:
            run["warmup_steps"] = args.steps // 2
        cfg = TrainConfig.from_dict(
            {
                **base,
                **run,
                "steps": args.steps,
                "eval_every": args.steps,
                "global_batch": 12 if run["replicas"] == 3 else 8,
            }
        )
        NormGuard.judge = recorded
        t0, losses = time.time(), []
        try:
            for _ in range(args.repeats):
                with tempfile.TemporaryDirectory() as tmp:
                    losses.append(train_model(cfg, Path(tmp) / "run", cache_dir=cache, progress=False).final_eval_loss)
        finally:
            NormGuard.judge = judge
        row = {
            "run": name,
            "steps": args.steps,
            "repeats": args.repeats,
            "judged": len(ratios),
            "median": statistics.median(ratios),
            "p99": _quantile(ratios, 0.99),
            "max": max(ratios),
            "over_10": sum(r > 10 for r in ratios),
            "eval_loss": statistics.mean(losses),
            "seconds": time.time() - t0,
        }
        rows.append(row)
        print(
            f"{name:26} judged {row['judged']:4d}  median {row['median']:.2f}  p99 {row['p99']:.2f}  "
            f"max {row['max']:.2f}  >10: {row['over_10']}  loss {row['eval_loss']:.3f}  ({row['seconds']:.0f} s)",
            flush=True,
        )
    path = result_path("guard_ratios")
    if args.runs and path.exists():  # a subset: keep the other runs' rows of the same length
        old = json.loads(path.read_text())
        rows = [r for r in old["runs"] if r["run"] not in names and r["steps"] == args.steps] + rows
    write_result(
        "guard_ratios",
        {"settings": {"steps": args.steps}, "runs": sorted(rows, key=lambda r: list(RUNS).index(r["run"]))},
    )


if __name__ == "__main__":
    main()
