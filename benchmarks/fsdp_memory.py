"""Memory per rank of DiLoCo's global copy and outer-optimizer state with FSDP inside a worker.

M = 2 workers of R ranks on gloo (``run_processes``, 2R processes). R = 1 is
today's replicated worker (plain model); R >= 2 ``fully_shard``s each worker's
model (FSDP2: every block, then the root) over its R ranks, and StreamingDiLoCo
works on each rank's shard, exchanging it with the same-index rank of the other
worker (``Layout.shard_communicator``). After two syncs (H = 1, P = 3, so every
fragment's outer optimizer has its momentum), each rank reports the bytes its
tensors really hold (storage sizes): the global copy, the outer optimizers' state
and, for comparison, its parameters.

    .venv/bin/python benchmarks/fsdp_memory.py            # ~1 minute on 2 cores

Prints a table and writes benchmarks/results/fsdp_memory.json.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from diloco.bench import write_result


def rank_fn(comm, cfg: dict) -> dict:
    import torch.distributed as dist

    from diloco.algorithm.base import local_shard
    from diloco.algorithm.streaming import StreamingDiLoCo
    from diloco.comm.mesh import build_layout
    from diloco.models import Transformer, make_config

    R = cfg["ranks_per_worker"]
    layout = build_layout(cfg["workers"], R)
    torch.manual_seed(layout.worker)
    model = Transformer(make_config(cfg["size"], vocab_size=cfg["vocab"], seq_len=cfg["seq"]))
    if R > 1:
        from torch.distributed.fsdp import fully_shard

        for block in model.blocks:
            fully_shard(block, mesh=layout.device_mesh["local"])
        fully_shard(model, mesh=layout.device_mesh["local"])
        xcomm = layout.shard_communicator(timeout_s=120)
    else:
        xcomm = layout.communicator(timeout_s=120)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    algo = StreamingDiLoCo(model, comm=xcomm, sync_every=cfg["P"], num_fragments=cfg["P"], codec="fp32")
    gen = torch.Generator().manual_seed(dist.get_rank())
    for _ in range(2 * cfg["P"]):
        x = torch.randint(0, cfg["vocab"], (2, cfg["seq"]), generator=gen)
        model(x, x.roll(-1, dims=1))[1].backward()
        opt.step()
        opt.zero_grad()
        algo.step()
    algo.flush()
    glob = sum(g.untyped_storage().nbytes() for g in algo.global_flat)
    outer = sum(
        v.untyped_storage().nbytes()
        for o in algo.outer_optimizers
        for st in o.state.values()
        for v in st.values()
        if isinstance(v, torch.Tensor) and v.dim() > 0
    )
    params = sum(local_shard(p.detach()).numel() * p.element_size() for p in model.parameters())
    return {
        "rank": dist.get_rank(),
        "global_bytes": glob,
        "outer_state_bytes": outer,
        "param_bytes": params,
        "exchanged_bytes_sent": xcomm.stats.bytes_sent,
    }


def main(argv: list[str] | None = None) -> int:
    from diloco.distributed import run_processes

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", default="1,2,4", help="R values (ranks per worker)")
    ap.add_argument("--size", default="cpu-1m")
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--seq", type=int, default=32)
    ap.add_argument("--fragments", type=int, default=3)
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "fsdp_memory.json")
    args = ap.parse_args(argv)
    rows = []
    for R in (int(r) for r in args.ranks.split(",")):
        cfg = {
            "workers": 2,
            "ranks_per_worker": R,
            "size": args.size,
            "vocab": args.vocab,
            "seq": args.seq,
            "P": args.fragments,
        }
        res = run_processes(rank_fn, 2 * R, args=(cfg,), timeout_s=600, comm_timeout_s=120)
        worker0 = res[:R]
        rows.append(
            {
                "R": R,
                "per_rank": worker0,
                "max_global_bytes": max(r["global_bytes"] for r in worker0),
                "max_outer_state_bytes": max(r["outer_state_bytes"] for r in worker0),
                "sum_global_bytes": sum(r["global_bytes"] for r in worker0),
                "sum_outer_state_bytes": sum(r["outer_state_bytes"] for r in worker0),
                "max_param_bytes": max(r["param_bytes"] for r in worker0),
            }
        )
    base = rows[0]
    print(
        f"\nmodel {args.size} (vocab {args.vocab}), 2 workers x R ranks, P = {args.fragments}, fp32; per rank "
        f"(largest of the worker's R ranks):"
    )
    print(
        f"{'R':>2} {'global copy MB':>15} {'outer state MB':>15} {'sum of both':>12} {'x of R=1':>9} "
        f"{'params MB':>10} | worker total = R=1's"
    )
    for r in rows:
        both = r["max_global_bytes"] + r["max_outer_state_bytes"]
        ref = base["max_global_bytes"] + base["max_outer_state_bytes"]
        same = (r["sum_global_bytes"], r["sum_outer_state_bytes"]) == (
            base["sum_global_bytes"],
            base["sum_outer_state_bytes"],
        )
        print(
            f"{r['R']:>2} {r['max_global_bytes'] / 1e6:>15.3f} {r['max_outer_state_bytes'] / 1e6:>15.3f} "
            f"{both / 1e6:>12.3f} {both / ref:>9.3f} {r['max_param_bytes'] / 1e6:>10.3f} | {same}"
        )
    print(
        "R = 1: today's replicated worker (no FSDP); R >= 2: fully_shard over the worker's R ranks. Bytes are "
        "the tensors' storage sizes."
    )
    write_result(
        "fsdp_memory",
        {"config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}, "rows": rows},
        out=args.out,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
