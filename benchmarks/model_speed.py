"""Training-step throughput of the CPU model sizes: fwd + bwd + AdamW, tokens per second.

For each size (default cpu-1m and cpu-10m at vocab 4096, seq 128, batch 16) and precision (fp32,
bf16 autocast) it times three variants:

* ``model``       the project's model as trained (QK-LayerNorm, z-loss 1e-4), torch's default AdamW;
* ``fused-adamw`` the same with ``AdamW(fused=True)`` (one kernel per step on CPU, not one per tensor);
* ``plain``       QK-norm off and z-loss 0: what those two features cost.

Configurations are interleaved round by round so that load from other processes hits them alike;
the table gives the median step over the timed rounds and the best one (the machine is shared:
the best is the closer estimate of an idle machine). Achieved GFLOP/s use ``flops_per_token``.

    .venv/bin/python benchmarks/model_speed.py            # ~4 minutes on 2 cores
    .venv/bin/python benchmarks/model_speed.py --quick    # smoke run

Prints a table and writes benchmarks/results/model_speed.json.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import time
from pathlib import Path

import torch

from diloco.bench import summarize, write_result
from diloco.models import Transformer, count_params, flops_per_token, make_config

VARIANTS = {
    "model": (dict(), dict()),
    "fused-adamw": (dict(), dict(fused=True)),
    "plain": (dict(qk_norm=False, z_loss=0.0), dict()),
}


class Setup:
    def __init__(self, size: str, precision: str, variant: str, args: argparse.Namespace) -> None:
        model_kw, opt_kw = VARIANTS[variant]
        self.size, self.precision, self.variant = size, precision, variant
        self.cfg = make_config(size, vocab_size=args.vocab, seq_len=args.seq, **model_kw)
        torch.manual_seed(0)
        self.model = Transformer(self.cfg)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-3, **opt_kw)
        g = torch.Generator().manual_seed(0)
        self.data = torch.randint(0, args.vocab, (args.batch, args.seq + 1), generator=g)
        self.times: list[float] = []

    def step(self) -> None:
        x, y = self.data[:, :-1], self.data[:, 1:]
        autocast = torch.autocast("cpu", dtype=torch.bfloat16) if self.precision == "bf16" else contextlib.nullcontext()
        with autocast:
            _, loss = self.model(x, y)
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", nargs="+", default=["cpu-1m", "cpu-10m"])
    ap.add_argument("--precisions", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"])
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=6, help="interleaved rounds; round 0 is warm-up")
    ap.add_argument("--steps", type=int, default=3, help="timed steps per configuration per round")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "model_speed.json")
    args = ap.parse_args()
    if args.quick:
        args.rounds, args.steps = 2, 1
    torch.set_num_threads(args.threads)
    setups = [Setup(s, p, v, args) for s in args.sizes for p in args.precisions for v in args.variants]
    load_before = os.getloadavg()
    for r in range(args.rounds):
        for su in setups:
            su.step()  # one untimed step: re-warm caches after the other configurations ran
            t0 = time.perf_counter()
            for _ in range(args.steps):
                su.step()
            if r > 0:
                su.times.append((time.perf_counter() - t0) / args.steps)
        print(f"round {r + 1}/{args.rounds} done (load average {os.getloadavg()[0]:.1f})", flush=True)
    tokens = args.batch * args.seq
    rows = []
    for su in setups:
        timing = summarize(su.times)
        med, best = timing.median, timing.min
        fpt = flops_per_token(su.cfg)
        rows.append(
            {
                "size": su.size,
                "precision": su.precision,
                "variant": su.variant,
                "non_embedding_params": count_params(su.cfg, embeddings=False),
                "params": count_params(su.cfg),
                "median_step_s": med,
                "best_step_s": best,
                "tokens_per_s_median": tokens / med,
                "tokens_per_s_best": tokens / best,
                "gflops_per_s_best": fpt * tokens / best / 1e9,
                "step_times_s": su.times,
            }
        )
    print(
        f"\nbatch {args.batch} x seq {args.seq}, vocab {args.vocab}; torch {torch.__version__}, "
        f"{args.threads} threads; {args.rounds - 1} timed rounds x {args.steps} steps; "
        f"load average {load_before[0]:.1f} -> {os.getloadavg()[0]:.1f}"
    )
    print(f"{'size':<9} {'prec':<5} {'variant':<12} {'params':>8} {'tok/s med':>10} {'tok/s best':>11} {'GFLOP/s':>8}")
    for row in rows:
        print(
            f"{row['size']:<9} {row['precision']:<5} {row['variant']:<12} {row['params'] / 1e6:7.2f}M "
            f"{row['tokens_per_s_median']:10,.0f} {row['tokens_per_s_best']:11,.0f} "
            f"{row['gflops_per_s_best']:8.1f}"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    meta = {
        "torch": torch.__version__,
        "machine": platform.machine(),
        "processor": platform.processor(),
        "cpu_count": os.cpu_count(),
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
    }
    write_result("model_speed", {"args": vars(args) | {"out": str(args.out)}, "meta": meta, "rows": rows}, out=args.out)


if __name__ == "__main__":
    main()
