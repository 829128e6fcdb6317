"""A 3x straggler at `cpu-0.1m`: K = 1 against K = M (M = 4) with the learners' shared token budget.

    PYTHONPATH=src python studies/decoupled-quorum/straggler.py [--merge rda|mean] [--seeds 0,1,2]

The settings of the study's no-fault `cpu-0.1m` rows (README, "At `cpu-0.1m`"), plus `slowdown=1,1,1,3`
(learner 3's steps padded by sleep to 3x its compute) and `learner_budget=tokens` (the learners together train
the run's 2.0M tokens; with K = 1 a fast learner trains more steps than `steps`, the straggler fewer). One run at
a time, K = 1 then K = 4 per seed; resumable: a run whose `run` key is in --out is skipped, rows are appended to
the study's records (results-cpu-0.1m.jsonl). Prints the table (mean +- s.e. over the seeds, wall-clock ratio).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from diloco.seed_stats import mean_se as seed_mean_se

HERE = Path(__file__).resolve().parent
SETS = {
    "size": "cpu-0.1m",
    "sources": "large",
    "steps": 0,
    "tokens": 2000000,
    "global_batch": 16,
    "replicas": 4,
    "inner_lr": 0.016,
    "sync_every": 12,
    "outer_momentum": 0.9,
    "eval_every": 250,
    "threads": 1,
    "slowdown": "1,1,1,3",
    "learner_budget": "tokens",
    "checkpoint_every": 0,
}
TIMEOUT_S = 900


def key(merge: str, K: int, seed: int) -> str:
    return f"straggler-{merge}-K{K}-s{seed}"


def one(merge: str, K: int, seed: int, work: Path) -> dict:
    out = work / key(merge, K, seed)
    sets = {**SETS, "quorum": K, "merge": merge, "seed": seed}
    cmd = [sys.executable, "-m", "diloco", "train", "--preset", "demo", "--method", "decoupled", "--out", str(out)]
    cmd += ["--no-progress", *(a for k, v in sets.items() for a in ("--set", f"{k}={v}"))]
    t0 = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    row = {"run": key(merge, K, seed), "method": "decoupled", "M": 4, "K": K, "merge": merge, "seed": seed}
    row |= {k: SETS[k] for k in ("size", "global_batch", "sync_every", "inner_lr", "outer_momentum", "slowdown")}
    row |= {"learner_budget": "tokens", "rc": proc.returncode, "process_wall_s": round(time.time() - t0, 1)}
    try:
        s = json.loads((out / "summary.json").read_text())
        row |= {
            "final_eval_loss": s["final_eval_loss"],
            "wall_time_s": round(s["wall_time_s"], 1),
            "learner_steps": s["learner_steps"],
            "tokens": s["tokens"],
            "goodput": s.get("goodput"),
        }
    except (OSError, ValueError, KeyError):
        row["error"] = proc.stderr[-2000:]
    shutil.rmtree(out, ignore_errors=True)
    return row


def mean_se(xs: list[float]) -> tuple[float, float]:
    """The mean and its standard error (NaN for one value)."""
    m, se = seed_mean_se(xs)
    return m, float("nan") if se is None else se


def table(rows: list[dict], merge: str) -> str:
    by = {
        K: [r for r in rows if r["run"].startswith(f"straggler-{merge}-K{K}-") and "final_eval_loss" in r]
        for K in (1, 4)
    }
    seeds = sorted({r["seed"] for r in by[1]} & {r["seed"] for r in by[4]})
    if not seeds:
        return f"{merge}: no pair of runs yet"
    lines = [
        "| merge | K | seeds | final loss (mean ± s.e.) | vs K = M | wall s (mean) | wall vs K = M "
        "| learner steps (mean) | tokens (mean) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    stats = {}
    for K in (4, 1):
        rs = [r for r in by[K] if r["seed"] in seeds]
        loss, se = mean_se([r["final_eval_loss"] for r in rs])
        wall = statistics.fmean(r["wall_time_s"] for r in rs)
        steps = [round(statistics.fmean(r["learner_steps"][m] for r in rs)) for m in range(4)]
        stats[K] = (loss, wall)
        vs = "–" if K == 4 else f"{100 * (loss / stats[4][0] - 1):+.2f} %"
        wvs = "–" if K == 4 else f"{wall / stats[4][1]:.2f}x"
        tokens = statistics.fmean(r["tokens"] for r in rs)
        lines.append(
            f"| {merge} | {K} | {len(rs)} | {loss:.4f} ± {se:.4f} | {vs} | {wall:.0f} | {wvs} | {steps} | {tokens:,.0f} |"
        )
    per_seed = []
    for s in seeds:
        a = next(r for r in by[1] if r["seed"] == s)
        b = next(r for r in by[4] if r["seed"] == s)
        per_seed.append(
            f"seed {s}: K=1 {a['final_eval_loss']:.4f} vs K=4 {b['final_eval_loss']:.4f} "
            f"({100 * (a['final_eval_loss'] / b['final_eval_loss'] - 1):+.2f} %), wall {a['wall_time_s']:.0f} / "
            f"{b['wall_time_s']:.0f} s = {a['wall_time_s'] / b['wall_time_s']:.2f}"
        )
    return "\n".join(lines + [""] + per_seed)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--merge", default="rda", choices=["rda", "mean"])
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--out", type=Path, default=HERE / "results-cpu-0.1m.jsonl")
    ap.add_argument("--report", action="store_true", help="print the table of what --out holds, run nothing")
    args = ap.parse_args()
    rows = [json.loads(line) for line in args.out.read_text().splitlines() if line.strip()] if args.out.exists() else []
    if not args.report:
        done = {r["run"] for r in rows}
        work = Path(tempfile.mkdtemp(prefix="decoupled-straggler-"))
        for seed in (int(s) for s in args.seeds.split(",")):
            for K in (1, 4):
                if key(args.merge, K, seed) in done:
                    continue
                row = one(args.merge, K, seed, work)
                with open(args.out, "a") as f:
                    f.write(json.dumps(row) + "\n")
                rows.append(row)
                print(
                    row["run"], row.get("final_eval_loss"), row.get("wall_time_s"), row.get("learner_steps"), flush=True
                )
    print(table(rows, args.merge))


if __name__ == "__main__":
    main()
