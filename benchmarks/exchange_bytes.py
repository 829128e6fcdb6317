"""Bytes per replica per sync: the all-gather against the reduce-scatter exchange, at M = 2, 4, 8 on gloo.

M processes on loopback (``diloco.distributed.run_processes``) average one
fragment of ``--numel`` values through ``comm.mean_async`` with each exchange
forced (``comm.exchange``) and each codec. Per rank it reads three numbers:

* counted: what the communicator's accounting says crossed the rank's link each way
  (``comm.stats.bytes_sent`` / ``bytes_received``, from ``diloco.traffic``);
* handed to gloo: the sizes of the tensors the rank gave its collectives for other
  ranks (``comm.stats.wire_sent`` / ``wire_received``), measured independently;
* analytic: ``diloco.traffic.exchange_bytes`` for the payload (``(M-1)·n`` and
  ``2(M-1)/M·n``, equal shards, ignoring that each shard carries its own scales).

What a real link carries on top (TCP/IP headers) is measured by ``benchmarks/link.py``.

    .venv/bin/python benchmarks/exchange_bytes.py          # ~30 s on 2 cores

Prints a table and writes benchmarks/results/exchange_bytes.json.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from diloco.bench import write_result


def replica(comm, cfg: dict) -> dict:
    from diloco.wire.registry import get_codec

    codec = get_codec(cfg["codec"])
    comm.exchange = cfg["exchange"]
    values = torch.randn(cfg["numel"], generator=torch.Generator().manual_seed(comm.rank))
    work = comm.mean_async(comm.encode(values, codec), codec=codec, numel=cfg["numel"], tag="bench")
    mean, _ = work.wait()
    s = comm.stats
    return {
        "exchange": work.exchange,
        "sent": s.bytes_sent,
        "received": s.bytes_received,
        "wire_sent": s.wire_sent,
        "wire_received": s.wire_received,
        "mean0": float(mean[0]),
    }


def main(argv: list[str] | None = None) -> int:
    from diloco.distributed import run_processes
    from diloco.traffic import exchange_bytes
    from diloco.wire.registry import get_codec

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--replicas", default="2,4,8")
    ap.add_argument("--codecs", default="fp32,fp4_e3m0")
    ap.add_argument("--numel", type=int, default=1_000_000, help="values in the fragment")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "exchange_bytes.json")
    args = ap.parse_args(argv)
    rows = []
    for m in (int(x) for x in args.replicas.split(",")):
        for name in args.codecs.split(","):
            n = get_codec(name).num_bytes(args.numel)
            row = {"replicas": m, "codec": name, "numel": args.numel, "payload_bytes": n}
            for exchange in ("all_gather", "reduce_scatter"):
                cfg = {"codec": name, "exchange": exchange, "numel": args.numel}
                res = run_processes(replica, m, args=(cfg,), timeout_s=300)
                assert len({r["mean0"] for r in res}) == 1, "the replicas disagree on the mean"
                analytic = exchange_bytes(payload_bytes=n, num_replicas=m, exchange=exchange)
                row[exchange] = {
                    "ran": res[0]["exchange"],
                    "counted_sent_max": max(r["sent"] for r in res),
                    "counted_received_max": max(r["received"] for r in res),
                    "counted_sent_mean": sum(r["sent"] for r in res) / m,
                    "counted_equals_handed_to_gloo": all(
                        (r["sent"], r["received"]) == (r["wire_sent"], r["wire_received"]) for r in res
                    ),
                    "analytic": analytic,
                }
            rows.append(row)
    print(
        f"\n{'M':>2} {'codec':<9} {'payload n':>10} | {'all-gather':>11} {'analytic':>11} | "
        f"{'reduce-scat':>11} {'analytic':>11} {'ratio':>6} | counted = handed to gloo"
    )
    for r in rows:
        ag, rs = r["all_gather"], r["reduce_scatter"]
        ok = ag["counted_equals_handed_to_gloo"] and rs["counted_equals_handed_to_gloo"]
        ran = "" if rs["ran"] == "reduce_scatter" else f" (ran {rs['ran']})"
        print(
            f"{r['replicas']:>2} {r['codec']:<9} {r['payload_bytes']:>10,} | {ag['counted_sent_max']:>11,} "
            f"{ag['analytic']:>11,.0f} | {rs['counted_sent_max']:>11,} {rs['analytic']:>11,.0f} "
            f"{ag['counted_sent_max'] / max(rs['counted_sent_max'], 1):>6.2f} | {ok}{ran}"
        )
    print(
        "bytes each way per replica per sync (sent = received; max over ranks: uneven shards differ by a few "
        "bytes).\nanalytic: diloco.traffic.exchange_bytes, (M-1)·n and 2(M-1)/M·n."
    )
    write_result(
        "exchange_bytes",
        {"config": {"replicas": args.replicas, "codecs": args.codecs, "numel": args.numel}, "rows": rows},
        out=args.out,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
