"""What the default checkpoint cadence costs on the demo: goal <= 2 % of training time.

The demo preset (cpu-1m, vocab 4096, M = 2, H = 30) for data-parallel, DiLoCo and
Streaming DiLoCo, with a REDUCED budget (``--steps``, default 60 of the demo's 480)
and a checkpoint every ``--every`` steps (default 20), so that one short run
measures several checkpoints. Per checkpoint: the wall time replica 0 spends in
it (every replica writing its file with fsync, the barrier, the record with each
file's SHA-256, pruning to the last K), and the bytes written. The cost at the
default cadence (``checkpoint_every = -1``: every 100 steps for dp, 120 = 4 H
for DiLoCo / streaming) is then

    mean checkpoint time / (default interval x median step time).

Runs under the heavy-job lock; the machine may be shared, so step and checkpoint
times are medians / means of one run, not a controlled measurement.

    flock /tmp/diloco-heavy.lock .venv/bin/python benchmarks/checkpoint_cost.py

Prints a table and writes benchmarks/results/checkpoint_cost.json.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from diloco.bench import summarize, write_result
from diloco.files import default_cache_dir, read_jsonl
from diloco.train import checkpoint as ckpt
from diloco.train.config import TrainConfig, load_preset
from diloco.train.trainer import Trainer


class TimedTrainer(Trainer):
    """The trainer, timing replica 0's checkpoints."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.checkpoint_s: list[float] = []

    def _checkpoint(self, rep, run, step) -> None:
        t0 = time.perf_counter()
        super()._checkpoint(rep, run, step)
        if rep.evaluates:
            self.checkpoint_s.append(time.perf_counter() - t0)


def measure(cfg: TrainConfig, cache: Path) -> dict:
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "run"
        trainer = TimedTrainer(cfg, out, cache_dir=cache, progress=False)
        result = trainer.run()
        step_s = summarize(
            r["step_time_s"] for r in read_jsonl(out / "metrics.jsonl") if "step_time_s" in r and r["step"] > 5
        ).median
        step_dir = ckpt.checkpoint_dir(out) / f"step-{cfg.total_steps:08d}"
        ckpt_bytes = sum(p.stat().st_size for p in step_dir.glob("replica-*.pt"))
    default = cfg.with_overrides({"checkpoint_every": -1}).checkpoint_interval
    mean_ckpt = statistics.mean(trainer.checkpoint_s)
    return {
        "method": cfg.method,
        "steps": cfg.total_steps,
        "checkpoints": len(trainer.checkpoint_s),
        "checkpoint_s_mean": mean_ckpt,
        "checkpoint_s_max": max(trainer.checkpoint_s),
        "checkpoint_bytes_all_replicas": ckpt_bytes,
        "median_step_s": step_s,
        "train_time_s": result.train_time_s,
        "threads": torch.get_num_threads(),
        "measured_share_pct": 100 * sum(trainer.checkpoint_s) / result.train_time_s,
        "default_interval_steps": default,
        "default_cadence_cost_pct": 100 * mean_ckpt / (default * step_s),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=60, help="training steps per method (the demo has 480)")
    ap.add_argument("--every", type=int, default=20, help="checkpoint every N steps in the measurement")
    ap.add_argument("--cache-dir", type=Path, default=default_cache_dir())
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "checkpoint_cost.json")
    args = ap.parse_args()
    preset = load_preset("demo")
    rows = []
    for name in ("dp", "diloco", "streaming"):
        cfg = TrainConfig.from_dict(
            {
                **preset["base"],
                **preset["methods"][name],
                "steps": args.steps,
                "checkpoint_every": args.every,
                "eval_every": 10 * args.steps,
                "eval_batches": 1,
            }
        )
        rows.append({"name": name, **measure(cfg, args.cache_dir)})
        print(f"{name}: done", flush=True)
    print(f"\ndemo preset, {args.steps} steps (reduced from 480), a checkpoint every {args.every} steps, M = 2\n")
    head = f"{'method':<10} {'ckpt MB':>8} {'ckpt s':>7} {'step s':>7} {'default every':>13} {'cost':>7}"
    print(head)
    print("-" * len(head))
    for r in rows:
        print(
            f"{r['name']:<10} {r['checkpoint_bytes_all_replicas'] / 1e6:8.1f} {r['checkpoint_s_mean']:7.3f} "
            f"{r['median_step_s']:7.3f} {r['default_interval_steps']:13d} {r['default_cadence_cost_pct']:6.2f}%"
        )
    worst = max(r["default_cadence_cost_pct"] for r in rows)
    print(f"\nworst cost of the default cadence: {worst:.2f}% of training time (goal <= 2%)")
    write_result(
        "checkpoint_cost",
        {"steps": args.steps, "every": args.every, "rows": rows, "worst_cost_pct": worst},
        out=args.out,
    )


if __name__ == "__main__":
    main()
