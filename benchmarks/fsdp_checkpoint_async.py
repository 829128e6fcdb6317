"""What sharded checkpoints cost FSDP workers, written in the foreground (``dcp.save``) or in the background
(``checkpoint_async``, ``dcp.async_save``).

Runs ``diloco train`` under torchrun: 2 workers of 2 ranks (4 processes, gloo), the demo
preset's model (cpu-1m, vocab 4096, seq_len 128), Streaming DiLoCo, 24 steps, once without
checkpoints (but the last), once with a checkpoint every 2 steps written in the foreground
and once in the background; ``--repeats`` times each, interleaved. Reports the run's wall time
(``summary.json``: setup, training, checkpoints) and the training time.

    .venv/bin/python benchmarks/fsdp_checkpoint_async.py      # ~5 minutes on 2 cores

Prints a table and writes benchmarks/results/fsdp_checkpoint_async.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from diloco.bench import summarize, write_result

HERE = Path(__file__).resolve().parent
MODES = {
    "none": ["checkpoint_every=0"],
    "foreground": ["checkpoint_every=2", "checkpoint_async=false"],
    "background": ["checkpoint_every=2", "checkpoint_async=true"],
}


def run(mode: str, out: Path, steps: int) -> dict[str, float]:
    sets = [
        "worker_sharding=fsdp",
        "ranks_per_worker=2",
        f"steps={steps}",
        "eval_every=1000",
        "eval_batches=1",
        "threads=1",
        *MODES[mode],
    ]
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
    }
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "4",
        "-m",
        "diloco",
        "train",
        "--preset",
        "demo",
        "--method",
        "streaming",
        "--no-progress",
        "--out",
        str(out),
        "--overwrite",
        *[a for kv in sets for a in ("--set", kv)],
    ]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise SystemExit(f"{mode}: torchrun exited with {done.returncode}:\n{done.stderr[-3000:]}")
    summary = json.loads((out / "summary.json").read_text())
    return {"wall_time_s": summary["wall_time_s"], "train_time_s": summary["train_time_s"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--out", type=Path, default=HERE / "results" / "fsdp_checkpoint_async.json")
    args = ap.parse_args(argv)
    results: dict[str, list[dict[str, float]]] = {m: [] for m in MODES}
    with tempfile.TemporaryDirectory(prefix="fsdp-ckpt-async-") as tmp:
        for _ in range(args.repeats):
            for mode in MODES:
                results[mode].append(run(mode, Path(tmp) / mode, args.steps))
    print(
        f"\ndiloco train, 2 FSDP workers x 2 ranks, cpu-1m (seq 128), {args.steps} steps; checkpoints every 2 "
        f"steps; medians of {args.repeats}:"
    )
    print(f"{'checkpoints':>12} {'wall s':>8} {'train s':>8}   runs (wall s)")
    for mode, rows in results.items():
        print(
            f"{mode:>12} {summarize(r['wall_time_s'] for r in rows).median:>8.2f} "
            f"{summarize(r['train_time_s'] for r in rows).median:>8.2f}   "
            + ", ".join(f"{r['wall_time_s']:.2f}" for r in rows)
        )
    write_result(
        "fsdp_checkpoint_async",
        {
            "config": {
                "steps": args.steps,
                "repeats": args.repeats,
                "checkpoint_every": 2,
                "workers": 2,
                "ranks_per_worker": 2,
                "size": "cpu-1m",
            },
            "results": results,
        },
        out=args.out,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
