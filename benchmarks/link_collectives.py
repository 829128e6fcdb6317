"""Bare gloo collectives across M emulated slow links: how close each pattern gets to the link rate.

The M = 4 link benchmark found the reduce-scatter exchange at ~60 % of the link
rate where the ring all-gather reaches ~90 %. This times the building blocks
alone (no model, no codec), in the same topology (``benchmarks/link.py``'s
``Link``: M namespaces, each worker's veth shaped both ways, a bridge between),
each pattern moving ``--shard-mb`` per peer, medians of 3 after a barrier:

* one pairwise round: every rank sends one shard to rank+1 and receives one from rank-1;
* the same round with 3 shards in one message (one connection, 3x the bytes);
* M-1 rounds of one shard each, all to rank+1 (a new message per round, the same connection);
* one round with k = 2 (at M = 4: partners, both directions on one connection) and one with k = M-1;
* M-1 pairwise rounds, sending to rank+k and receiving from rank-k in round k (what the
  communicator's gloo all-to-all does);
* M-1 rounds of partners that send to each other (:func:`exchange_partners`);
* M-1 sends and M-1 receives posted at once (``isend``/``irecv`` to every peer, then wait for all);
* ``all_to_all_single`` (gloo's own);
* ``all_gather_single`` of one shard (gloo's ring).

Each row's "ideal" is the bytes leaving a rank divided by the link rate; "retransmits" counts the TCP
segments all namespaces retransmitted per timed run (/proc/net/snmp). ``--ss S`` samples ``ss -tinm``
in every namespace each S seconds during the timed runs (cwnd, rtt, the peer's window, socket buffers,
time limited by the receive window or the send buffer: :class:`link.SsSampler`); ``--shaper htb``
shapes with one HTB class per peer (``--ack-priority``: small packets first, in a class of their own);
``--recv-first`` posts the receives before the sends.

What it found (benchmarks/results/link_collectives*.json, 4 workers, 20 Mbit/s). With sends posted
first, as gloo users usually do, every pattern that talks to ONE peer reaches 85-99 % of the link
rate and every multi-peer one 45-70 %. The cause is gloo's rendezvous, not the link: a gloo send
writes its payload only after the receiver's "ready to receive" notice has arrived, and that notice
travels on the one TCP connection of the pair, behind whatever this rank has already written to it.
When two partners each post isend then irecv (round k = 2 at M = 4, partner rounds, all sends at
once), one side's notice queues behind its own payload, so the two directions run one after the
other: ``ss`` every 50 ms shows rank 0's send queue draining at the link rate while rank 2's is empty,
then the reverse (round k = 2: 0.29 s on two ranks, 0.55 s on the other two). Posting the receives
first (``--recv-first``; the communicator's pairwise all-to-all does) sends every notice before any
payload: pairwise rounds 62 -> 96 %, partner rounds 45 -> 95 %, all sends at once 91 %, round k = 2
55 -> 100 % (per-peer HTB). gloo's own ``all_to_all_single`` (its order is not ours) stays at 60-66 %.
Not the cause: TCP windows (``ss``: 0-2 % of the busy time limited by the receive window or the send
buffer; send buffers 0.9-1.6 MB and cwnd 170-330 kB against a BDP of ~150 kB at 20 Mbit/s and ~60 ms
of queueing RTT), ACK queueing (``--ack-priority``: no change), the queue length, offloads, loss alone.
The single tbf FIFO per link end adds an artefact of its own: drops and retransmissions (15-430 per
end per run), which one HTB class per peer removes (0 retransmits; one-peer patterns 95-99 %); with
receives first but tbf the multi-peer patterns reach only 80-82 %.

    sudo .venv/bin/python benchmarks/link_collectives.py    # ~1 min; benchmarks/results/link_collectives.json
    sudo .venv/bin/python benchmarks/link_collectives.py --shaper htb --recv-first --ss 0.1   # the fixed rows
    sudo .venv/bin/python benchmarks/link_collectives.py --congestion reno --out ...   # the variants above
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
from datetime import timedelta
from pathlib import Path

from diloco.bench import time_it, write_result
from diloco.bench.link_emulation import SHAPERS, Link, SsSampler, addr

PATTERNS = (
    "one_round",
    "one_round_3x",
    "same_peer_rounds",
    "round_k2",
    "round_back",
    "pairwise_rounds",
    "partner_rounds",
    "concurrent_p2p",
    "all_to_all_single",
    "all_gather_ring",
)


def exchange_partners(num_ranks: int) -> list[list[int]]:
    """A round-robin schedule of pairwise exchanges: ``rounds[k][r]`` is rank ``r``'s partner in round ``k``
    (``r`` itself: idle that round). Every pair meets once; M - 1 rounds for even M, M for odd (the circle
    method: the last rank stays put while the others rotate; with odd M a phantom rank marks the idle one).
    Tried as a fix for the slow all-to-all (partners send to each other, so a round ends for both at about
    the same time): with sends posted first it ran no faster than the one-directional rounds, with
    receives first as fast (see the module docstring)."""
    if num_ranks < 1:
        raise ValueError(f"num_ranks must be >= 1, got {num_ranks}")
    if num_ranks == 1:
        return []
    n = num_ranks + (num_ranks % 2)  # even, with a phantom rank when M is odd
    rounds = []
    for k in range(n - 1):
        partner = [0] * n
        for i in range(n - 1):
            j = (k - i) % (n - 1)
            partner[i] = n - 1 if j == i else j
            if j == i:
                partner[n - 1] = i
        rounds.append([p if p < num_ranks else r for r, p in enumerate(partner[:num_ranks])])
    return rounds


def _retransmitted_segments() -> int:
    """TCP segments this namespace has retransmitted so far (/proc/net/snmp, per network namespace)."""
    head, values = [
        line.split() for line in Path("/proc/net/snmp").read_text().splitlines() if line.startswith("Tcp:")
    ][:2]
    return int(values[head.index("RetransSegs")])


def worker(
    rank: int, m: int, nbytes: int, port: int, out: str, patterns: list[str], ss_s: float, recv_first: bool
) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    store = dist.TCPStore(addr(0), port, world_size=m, is_master=rank == 0, timeout=timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=m, timeout=timedelta(seconds=300))
    shard, recv = torch.zeros(nbytes, dtype=torch.uint8), torch.empty(nbytes, dtype=torch.uint8)
    big, recv_big = torch.zeros(3 * nbytes, dtype=torch.uint8), torch.empty(3 * nbytes, dtype=torch.uint8)

    def post(sends: list, recvs: list) -> list:
        """isend/irecv of (tensor, peer) pairs; receives first when ``recv_first`` (see --recv-first)."""

        def s():
            return [dist.isend(t, p) for t, p in sends]

        def r():
            return [dist.irecv(t, p) for t, p in recvs]

        return r() + s() if recv_first else s() + r()

    def exchange(k: int, a: torch.Tensor, b: torch.Tensor) -> None:
        for w in post([(a, (rank + k) % m)], [(b, (rank - k) % m)]):
            w.wait()

    def pairwise() -> None:
        for k in range(1, m):
            exchange(k, shard, recv)

    recvs = [torch.empty(nbytes, dtype=torch.uint8) for _ in range(m)]

    def concurrent() -> None:
        works = post([(shard, (rank + k) % m) for k in range(1, m)], [(recvs[k], (rank - k) % m) for k in range(1, m)])
        for w in works:
            w.wait()

    def partners() -> None:
        for rnd in exchange_partners(m):
            p = rnd[rank]
            if p != rank:
                for w in post([(shard, p)], [(recv, p)]):
                    w.wait()

    def same_peer() -> None:
        for _ in range(1, m):
            exchange(1, shard, recv)

    def a2a() -> None:
        dist.all_to_all_single(torch.empty(m * nbytes, dtype=torch.uint8), torch.zeros(m * nbytes, dtype=torch.uint8))

    def ring() -> None:
        dist.all_gather_into_tensor(torch.empty(m * nbytes, dtype=torch.uint8), shard)

    fns = {
        "one_round": lambda: exchange(1, shard, recv),
        "one_round_3x": lambda: exchange(1, big, recv_big),
        "same_peer_rounds": same_peer,
        "round_k2": lambda: exchange(2 % m, shard, recv),
        "round_back": lambda: exchange(m - 1, shard, recv),
        "pairwise_rounds": pairwise,
        "partner_rounds": partners,
        "concurrent_p2p": concurrent,
        "all_to_all_single": a2a,
        "all_gather_ring": ring,
    }
    res = {}
    for name in patterns:
        fns[name]()  # warm the connections this pattern uses
        retrans0 = _retransmitted_segments()
        with SsSampler(ss_s, port) if ss_s > 0 else contextlib.nullcontext() as sampler:
            res[name] = time_it(fns[name], repeats=3, before=dist.barrier).median
        res[f"{name}_retransmits"] = (_retransmitted_segments() - retrans0) / 3
        if sampler is not None:
            res[f"{name}_tcp"] = sampler.summary()
    Path(out).write_text(json.dumps(res))
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--mbps", type=float, default=20.0)
    ap.add_argument(
        "--shard-mb", type=float, default=0.7625, help="bytes per peer (default: one bf16 shard of cpu-1m at M = 4)"
    )
    ap.add_argument("--port", type=int, default=29533)
    ap.add_argument("--queue-ms", type=float, default=100.0, help="tbf queue (as benchmarks/link.py)")
    ap.add_argument(
        "--congestion",
        default=None,
        help="TCP congestion control in the namespaces (e.g. reno, bbr; default: the host's)",
    )
    ap.add_argument("--no-offload", action="store_true", help="TSO/GSO/GRO off on the veths (wire-size packets)")
    ap.add_argument(
        "--shaper",
        choices=SHAPERS,
        default="tbf",
        help="tbf: one FIFO per link end; htb: one "
        "class per peer (rate = link / peers, ceil = link), see benchmarks/link.py",
    )
    ap.add_argument(
        "--ack-priority", action="store_true", help="htb: packets < 128 bytes (ACKs) first, in a class of their own"
    )
    ap.add_argument(
        "--sysctl",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="set inside every worker namespace (repeatable), e.g. net.ipv4.tcp_rmem='4096 131072 8388608'",
    )
    ap.add_argument("--patterns", default=",".join(PATTERNS), help="comma-separated subset of: " + ", ".join(PATTERNS))
    ap.add_argument(
        "--recv-first",
        action="store_true",
        help="post every irecv before the isends (gloo "
        "sends a payload only after the receiver's ready notice, which otherwise can queue behind "
        "this rank's own payload on the same connection)",
    )
    ap.add_argument("--ss-series", action="store_true", help="keep the raw ss samples in the JSON")
    ap.add_argument(
        "--ss",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="sample `ss -tinm` every SECONDS in each namespace during the timed runs (0: off)",
    )
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "link_collectives.json")
    ap.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    nbytes = int(args.shard_mb * 1e6)
    patterns = args.patterns.split(",")
    for p in patterns:
        if p not in PATTERNS:
            raise SystemExit(f"--patterns: unknown {p!r}")
    if args.worker:
        worker(int(args.worker[0]), args.workers, nbytes, args.port, args.worker[1], patterns, args.ss, args.recv_first)
        return 0
    sysctls = dict(kv.split("=", 1) for kv in args.sysctl)
    if os.geteuid() != 0:
        raise SystemExit("needs root (network namespaces); run with sudo")
    m = args.workers
    with (
        tempfile.TemporaryDirectory() as tmp,
        Link(
            0.0, m, args.queue_ms, args.congestion, not args.no_offload, args.shaper, args.ack_priority, sysctls
        ) as link,
    ):
        link.shape(args.mbps)
        procs = []
        for r in range(m):
            env = dict(os.environ, GLOO_SOCKET_IFNAME=link.dev[r])
            procs.append(
                subprocess.Popen(
                    [
                        "ip",
                        "netns",
                        "exec",
                        link.ns[r],
                        sys.executable,
                        __file__,
                        "--workers",
                        str(m),
                        "--shard-mb",
                        str(args.shard_mb),
                        "--port",
                        str(args.port),
                        "--patterns",
                        args.patterns,
                        "--ss",
                        str(args.ss),
                        "--worker",
                        str(r),
                        f"{tmp}/r{r}.json",
                    ]
                    + (["--recv-first"] if args.recv_first else []),
                    env=env,
                )
            )
        for p in procs:
            if p.wait(timeout=600) != 0:
                raise SystemExit(f"a worker failed (exit code {p.returncode})")
        per_rank = [json.loads(Path(f"{tmp}/r{r}.json").read_text()) for r in range(m)]
        for pr in per_rank:  # the raw ss samples only when asked for (they are most of the file)
            for key in [k for k in pr if k.endswith("_tcp")]:
                if not args.ss_series:
                    pr[key].pop("series", None)
                    pr[key].pop("series_keys", None)
        qdiscs = link.qdisc_stats()
    link_s = nbytes * 8 / (args.mbps * 1e6)
    one_shard = ("one_round", "round_k2", "round_back")  # one message each way; the rest M-1 (or 3x)
    ideal = {
        p: (link_s if p in one_shard else 3 * link_s if p == "one_round_3x" else (m - 1) * link_s) for p in PATTERNS
    }
    rows = [
        {
            "pattern": p,
            "seconds_max_rank": max(r[p] for r in per_rank),
            "ideal_s": ideal[p],
            "fraction_of_link_rate": ideal[p] / max(r[p] for r in per_rank),
        }
        for p in patterns
    ]
    print(f"\n{m} workers, {args.mbps:g} Mbit/s each way per worker, {nbytes / 1e6:.3f} MB per peer message")
    for r in rows:
        r["retransmits_per_run"] = sum(pr[f"{r['pattern']}_retransmits"] for pr in per_rank)
        tcp = [pr.pop(f"{r['pattern']}_tcp") for pr in per_rank if f"{r['pattern']}_tcp" in pr]
        if tcp:  # per-rank summaries of the sending connections; rank 0's beside the row
            r["tcp_per_rank"] = tcp
    print(
        f"{'pattern':<20} {'seconds':>8} {'ideal':>7} {'of link rate':>13} {'retransmits':>12}"
        + ("  rtt ms  cwnd kB sndwnd kB sndbuf kB  rwnd-lim sndbuf-lim" if args.ss else "")
    )

    def kb(x: float | None) -> str:
        return "-" if x is None else f"{x / 1e3:.0f}"

    for r in rows:
        line = (
            f"{r['pattern']:<20} {r['seconds_max_rank']:>8.3f} {r['ideal_s']:>7.3f} "
            f"{r['fraction_of_link_rate']:>12.0%} {r['retransmits_per_run']:>12.0f}"
        )
        if "tcp_per_rank" in r:
            t = r["tcp_per_rank"]
            busy = sum(x["busy_ms"] for x in t) or 1.0
            rtt = statistics.median([x["rtt_ms_median"] for x in t if x["rtt_ms_median"] is not None] or [0])
            line += (
                f"  {rtt:>6.0f} {kb(t[0]['cwnd_bytes_median']):>8} {kb(t[0]['snd_wnd_median']):>9} "
                f"{kb(t[0]['sndbuf_median']):>9} {sum(x['rwnd_limited_ms'] for x in t) / busy:>8.0%} "
                f"{sum(x['sndbuf_limited_ms'] for x in t) / busy:>10.0%}"
            )
        print(line)
    write_result(
        "link_collectives",
        {
            "config": {
                "workers": m,
                "mbps": args.mbps,
                "shard_bytes": nbytes,
                "queue_ms": args.queue_ms,
                "offload": not args.no_offload,
                "shaper": args.shaper,
                "recv_first": args.recv_first,
                "ack_priority": args.ack_priority,
                "sysctls": sysctls,
                "congestion": args.congestion or Path("/proc/sys/net/ipv4/tcp_congestion_control").read_text().strip(),
            },
            "rows": rows,
            "per_rank": per_rank,
            "qdiscs": qdiscs,
        },
        out=args.out,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
