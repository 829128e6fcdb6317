"""Decoupled DiLoCo at every quorum: the outer step's share per merge (outer_scale) against K = M and DP.

    PYTHONPATH=src python studies/decoupled-quorum/run_study.py [--jobs N] [--tier a|b|all] [--out results.jsonl]

Each run is `python -m diloco train --preset tiny` at equal tokens (global_batch 24 x 400 steps x 32 tokens,
whatever M), one torch thread per replica, H = 8 (the preset's), one fragment. Grid:

* tier a (tau = 1, seeds 0-2): M in {2, 3, 4, 8}; K in {1, M/2 (rounded up), M}; merge in {mean, rda};
  outer_scale in {none, share, sqrt-share} where K < M (K = M is never scaled); DP (M = 4) for reference;
* tier b (tau in {0, 2}, seeds 0-1): the same without outer_scale=none;
* tier l (what a 2-core machine can do in half an hour): tier a without M = 8;
* tier m8 (tau = 1, seeds 0-1): M = 8, K in {1, 4, 8}, both merges, outer_scale share and sqrt-share;
* tier tau (tau in {0, 2}, seeds 0-1): M in {2, 4}, K in {1, M/2, M}, both merges, the default rule of each
  (share for the mean, sqrt-share for RDA);
* tier late (tau = 1, seeds 0-1): (M, K) in {(3, 2), (4, 2), (8, 4)}, both merges at their default rule, with
  late_reports next (the rows above) and alone (the default since): a report that misses its slot's merge
  waits for the next quorum, or merges at once by itself. Rows also hold the goodput (1 - the waiting share).

Runs `--jobs` at a time; resumable (a run whose key is in --out is skipped). One JSON row per run: the
settings, final_eval_loss, first and largest evaluation loss (what a divergence guard would see), wall time.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

HERE = Path(__file__).resolve().parent
BASE = {"global_batch": 24, "steps": 400, "threads": 1, "eval_every": 50, "checkpoint_every": 0, "diverge_factor": 0}
TIMEOUT_S = 300  # a run takes 5-30 s on 2 cores


def runs(tier: str) -> list[dict]:
    out = []
    if tier == "tau":
        auto = {"mean": "share", "rda": "sqrt-share"}
        return [
            {
                "method": "decoupled",
                "M": M,
                "K": K,
                "merge": merge,
                "scale": auto[merge] if K < M else "share",
                "tau": tau,
                "seed": seed,
            }
            for seed in (0, 1)
            for tau in (0, 2)
            for M in (2, 4)
            for K in sorted({1, M // 2, M})
            for merge in ("mean", "rda")
        ]
    if tier == "late":
        auto = {"mean": "share", "rda": "sqrt-share"}
        return [
            {"method": "decoupled", "M": M, "K": K, "merge": merge, "scale": auto[merge], "tau": 1, "seed": seed}
            | {"late": late}
            for seed in (0, 1)
            for M, K in ((3, 2), (4, 2), (8, 4))
            for merge in ("mean", "rda")
            for late in ("next", "alone")
        ]
    if tier == "m8":
        return [
            {"method": "decoupled", "M": 8, "K": K, "merge": merge, "scale": scale, "tau": 1, "seed": seed}
            for seed in (0, 1)
            for K in (1, 4, 8)
            for merge in ("mean", "rda")
            for scale in (("share", "sqrt-share") if K < 8 else ("share",))
        ]
    if tier in ("a", "all", "l"):
        for seed in (0, 1, 2):
            out.append({"method": "dp", "M": 4, "K": 4, "merge": "-", "scale": "-", "tau": 0, "seed": seed})
    taus = {
        "a": [(1, (0, 1, 2), ("none", "share", "sqrt-share"))],
        "b": [(0, (0, 1), ("share", "sqrt-share")), (2, (0, 1), ("share", "sqrt-share"))],
    }
    plan = taus["a"] + taus["b"] if tier == "all" else taus["a" if tier == "l" else tier]
    for tau, seeds, scales in plan:
        for seed in seeds:
            for M in (2, 4, 3) if tier == "l" else (2, 4, 3, 8):
                for K in sorted({1, math.ceil(M / 2), M}):
                    for merge in ("mean", "rda"):
                        for scale in scales if K < M else ("share",):
                            out.append(
                                {
                                    "method": "decoupled",
                                    "M": M,
                                    "K": K,
                                    "merge": merge,
                                    "scale": scale,
                                    "tau": tau,
                                    "seed": seed,
                                }
                            )
    return out


def key(r: dict) -> str:
    late = f"-late{r['late']}" if "late" in r else ""  # tier late: late_reports (the other tiers ran before it)
    return f"{r['method']}-M{r['M']}-K{r['K']}-{r['merge']}-{r['scale']}-tau{r['tau']}{late}-seed{r['seed']}"


def train_command(*, method: str, out: Path, sets: dict) -> list[str]:
    """`python -m diloco train --preset tiny` with the study's ``--set`` overrides."""
    overrides = [a for k, v in sets.items() for a in ("--set", f"{k}={v}")]
    return [
        sys.executable,
        "-m",
        "diloco",
        "train",
        "--preset",
        "tiny",
        "--method",
        method,
        "--out",
        str(out),
        "--no-progress",
        *overrides,
    ]


def one(r: dict, work: Path) -> dict:
    out = work / key(r)
    sets = {**BASE, "replicas": r["M"], "seed": r["seed"]}
    if r["method"] == "decoupled":
        sets.update(quorum=r["K"], merge=r["merge"], outer_scale=r["scale"], overlap_steps=r["tau"])
        if "late" in r:
            sets["late_reports"] = r["late"]
    cmd = train_command(method=r["method"], out=out, sets=sets)
    t0 = time.time()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
        rc, stderr = proc.returncode, proc.stderr
    except subprocess.TimeoutExpired as exc:  # a run that hangs is recorded as such, not waited for
        rc, stderr = "timeout", str(exc.stderr or "")
    row = {"key": key(r), **r, "rc": rc, "wall_s": round(time.time() - t0, 2)}
    try:
        summary = json.loads((out / "summary.json").read_text())
        evals = [
            json.loads(line)["eval_loss"]
            for line in (out / "metrics.jsonl").read_text().splitlines()
            if '"eval_loss"' in line
        ]
        row.update(
            final_eval_loss=summary["final_eval_loss"],
            first_eval=evals[0] if evals else None,
            max_eval=max(evals) if evals else None,
            goodput=summary.get("goodput"),
        )
    except (OSError, ValueError, KeyError):
        row["error"] = stderr[-2000:]
    shutil.rmtree(out, ignore_errors=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--tier", default="a", choices=["a", "b", "l", "m8", "tau", "late", "all"])
    ap.add_argument("--out", type=Path, default=HERE / "results.jsonl")
    args = ap.parse_args()
    done = set()
    if args.out.exists():
        done = {json.loads(line)["key"] for line in args.out.read_text().splitlines() if line.strip()}
    todo = [r for r in runs(args.tier) if key(r) not in done]
    print(f"{len(todo)} runs to do ({len(done)} done)", flush=True)
    work = Path(tempfile.mkdtemp(prefix="decoupled-quorum-"))
    with ThreadPoolExecutor(args.jobs) as pool, open(args.out, "a") as f:
        futures = [pool.submit(one, r, work) for r in todo]
        for fut in as_completed(futures):
            row = fut.result()
            f.write(json.dumps(row) + "\n")
            f.flush()
            print(row["key"], row.get("final_eval_loss"), row["wall_s"], flush=True)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
