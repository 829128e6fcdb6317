"""Overhead of the StreamingDiLoCo wrapper over a bare AdamW loop, and the memory it adds.

M = 1 (the in-process communicator with one replica), a ~1M-parameter transformer,
synthetic token batches. Configurations are interleaved round by round so that
machine noise hits them alike; the overhead is the ratio of median step times
measured in this one run.

    .venv/bin/python benchmarks/overhead.py            # ~3 minutes on 2 cores
    .venv/bin/python benchmarks/overhead.py --quick    # smoke run

Prints a table and writes benchmarks/results/overhead.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from diloco.algorithm.codecs import get_codec
from diloco.algorithm.streaming import StreamingDiLoCo
from diloco.comm.local import LocalGroup
from diloco.models import Transformer, make_config

CONFIGS = [
    ("bare AdamW loop", None),
    ("P=1 tau=0 fp32 (DiLoCo)", dict(num_fragments=1, overlap_steps=0, codec="fp32")),
    ("P=1 tau=0 fp4_e3m0", dict(num_fragments=1, overlap_steps=0, codec="fp4_e3m0")),
    ("P=4 tau=0 fp32", dict(num_fragments=4, overlap_steps=0, codec="fp32")),
    ("P=4 tau=1 fp32", dict(num_fragments=4, overlap_steps=1, codec="fp32")),
    ("P=4 tau=1 fp4_e3m0", dict(num_fragments=4, overlap_steps=1, codec="fp4_e3m0")),
]


def make_setup(kw, args):
    torch.manual_seed(0)
    model = Transformer(make_config(args.size, vocab_size=args.vocab, seq_len=args.seq))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    algo = None
    if kw is not None:
        algo = StreamingDiLoCo(model, opt, comm=LocalGroup(1).communicators[0], sync_every=args.H, **kw)
    return model, opt, algo


def wrapper_bytes(algo: StreamingDiLoCo) -> dict[str, int]:
    """Bytes the wrapper holds: global copies, outer optimizer state, largest in-flight payload."""
    glob = sum(g.numel() * g.element_size() for g in algo.global_flat)
    outer = sum(
        t.numel() * t.element_size()
        for o in algo.outer_optimizers for st in o.state.values() for t in st.values() if torch.is_tensor(t)
    )
    codec = get_codec(algo.codec)
    inflight = max(codec.num_bytes(n) for n in algo.fragment_sizes())
    return {"global_copy": glob, "outer_state": outer, "in_flight_peak": inflight}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="cpu-1m")
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--H", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=6, help="interleaved rounds")
    ap.add_argument("--steps", type=int, default=60, help="inner steps per config per round (a multiple of H)")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "overhead.json")
    args = ap.parse_args()
    if args.quick:
        args.rounds, args.steps = 2, args.H
    torch.set_num_threads(2)
    setups = [(name, *make_setup(kw, args)) for name, kw in CONFIGS]
    g = torch.Generator().manual_seed(0)
    data = [torch.randint(0, args.vocab, (args.batch, args.seq + 1), generator=g) for _ in range(8)]
    times: dict[str, list[float]] = {name: [] for name, *_ in setups}
    for r in range(args.rounds):
        for name, model, opt, algo in setups:
            t0 = time.perf_counter()
            for i in range(args.steps):
                batch = data[i % len(data)]
                _, loss = model(batch[:, :-1], batch[:, 1:])
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                if algo is not None:
                    algo.step()
            dt = (time.perf_counter() - t0) / args.steps
            if r > 0:  # round 0 warms up allocators and caches
                times[name].append(dt)
        print(f"round {r + 1}/{args.rounds} done", flush=True)
    base = statistics.median(times[setups[0][0]])
    n_params = sum(p.numel() for p in setups[0][1].parameters())
    rows = []
    for name, model, opt, algo in setups:
        med = statistics.median(times[name])
        row = {"config": name, "median_step_s": med, "ratio_vs_bare": med / base,
               "overhead_pct": 100 * (med / base - 1)}
        if algo is not None:
            mem = wrapper_bytes(algo)
            row.update(mem)
            row["added_bytes"] = sum(mem.values())
            frag = max(algo.fragment_sizes())
            row["analytic_bytes"] = 2 * 4 * n_params + get_codec(algo.codec).num_bytes(frag)
        rows.append(row)
    print(f"\nmodel {args.size}: {n_params:,} params; batch {args.batch}x{args.seq}; H={args.H}; "
          f"{args.rounds - 1} timed rounds x {args.steps} steps; torch threads 2")
    print(f"{'config':<26} {'step ms':>8} {'vs bare':>8} {'added MB':>9} {'analytic MB':>12}")
    for row in rows:
        added = row.get("added_bytes")
        print(f"{row['config']:<26} {1e3 * row['median_step_s']:8.2f} {row['overhead_pct']:+7.2f}% "
              f"{'' if added is None else f'{added / 1e6:9.2f}'} "
              f"{'' if added is None else format(row['analytic_bytes'] / 1e6, '12.2f')}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"args": vars(args) | {"out": str(args.out)}, "num_params": n_params,
                                    "rows": rows}, indent=2) + "\n")
    print(f"\nwritten: {args.out}")


if __name__ == "__main__":
    main()
