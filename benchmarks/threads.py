"""Torch threads per replica with and without a competing process: the old default against the new.

The demo model (cpu-1m, vocab 4096, global batch 16 x 128), DiLoCo with M = 1 and
M = 2 replica threads, each for a few steps (``--steps``, default 12: a short
run, not the demo's 480), median step time after the first 2 steps. Every setting
runs twice: alone, and beside one competing process (a pure-Python busy loop,
i.e. one core taken). Settings: the old default (cores // M threads per
replica), the new default (``threads = 0``: cores not busy // M, see
``diloco.train.threads``) and 1 thread.

Runs under the heavy-job lock, but the machine may be shared with other work,
so the "alone" rows are not an idle machine: ``busy`` is what the new default
measured just before the run.

    flock /tmp/diloco-heavy.lock .venv/bin/python benchmarks/threads.py

Prints a table and writes benchmarks/results/threads.json.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from diloco.bench import summarize, write_result
from diloco.files import default_cache_dir, read_jsonl
from diloco.train.config import TrainConfig, load_preset
from diloco.train.threads import busy_cores, usable_cores
from diloco.train.trainer import Trainer


def step_time(cfg: TrainConfig, cache: Path) -> tuple[float, int]:
    """Median step time (s) after the first 2 steps, and the threads per replica the run used."""
    import torch

    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "run"
        Trainer(cfg, out, cache_dir=cache, progress=False).run()
        times = [r["step_time_s"] for r in read_jsonl(out / "metrics.jsonl") if "step_time_s" in r and r["step"] > 2]
    return summarize(times).median, torch.get_num_threads()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--cache-dir", type=Path, default=default_cache_dir())
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "threads.json")
    args = ap.parse_args()
    cores = len(usable_cores())
    preset = load_preset("demo")
    base = {
        **preset["base"],
        "steps": args.steps,
        "eval_every": 10 * args.steps,
        "eval_batches": 1,
        "checkpoint_every": 0,
    }
    rows = []
    for competitor in (False, True):
        hog = None
        if competitor:
            hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
            time.sleep(1.0)
        try:
            for m in (1, 2):
                settings = {"old default (cores // M)": max(1, cores // m), "new default (auto)": 0, "1 thread": 1}
                for label, threads in settings.items():
                    cfg = TrainConfig.from_dict({**base, "replicas": m, "threads": threads})
                    busy = busy_cores()
                    t, used = step_time(cfg, args.cache_dir)
                    rows.append(
                        {
                            "replicas": m,
                            "competitor": competitor,
                            "setting": label,
                            "threads": used,
                            "busy_before": busy,
                            "median_step_s": t,
                        }
                    )
                    print(
                        f"M={m} competitor={competitor} {label}: {used} threads, {t:.3f} s/step (busy {busy:.2f})",
                        flush=True,
                    )
        finally:
            if hog is not None:
                hog.kill()
                hog.wait()
    print(f"\ndemo model, DiLoCo, {args.steps} steps per run (median step time after step 2), {cores} cores\n")
    head = f"{'M':>2} {'competing process':>18} {'setting':<26} {'threads':>7} {'s/step':>7}"
    print(head)
    print("-" * len(head))
    for r in rows:
        print(
            f"{r['replicas']:>2} {'one busy loop' if r['competitor'] else 'none':>18} {r['setting']:<26} "
            f"{r['threads']:>7} {r['median_step_s']:7.3f}"
        )
    write_result("threads", {"steps": args.steps, "cores": cores, "rows": rows}, out=args.out)


if __name__ == "__main__":
    main()
