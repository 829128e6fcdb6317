"""Tokens per second of a Hugging Face Llama under StreamingDiLoCo against a bare loop of the same model.

The goal: a ~100M-parameter HF Llama in bf16 under ``StreamingDiLoCo`` (H = 30, P = 4,
tau = 1, FP4 outer gradients) at >= 0.95x the bare loop's tokens/s. One replica (M = 1, the
in-process communicator), so what is measured is the wrapper's own cost (outer gradients, FP4
encode / decode, outer Nesterov step, merge), not a network. The two variants alternate round by
round (rounds of H steps, so every round holds the same syncs) so that load from other processes
hits both alike; the table gives the median and the best round.

    .venv/bin/python benchmarks/hf_throughput.py --preset tiny --rounds 4           # CPU smoke run (seconds)
    .venv/bin/python benchmarks/hf_throughput.py --preset 100m --device cuda --bf16 # the goal's measurement

Prints a table and writes benchmarks/results/hf_throughput-<preset>-<device>.json.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from diloco.bench import print_table, write_result
from diloco.bench.hf_throughput import PRESETS, run


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    p.add_argument("--device", default="cpu")
    p.add_argument("--bf16", action="store_true", help="bf16 autocast")
    p.add_argument("--vocab", type=int, default=None, help="default: 4096 (tiny), 32768 (100m)")
    p.add_argument("--seq", type=int, default=None, help="default: 128 (tiny), 1024 (100m)")
    p.add_argument("--batch", type=int, default=None, help="default: 8 (tiny), 16 (100m)")
    p.add_argument("--H", type=int, default=30)
    p.add_argument("--P", type=int, default=4)
    p.add_argument("--tau", type=int, default=1)
    p.add_argument("--codec", default="fp4_e3m0")
    p.add_argument("--rounds", type=int, default=6, help="timed rounds of H steps per variant")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    big = args.preset == "100m"
    args.vocab = args.vocab or (32768 if big else 4096)
    args.seq = args.seq or (1024 if big else 128)
    args.batch = args.batch or (16 if big else 8)
    out = run(args)
    print(
        f"{out['preset']} HF Llama, {out['params'] / 1e6:.1f}M params, {out['device']} ({out['device_name']}), "
        f"bf16={out['bf16']}, batch {args.batch} x seq {args.seq}, H={args.H} P={args.P} tau={args.tau} {args.codec}"
    )
    rows = [{"variant": name, **row} for name, row in out["results"].items()]
    print_table(
        rows, [("variant", "variant", ""), ("median tok/s", "median_tok_s", ".0f"), ("best tok/s", "best_tok_s", ".0f")]
    )
    print(f"streaming / bare: {out['ratio_median']:.3f} (median rounds), {out['ratio_best']:.3f} (best rounds)")
    write_result(f"hf_throughput-{args.preset}-{out['device'].split(':')[0]}", out, out=args.out)


if __name__ == "__main__":
    main()
