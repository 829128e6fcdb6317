"""Merge throughput of a sharded syncer: S = 2 shards against S = 1, in one process, on this machine.

A round: each of M learners reports each of P fragments, and waits for the P replies; a round's wall time is
what P merges of M reports take, so P / time is the merge throughput (fragments merged per second) and
P x N / time the values merged per second. The syncer side is what ``diloco train`` runs with
``decoupled_transport=threads``: every shard a :class:`~diloco.decoupled.syncer.Syncer` on a
:class:`~diloco.decoupled.local.LocalTransport` thread of its own, the learners' reports routed by a
:class:`~diloco.decoupled.shards.ShardedChannel` (S = 1: the syncer's own channel). The learners are the main
thread, sending prepared payloads (``codec.encode`` of N(0, 1e-3); two distinct ones taken in turn: a merge's
cost does not depend on the values); every report carries the version the learner holds, so every round merges.

The model: a bare stack of P blocks, one matrix each (N values), so fragment p is block p and the shards own
P / S blocks each. S = 1 and S = 2 are timed in alternating rounds (:func:`diloco.bench.time_rounds`): a busy
neighbour slows both alike. ``--threads`` sets torch's intra-op threads (default 1: each shard a core, as one
shard per machine would have; with 2 torch threads one syncer already uses both cores of this machine).

On a machine of C cores a shard thread can only help while cores are idle: S shards on one machine are bounded
by min(S, C) (here C = 2, shared with other work, so the ratio is a floor of what shards on S machines give).

    PYTHONPATH=src python benchmarks/syncer_shards.py --quick        # a smoke run, ~10 s
    PYTHONPATH=src python benchmarks/syncer_shards.py                # ~1-2 min on 2 cores

Prints a table and writes ``benchmarks/results/syncer_shards.json`` (``--out``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
from typing import Any

import torch
from torch import nn

from diloco.bench import add_out, add_quick, machine, print_table, ratio, time_rounds, write_result
from diloco.decoupled.local import LocalTransport
from diloco.decoupled.messages import Report
from diloco.decoupled.shards import ShardedChannel, build_shards
from diloco.decoupled.syncer import Syncer
from diloco.wire.registry import get_codec


class Stack(nn.Module):
    """P blocks of one d x d matrix each (no forward: only the shapes matter)."""

    def __init__(self, *, width: int, num_blocks: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Linear(width, width, bias=False) for _ in range(num_blocks))


class Bench:
    """S shards on their threads, M learners' channels, prepared payloads; :meth:`round` times one round."""

    def __init__(self, *, num_shards: int, width: int, fragments: int, learners: int, codec: str, merge: str):
        torch.manual_seed(0)
        model = Stack(width=width, num_blocks=fragments)
        self.codec, self.P, self.M = get_codec(codec), fragments, learners
        syncers = build_shards(
            model,
            num_shards=num_shards,
            num_fragments=fragments,
            build=lambda m, n, groups: Syncer(
                m, num_learners=learners, num_fragments=n, fragments=groups, codec=codec, merge=merge
            ),
        )
        self.stack = contextlib.ExitStack()
        self.transports = [self.stack.enter_context(LocalTransport(s, timeout=600)) for s in syncers]
        self.channels = [
            ShardedChannel([t.channel(m) for t in self.transports]) if num_shards > 1 else self.transports[0].channel(m)
            for m in range(learners)
        ]
        welcome = [c.join() for c in self.channels][0]
        self.versions = [list(welcome.versions) for _ in range(learners)]
        n = width * width
        self.payloads = [self.codec.encode(torch.randn(n) * 1e-3) for _ in range(2)]
        self.step = 0

    def round(self) -> None:
        self.step += 1
        for m, channel in enumerate(self.channels):
            for p in range(self.P):
                payload = self.payloads[(m + p) % 2]
                channel.send(Report(m, p, payload, steps=1, tokens=1.0, step_time=0.0, sent_after_step=self.step,
                                    base_version=self.versions[m][p]))  # fmt: skip
        for m, channel in enumerate(self.channels):
            for p in range(self.P):
                self.versions[m][p] = channel.wait_reply(p).version

    def close(self) -> None:
        self.stack.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--width", type=int, default=1024, help="d: each fragment a d x d matrix (default 1024: 1M values)")
    ap.add_argument("--fragments", type=int, default=4, help="P (default 4)")
    ap.add_argument("--learners", type=int, default=4, help="M (default 4)")
    ap.add_argument("--codecs", default="fp32,fp4_e3m0", help="comma-separated (default fp32,fp4_e3m0)")
    ap.add_argument("--merge", default="rda", help="rda or mean (default rda)")
    ap.add_argument("--repeats", type=int, default=9, help="timed rounds of each S (default 9)")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    add_quick(ap)
    add_out(ap, "syncer_shards")
    args = ap.parse_args(argv)
    if args.quick:
        args.width, args.repeats, args.codecs = 128, 2, "fp32"
    torch.set_num_threads(args.threads)
    rows: list[dict[str, Any]] = []
    for codec in args.codecs.split(","):
        kw = dict(width=args.width, fragments=args.fragments, learners=args.learners, codec=codec, merge=args.merge)
        benches = {s: Bench(num_shards=s, **kw) for s in (1, 2)}
        try:
            timings = time_rounds({f"S={s}": b.round for s, b in benches.items()}, repeats=args.repeats, warmup=1)
        finally:
            for b in benches.values():
                b.close()
        one = timings["S=1"]
        for s in (1, 2):
            t = timings[f"S={s}"]
            rows.append(
                {
                    "codec": codec,
                    "shards": s,
                    "fragments": args.fragments,
                    "learners": args.learners,
                    "values_per_fragment": args.width * args.width,
                    "round_s": t.as_dict(),
                    "merges_per_s": args.fragments / t.median,
                    "throughput_vs_one": 1.0 / ratio(t, one),
                }
            )
    print_table(
        rows,
        [
            ("codec", "codec", ""),
            ("S", "shards", ""),
            ("P", "fragments", ""),
            ("M", "learners", ""),
            ("N/fragment", "values_per_fragment", ""),
            ("round s (median)", lambda r: r["round_s"]["median_s"], ".3f"),
            ("merges/s", "merges_per_s", ".1f"),
            ("x S=1", "throughput_vs_one", ".2f"),
        ],
        title=f"merge throughput, S shards on threads (torch threads {args.threads}, load {os.getloadavg()[0]:.1f})",
    )
    write_result(
        "syncer_shards",
        {
            "machine": machine(),
            "load_average_1min": os.getloadavg()[0],
            "torch_threads": args.threads,
            "merge": args.merge,
            "repeats": args.repeats,
            "quick": args.quick,
            "rows": rows,
        },
        out=args.out,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
