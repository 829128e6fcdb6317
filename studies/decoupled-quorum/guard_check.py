"""Does the contribution guard fire on the quorum study's healthy runs? (It must not.)

    PYTHONPATH=src python studies/decoupled-quorum/guard_check.py [--jobs 2] [--out guard-check.jsonl]

Run it as a script, as above (not with ``-m``): Python then puts this folder first on the import path, so
``run_study`` beside it imports as it does for ``benchmarks/chaos.py``'s helpers; no ``sys.path`` edit.

Runs the study's configurations at today's defaults (guard="drop", guard_ratio 10, outer_scale="auto"), tau = 1,
seed 0: M in {2, 3, 4, 8}, K in {1, ceil(M / 2), M}, merge mean and RDA, the study's settings otherwise
(`run_study.py`'s BASE: tiny preset, global batch 24 x 400 steps, H = 8, one fragment). For each run it
reads the syncer's ``merges.jsonl`` and writes one row: the guard's events (drops or clips; 0 on a healthy
run), the largest norm ratio it judged, and the final loss. Resumable by key.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from run_study import BASE, TIMEOUT_S, train_command

HERE = Path(__file__).resolve().parent


def configs() -> list[dict]:
    return [
        {"M": M, "K": K, "merge": merge}
        for M in (2, 3, 4, 8)
        for K in sorted({1, math.ceil(M / 2), M})
        for merge in ("mean", "rda")
    ]


def key(c: dict) -> str:
    return f"M{c['M']}-K{c['K']}-{c['merge']}"


def one(c: dict, work: Path) -> dict:
    out = work / key(c)
    sets = {
        **BASE,
        "diverge_factor": 3,
        "replicas": c["M"],
        "seed": 0,
        "quorum": c["K"],
        "merge": c["merge"],
        "overlap_steps": 1,
    }
    cmd = train_command(method="decoupled", out=out, sets=sets)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    row = {"key": key(c), **c, "rc": proc.returncode}
    try:
        merges = [json.loads(line) for line in (out / "merges.jsonl").read_text().splitlines() if line.strip()]
        ratios = [r for m in merges for r in (m.get("ratios") or []) if r is not None]
        row.update(
            merges=len(merges),
            guard_events=sum(len(m.get("guard") or []) for m in merges),
            max_ratio=max(ratios) if ratios else None,
            final_eval_loss=json.loads((out / "summary.json").read_text())["final_eval_loss"],
        )
    except (OSError, ValueError, KeyError) as exc:
        row["error"] = f"{exc!r}: {proc.stderr[-1500:]}"
    shutil.rmtree(out, ignore_errors=True)
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", type=Path, default=HERE / "guard-check.jsonl")
    args = ap.parse_args()
    done = {json.loads(line)["key"] for line in args.out.read_text().splitlines()} if args.out.exists() else set()
    todo = [c for c in configs() if key(c) not in done]
    work = Path(tempfile.mkdtemp(prefix="diloco-guard-check-"))
    with ThreadPoolExecutor(args.jobs) as pool, open(args.out, "a") as fh:
        for row in pool.map(lambda c: one(c, work), todo):
            fh.write(json.dumps(row, allow_nan=False) + "\n")
            fh.flush()
            print(
                row["key"],
                row.get("guard_events"),
                row.get("max_ratio"),
                row.get("final_eval_loss"),
                row.get("error", "")[:200],
                flush=True,
            )
    rows = [json.loads(line) for line in args.out.read_text().splitlines()]
    events = sum(r.get("guard_events") or 0 for r in rows)
    top = max((r["max_ratio"] for r in rows if r.get("max_ratio") is not None), default=None)
    print(f"{len(rows)} runs, {events} guard events, largest judged ratio {top}")
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
