"""Does the trainer waste the machine? Trainer tokens/s against a bare loop; M replicas against DP.

At the demo size (cpu-1m, vocab 4096, global batch 16 x 128):
  * bare loop: one model, AdamW, the same batches, nothing else;
  * trainer, DiLoCo M=1 (the wrapper, logging, data pipeline): goal >= 0.95x the bare loop's tokens/s;
  * trainer, DP M=2 and DiLoCo M=2 (two replica threads of batch 8): goal DiLoCo <= 1.05x DP's time.
Configurations alternate over rounds; ratios come from medians of one run.

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4 .venv/bin/python benchmarks/throughput.py

Prints a table and writes benchmarks/results/throughput.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

from diloco.data import ShardSampler, prepare_tokens
from diloco.files import default_cache_dir
from diloco.train.config import TrainConfig, load_preset
from diloco.train.trainer import Trainer, build_model


def bare_loop(cfg: TrainConfig, data, steps: int) -> float:
    torch.set_num_threads(os.cpu_count() or 1)
    model = build_model(cfg, data.tokenizer.vocab_size)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.inner_lr, betas=(cfg.beta1, cfg.beta2))
    sampler = ShardSampler(data.train, rank=0, world_size=1, batch_size=cfg.global_batch, seq_len=cfg.seq_len,
                           seed=cfg.seed)
    t0 = time.perf_counter()
    for _ in range(steps):
        x, y = sampler.next_batch()
        _, loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
    return steps * cfg.tokens_per_step / (time.perf_counter() - t0)


def trainer_run(cfg: TrainConfig, cache: Path) -> float:
    with tempfile.TemporaryDirectory() as d:
        result = Trainer(cfg, Path(d), cache_dir=cache, progress=False).run()
    return result.tokens / result.train_time_s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cache-dir", type=Path, default=default_cache_dir())
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "throughput.json")
    args = ap.parse_args()
    preset = load_preset("demo")
    base = TrainConfig.from_dict({**preset["base"], "steps": args.steps, "eval_every": 10 * args.steps,
                                  "eval_batches": 1, "warmup_steps": 5})
    data = prepare_tokens(base.sources, base.vocab_size, args.cache_dir, val_fraction=base.val_fraction)
    runs = {
        "bare loop (1 model, batch 16)": lambda: bare_loop(base, data, args.steps),
        "trainer DiLoCo M=1": lambda: trainer_run(base.with_overrides({"replicas": 1}), args.cache_dir),
        "trainer DP M=2": lambda: trainer_run(base.with_overrides({"method": "dp"}), args.cache_dir),
        "trainer DiLoCo M=2": lambda: trainer_run(base, args.cache_dir),
    }
    tps: dict[str, list[float]] = {k: [] for k in runs}
    for r in range(args.rounds):
        for name, fn in runs.items():
            tps[name].append(fn())
        print(f"round {r + 1}/{args.rounds}: " + ", ".join(f"{k}: {v[-1]:.0f}" for k, v in tps.items()), flush=True)
    med = {k: statistics.median(v) for k, v in tps.items()}
    bare = med["bare loop (1 model, batch 16)"]
    rows = [{"run": k, "tokens_per_s": v, "vs_bare": v / bare} for k, v in med.items()]
    ratio_m1 = med["trainer DiLoCo M=1"] / bare
    time_ratio = med["trainer DP M=2"] / med["trainer DiLoCo M=2"]  # time(DiLoCo) / time(DP)
    print(f"\n{'run':<32} {'tokens/s':>9} {'vs bare':>8}")
    for row in rows:
        print(f"{row['run']:<32} {row['tokens_per_s']:9.0f} {row['vs_bare']:8.3f}")
    print(f"\ntrainer (DiLoCo M=1) / bare loop tokens/s: {ratio_m1:.3f}  (goal >= 0.95)")
    print(f"DiLoCo M=2 time / DP M=2 time, same tokens: {time_ratio:.3f}  (goal <= 1.05)")
    print(f"LD_PRELOAD={os.environ.get('LD_PRELOAD', '')!r}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"rows": rows, "trainer_vs_bare": ratio_m1, "diloco_vs_dp_time": time_ratio,
                                    "steps": args.steps, "rounds": args.rounds,
                                    "ld_preload": os.environ.get("LD_PRELOAD", "")}, indent=2) + "\n")
    print(f"written: {args.out}")


if __name__ == "__main__":
    main()
