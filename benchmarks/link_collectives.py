"""Bare gloo collectives across M emulated slow links: how close each pattern gets to the link rate.

The M = 4 link benchmark found the reduce-scatter exchange at ~60 % of the link
rate where the ring all-gather reaches ~90 %. This times the building blocks
alone (no model, no codec), in the same topology (``benchmarks/link.py``'s
``Link``: M namespaces, each worker's veth shaped both ways, a bridge between),
each pattern moving ``--shard-mb`` per peer, medians of 3 after a barrier:

* one pairwise round: every rank sends one shard to rank+1 and receives one from rank-1;
* the same round with 3 shards in one message (one connection, 3x the bytes);
* M-1 pairwise rounds (what the communicator's gloo all-to-all does);
* ``all_to_all_single`` (gloo's own: every peer at once);
* ``all_gather_single`` of one shard (gloo's ring).

Each row's "ideal" is the bytes leaving a rank divided by the link rate.

    sudo .venv/bin/python benchmarks/link_collectives.py    # ~3 min; benchmarks/results/link_collectives.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from link import Link, addr  # noqa: E402 - the same emulated links as the link benchmark

PATTERNS = ("one_round", "one_round_3x", "pairwise_rounds", "all_to_all_single", "all_gather_ring")


def worker(rank: int, m: int, nbytes: int, port: int, out: str) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    store = dist.TCPStore(addr(0), port, world_size=m, is_master=rank == 0, timeout=timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=m, timeout=timedelta(seconds=300))
    shard, recv = torch.zeros(nbytes, dtype=torch.uint8), torch.empty(nbytes, dtype=torch.uint8)
    big, recv_big = torch.zeros(3 * nbytes, dtype=torch.uint8), torch.empty(3 * nbytes, dtype=torch.uint8)

    def exchange(k: int, a: torch.Tensor, b: torch.Tensor) -> None:
        works = [dist.isend(a, (rank + k) % m), dist.irecv(b, (rank - k) % m)]
        for w in works:
            w.wait()

    def pairwise() -> None:
        for k in range(1, m):
            exchange(k, shard, recv)

    def a2a() -> None:
        dist.all_to_all_single(torch.empty(m * nbytes, dtype=torch.uint8), torch.zeros(m * nbytes, dtype=torch.uint8))

    def ring() -> None:
        dist.all_gather_into_tensor(torch.empty(m * nbytes, dtype=torch.uint8), shard)

    fns = {"one_round": lambda: exchange(1, shard, recv), "one_round_3x": lambda: exchange(1, big, recv_big),
           "pairwise_rounds": pairwise, "all_to_all_single": a2a, "all_gather_ring": ring}
    res = {}
    for name in PATTERNS:
        fns[name]()  # warm the connections this pattern uses
        times = []
        for _ in range(3):
            dist.barrier()
            t0 = time.perf_counter()
            fns[name]()
            times.append(time.perf_counter() - t0)
        res[name] = statistics.median(times)
    Path(out).write_text(json.dumps(res))
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--mbps", type=float, default=20.0)
    ap.add_argument("--shard-mb", type=float, default=0.7625, help="bytes per peer (default: one bf16 shard "
                    "of cpu-1m at M = 4)")
    ap.add_argument("--port", type=int, default=29533)
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "link_collectives.json")
    ap.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    nbytes = int(args.shard_mb * 1e6)
    if args.worker:
        worker(int(args.worker[0]), args.workers, nbytes, args.port, args.worker[1])
        return 0
    if os.geteuid() != 0:
        raise SystemExit("needs root (network namespaces); run with sudo")
    m = args.workers
    with tempfile.TemporaryDirectory() as tmp, Link(0.0, m) as link:
        link.shape(args.mbps)
        procs = []
        for r in range(m):
            env = dict(os.environ, GLOO_SOCKET_IFNAME=link.dev[r])
            procs.append(subprocess.Popen(["ip", "netns", "exec", link.ns[r], sys.executable, __file__,
                                           "--workers", str(m), "--shard-mb", str(args.shard_mb),
                                           "--port", str(args.port), "--worker", str(r), f"{tmp}/r{r}.json"],
                                          env=env))
        for p in procs:
            if p.wait(timeout=600) != 0:
                raise SystemExit(f"a worker failed (exit code {p.returncode})")
        per_rank = [json.loads(Path(f"{tmp}/r{r}.json").read_text()) for r in range(m)]
    link_s = nbytes * 8 / (args.mbps * 1e6)
    ideal = {"one_round": link_s, "one_round_3x": 3 * link_s, "pairwise_rounds": (m - 1) * link_s,
             "all_to_all_single": (m - 1) * link_s, "all_gather_ring": (m - 1) * link_s}
    rows = [{"pattern": p, "seconds_max_rank": max(r[p] for r in per_rank), "ideal_s": ideal[p],
             "fraction_of_link_rate": ideal[p] / max(r[p] for r in per_rank)} for p in PATTERNS]
    print(f"\n{m} workers, {args.mbps:g} Mbit/s each way per worker, {nbytes / 1e6:.3f} MB per peer message")
    print(f"{'pattern':<20} {'seconds':>8} {'ideal':>7} {'of link rate':>13}")
    for r in rows:
        print(f"{r['pattern']:<20} {r['seconds_max_rank']:>8.3f} {r['ideal_s']:>7.3f} {r['fraction_of_link_rate']:>12.0%}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"config": {"workers": m, "mbps": args.mbps, "shard_bytes": nbytes},
                                    "rows": rows, "per_rank": per_rank}, indent=2, allow_nan=False) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
