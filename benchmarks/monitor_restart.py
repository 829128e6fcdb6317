"""A ``diloco syncer`` monitor SIGKILLed mid-run and started again with the same command, on this machine's loopback
(:mod:`diloco.decoupled.monitor_faults`): two learner processes over gRPC, the monitor killed once the syncer has
merged 4 times. Two runs: K = M (the learners wait for their replies through the gap) and K = 1 with
``ride_out_steps=16`` (they train on for 16 steps, then wait). One row per run: the merges on disk at the kill and
those the syncer was restored with, seconds from the kill to the restored syncer's start and to its first merge,
each learner's worst step after the kill over its typical step, steps done once each, merges, the summary's
``monitor_restarts``, the final loss, wall time.

    python benchmarks/monitor_restart.py            # both runs, about 1-3 min on 2 cores
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from diloco.bench import add_out, machine, print_table, write_result
from diloco.decoupled.monitor_faults import run_monitor_restart
from diloco.files import default_cache_dir

COMMON = {"replicas": 2, "global_batch": 8, "num_fragments": 2, "overlap_steps": 1, "threads": 1, "step_time": 0.1}
RUNS = {
    "K = M, waits": {**COMMON, "quorum": 0, "merge": "mean", "grace_gamma": 0.0, "sync_every": 4, "steps": 48},
    "K = 1, ride_out_steps 16": {**COMMON, "quorum": 1, "sync_every": 8, "steps": 96, "ride_out_steps": 16},
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cache-dir", type=Path, default=None, help="token cache (default: the CLI's)")
    add_out(ap, "monitor_restart")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, sets in RUNS.items():
            sets = {**sets, "eval_every": sets["steps"]}
            got = run_monitor_restart(
                preset="tiny",
                sets=sets,
                out=Path(tmp) / name.replace(" ", "-").replace(",", ""),
                cache_dir=args.cache_dir or default_cache_dir(),
                kill_after=4,
            )
            learners = got["learners"]
            rows.append(
                {
                    "run": name,
                    "settings": sets,
                    "merges_at_kill": got["merges_at_kill"],
                    "restored_merges": got["restored_merges"],
                    "syncer_back_s": got["syncer_back_s"],
                    "first_merge_after_kill_s": got["first_merge_after_kill_s"],
                    "learner0_worst_after_kill": learners[0]["worst_step_after_kill"],
                    "learner1_worst_after_kill": learners[1]["worst_step_after_kill"],
                    "typical_step_s": learners[0]["typical_step_s"],
                    "every_step_once": all(r["steps"] == list(range(1, sets["steps"] + 1)) for r in learners.values()),
                    "merges": got["summary"]["merges"],
                    "monitor_restarts": got["summary"]["monitor_restarts"],
                    "final_eval_loss": got["summary"]["final_eval_loss"],
                    "wall_s": got["wall_s"],
                }
            )
    print_table(
        rows,
        [
            ("run", "run", ""),
            ("merges at kill", "merges_at_kill", "d"),
            ("restored", "restored_merges", "d"),
            ("syncer back s", "syncer_back_s", ".1f"),
            ("1st merge s", "first_merge_after_kill_s", ".1f"),
            ("L0 worst/typ", "learner0_worst_after_kill", ".1f"),
            ("L1 worst/typ", "learner1_worst_after_kill", ".1f"),
            ("steps once", "every_step_once", ""),
            ("merges", "merges", "d"),
            ("final loss", "final_eval_loss", ".4f"),
            ("wall s", "wall_s", ".1f"),
        ],
        title="diloco syncer SIGKILLed after 4 merges and run again (2 learner processes, steps padded to 0.1 s)",
    )
    write_result("monitor_restart", {"machine": machine(), "rows": rows}, out=args.out)


if __name__ == "__main__":
    main()
