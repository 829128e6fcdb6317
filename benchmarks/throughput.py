"""Does the trainer waste the machine, and how much do its speed options give?

``--part overhead`` (the default), at the demo size (cpu-1m, vocab 4096, global batch 16 x 128):
  * bare loop: one model, AdamW, the same batches, nothing else;
  * trainer, DiLoCo M=1 (the wrapper, logging, data pipeline): goal >= 0.95x the bare loop's tokens/s;
  * trainer, DP M=2 and DiLoCo M=2 (two replica threads of batch 8): goal DiLoCo <= 1.05x DP's time.

``--part levers``: the trainer (DiLoCo M=1, the demo's batch) with ``bf16`` autocast and/or
``compile`` (torch.compile) against fp32 eager, at each ``--sizes`` (default cpu-1m and cpu-10m).
Tokens/s of the steady state (the first ``--skip`` steps, which hold the compilation, are left
out); the final eval loss of each run beside it, round r using seed r, so the fp32 runs' spread over
seeds is the noise the other losses are compared with. Goals: bf16 + compile >= 1.4x fp32 at
cpu-1m and >= 1.8x at cpu-10m, with tcmalloc preloaded in both.

Configurations alternate over rounds; ratios come from medians of one run.

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4 .venv/bin/python benchmarks/throughput.py
    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4 .venv/bin/python benchmarks/throughput.py \
        --part levers --rounds 2

Prints a table and writes benchmarks/results/throughput.json (``--part levers``: throughput_levers.json).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import torch

from diloco.bench import summarize, write_result
from diloco.data import ShardSampler, prepare_tokens
from diloco.files import default_cache_dir, read_jsonl
from diloco.models.factory import build_model
from diloco.train.config import TrainConfig, load_preset
from diloco.train.speed import tcmalloc_loaded
from diloco.train.trainer import Trainer

LEVERS = {
    "fp32": {},
    "bf16": {"bf16": True},
    "compile": {"compile": True},
    "bf16+compile": {"bf16": True, "compile": True},
}


def bare_loop(cfg: TrainConfig, data, steps: int) -> float:
    torch.set_num_threads(os.cpu_count() or 1)
    model = build_model(
        cfg.model,
        size=cfg.size,
        vocab_size=data.tokenizer.vocab_size,
        seq_len=cfg.seq_len,
        seed=cfg.seed,
        z_loss=cfg.z_loss,
    )
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.inner_lr, betas=(cfg.beta1, cfg.beta2))
    sampler = ShardSampler(
        data.train, rank=0, world_size=1, batch_size=cfg.global_batch, seq_len=cfg.seq_len, seed=cfg.seed
    )
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


def lever_run(cfg: TrainConfig, cache: Path, skip: int) -> tuple[float, float]:
    """(steady-state tokens/s after the first ``skip`` steps, final eval loss) of one trainer run."""
    with tempfile.TemporaryDirectory() as d:
        result = Trainer(cfg, Path(d), cache_dir=cache, progress=False).run()
        rows = [r for r in read_jsonl(Path(d) / "metrics.jsonl") if "loss" in r and r["step"] > skip]
    return sum(r["tokens"] for r in rows) / sum(r["step_time_s"] for r in rows), result.final_eval_loss


def levers(args: argparse.Namespace) -> None:
    preset = load_preset("demo")
    threads = os.cpu_count() or 1
    out: dict = {
        "sizes": {},
        "rounds": args.rounds,
        "skip": args.skip,
        "threads": threads,
        "ld_preload": os.environ.get("LD_PRELOAD", ""),
        "tcmalloc_loaded": tcmalloc_loaded(),
        "torch": torch.__version__,
    }
    for size, steps in zip(args.sizes, args.lever_steps):
        base = TrainConfig.from_dict(
            {
                **preset["base"],
                "size": size,
                "replicas": 1,
                "steps": steps,
                "eval_every": steps,
                "eval_batches": 8,
                "warmup_steps": min(30, steps // 4),
                "checkpoint_every": 0,
                "threads": threads,
            }
        )
        prepare_tokens(base.sources, base.vocab_size, args.cache_dir, val_fraction=base.val_fraction)
        tps: dict[str, list[float]] = {k: [] for k in LEVERS}
        loss: dict[str, list[float]] = {k: [] for k in LEVERS}
        for r in range(args.rounds):
            for name, kw in LEVERS.items():
                t, final = lever_run(base.with_overrides({**kw, "seed": r}), args.cache_dir, args.skip)
                tps[name].append(t)
                loss[name].append(final)
            print(
                f"{size} round {r + 1}/{args.rounds} (seed {r}): "
                + ", ".join(f"{k}: {tps[k][-1]:.0f} tok/s, loss {loss[k][-1]:.4f}" for k in LEVERS),
                flush=True,
            )
        fp32 = summarize(tps["fp32"]).median
        rows = []
        for name in LEVERS:
            # the loss against fp32's of the same seed: the lever's effect; fp32's spread over seeds: the noise
            dl = [a - b for a, b in zip(loss[name], loss["fp32"])]
            rows.append(
                {
                    "config": name,
                    "tokens_per_s": summarize(tps[name]).median,
                    "tokens_per_s_rounds": tps[name],
                    "speedup": summarize(tps[name]).median / fp32,
                    "final_eval_loss": loss[name],
                    "loss_minus_fp32_same_seed": dl,
                }
            )
        noise = max(loss["fp32"]) - min(loss["fp32"]) if args.rounds > 1 else None
        out["sizes"][size] = {
            "steps": steps,
            "tokens_per_step": base.tokens_per_step,
            "rows": rows,
            "fp32_loss_spread_over_seeds": noise,
        }
        print(
            f"\n{size}: {steps} steps of {base.tokens_per_step} tokens, {threads} threads, "
            f"medians of {args.rounds} rounds"
        )
        print(
            f"{'config':<14} {'tokens/s':>9} {'speedup':>8} {'final eval loss (seed 0..)':>28} {'vs fp32, same seed':>20}"
        )
        for row in rows:
            print(
                f"{row['config']:<14} {row['tokens_per_s']:9.0f} {row['speedup']:8.3f} "
                f"{' '.join(f'{v:.4f}' for v in row['final_eval_loss']):>28} "
                f"{' '.join(f'{v:+.4f}' for v in row['loss_minus_fp32_same_seed']):>20}"
            )
        if noise is not None:
            print(f"noise: fp32's final eval loss spread over seeds {noise:.4f}")
    print(f"LD_PRELOAD={out['ld_preload']!r}; tcmalloc loaded: {out['tcmalloc_loaded']}")
    path = args.out.with_name("throughput_levers.json") if args.out.name == "throughput.json" else args.out
    write_result("throughput_levers", out, out=path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", choices=("overhead", "levers"), default="overhead")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sizes", nargs="+", default=["cpu-1m", "cpu-10m"], help="--part levers: model sizes")
    ap.add_argument(
        "--lever-steps", type=int, nargs="+", default=[150, 40], help="--part levers: steps per run, one per size"
    )
    ap.add_argument("--skip", type=int, default=5, help="--part levers: first steps left out of tokens/s")
    ap.add_argument("--cache-dir", type=Path, default=default_cache_dir())
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "throughput.json")
    args = ap.parse_args()
    if args.part == "levers":
        if len(args.lever_steps) != len(args.sizes):
            ap.error(f"--lever-steps {args.lever_steps}: give one step count per size {args.sizes}")
        levers(args)
        return
    preset = load_preset("demo")
    base = TrainConfig.from_dict(
        {**preset["base"], "steps": args.steps, "eval_every": 10 * args.steps, "eval_batches": 1, "warmup_steps": 5}
    )
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
    med = {k: summarize(v).median for k, v in tps.items()}
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
    write_result(
        "throughput",
        {
            "rows": rows,
            "trainer_vs_bare": ratio_m1,
            "diloco_vs_dp_time": time_ratio,
            "steps": args.steps,
            "rounds": args.rounds,
            "ld_preload": os.environ.get("LD_PRELOAD", ""),
        },
        out=args.out,
    )


if __name__ == "__main__":
    main()
