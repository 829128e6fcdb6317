"""Learners that ride out a late reply (ride_out_steps), on Ray: the syncer killed by pid, and no faults.

    PYTHONPATH=src python studies/decoupled-quorum/chaos_rideout.py [--bounds 0,64] [--steps 240]

`diloco chaos --preset tiny`, M = 3, K = 2, tau = 1, H = 16, steps padded to 0.1 s, for each bound B: once
without faults and once with the syncer SIGKILLed at 10 s (Ray restarts it from its checkpoint). One row per
run in chaos-rideout.jsonl: the eval loss of the syncer's parameters, each learner's waiting share, merges,
and per syncer kill the learners' worst step / typical step, seconds down and merges restored.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bounds", default="0,64")
    ap.add_argument("--steps", type=int, default=240)
    ap.add_argument("--out", type=Path, default=HERE / "chaos-rideout.jsonl")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="chaos-rideout-"))
    for bound in (int(b) for b in args.bounds.split(",")):
        for fault in ("none", "syncer-kill"):
            out = work / f"b{bound}-{fault}"
            cmd = [
                sys.executable,
                "-m",
                "diloco",
                "chaos",
                "--preset",
                "tiny",
                "--out",
                str(out),
                "--step-time",
                "0.1",
                "--set",
                "replicas=3",
                "--set",
                "global_batch=12",
                "--set",
                "quorum=2",
                "--set",
                "overlap_steps=1",
                "--set",
                "sync_every=16",
                "--set",
                f"steps={args.steps}",
                "--set",
                f"ride_out_steps={bound}",
            ]
            if fault == "syncer-kill":
                cmd += ["--syncer-kill", "10"]
            t0 = time.time()
            proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
            row = {"ride_out_steps": bound, "fault": fault, "rc": proc.returncode, "wall_s": round(time.time() - t0, 1)}
            try:
                s = json.loads((out / "summary.json").read_text())
                row.update(
                    eval_loss=s.get("eval_loss"),
                    wait_share=s.get("wait_share"),
                    merges=s.get("merges"),
                    goodput=s.get("goodput"),
                    syncer_kills=s.get("syncer_kills"),
                )
            except (OSError, ValueError):
                row["error"] = proc.stderr[-3000:]
            with open(args.out, "a") as f:
                f.write(json.dumps(row) + "\n")
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
