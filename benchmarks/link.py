"""M workers across emulated slow links: measured compute utilization of DP, DiLoCo and Streaming DiLoCo.

M worker processes (``--workers``, default 2), each in its own network namespace.
For M = 2 the two are joined by a veth pair whose two ends are shaped by ``tc``
(tbf: bandwidth; netem: latency, where the kernel has it). For M > 2 each
worker's veth leads to a bridge in a namespace of its own, and both ends of each
veth are shaped: every worker has a link of the given bandwidth each way (its
upload and its download), which is what the simulator models. Everything the
workers exchange (gloo's collectives and the rendezvous store) crosses those
links. The namespaces, veths, bridge and private addresses (10.213.0.x) are
created by this script and always torn down, even on error or Ctrl-C. Needs
root and iproute2 (``apt-get install -y iproute2``). If namespaces cannot be
created, the workers run on loopback and a throttle in the communicator sleeps
bytes/bandwidth instead: the output says so.

``--exchanges all_gather,reduce_scatter`` runs every method with each exchange
of the communicator forced (see ``diloco.comm.base``; default: the
communicator's own choice, all-gather for M <= 2, reduce-scatter above).

Each worker trains a small transformer (``diloco.models`` size ``cpu-1m``,
vocab 4096, seq 128) on synthetic tokens, one intra-op thread per worker, with:

* DP: gradients all-gathered every step, bf16 on the wire (the papers' 16 bits);
* DiLoCo: H steps, P = 1, bf16;
* Streaming: P fragments (fragment 0 = embeddings/head), tau = 0, bf16;
* +overlap: tau = 1;  +FP4: tau = 1 and the fp4_e3m0 codec;
* DiLoCo+eager (only when asked for): DiLoCo with eager updates, tau = H (the exchange of one round
  overlaps the whole next round; measured over the second round).

Compute utilization = time in forward/backward/optimizer / wall time of the
measured window (everything else: waiting on the link, encode/decode, outer
step). Window: H steps after 3 warm-up steps (exactly one sync of every fragment), DP: a few steps.
Also per row: the CPU the workers used (``cores``: CPU seconds of all their threads / wall, summed over
workers). M workers on fewer cores than M + their exchange threads share the CPU: then an exchange
waits for the CPU as well as for the link. ``--compute-s S`` replaces each step's forward/backward/
AdamW by a sleep of S seconds (an accelerator's step: the CPU is left to the exchange, as on
machines of their own); the exchange itself (encode, sends, the FP32 sum, decode) is unchanged.

    sudo .venv/bin/python benchmarks/link.py                 # ~5 minutes on 2 cores
    .venv/bin/python benchmarks/link.py --bandwidths 20 --quick
    sudo .venv/bin/python benchmarks/link.py --workers 4 --bandwidths 20 --shaper htb \
        --methods DiLoCo,+overlap,DiLoCo+eager --exchanges all_gather,reduce_scatter   # M = 4, ~9 minutes

``--shaper htb`` shapes every link end with one HTB class per peer instead of one tbf FIFO (which
drops packets when several flows share it; see ``Link._htb``), ``--ack-priority`` adds a first
class for small packets (pure ACKs), ``--sysctl KEY=VALUE`` sets sysctls in the namespaces.

Prints a table and writes benchmarks/results/link.json (link_m<M>.json for M != 2). This script is the driver (the
link, the worker processes, the table); what each worker runs is :mod:`diloco.bench.link_worker`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from diloco.bench.link_emulation import SHAPERS, Link, addr
from diloco.bench.link_report import report, repredict, with_predictions
from diloco.bench.link_worker import METHODS, worker

PORT = 29517


def launch(args, mbps: float, link: Link | None, tmp: Path) -> list[dict]:
    procs, outs = [], []
    for rank in range(args.workers):
        out = tmp / f"bw{mbps:g}_rank{rank}.json"
        cmd = [
            sys.executable,
            __file__,
            "--worker",
            "--rank",
            str(rank),
            "--mbps",
            str(mbps),
            "--json-out",
            str(out),
            "--methods",
            args.methods,
            "--H",
            str(args.H),
            "--fragments",
            str(args.fragments),
            "--dp-steps",
            str(args.dp_steps),
            "--size",
            args.size,
            "--batch",
            str(args.batch),
            "--seq",
            str(args.seq),
            "--vocab",
            str(args.vocab),
            "--latency-ms",
            str(args.latency_ms),
            "--workers",
            str(args.workers),
            "--exchanges",
            args.exchanges,
            "--compute-s",
            str(args.compute_s),
        ]
        if link is not None:
            cmd = ["ip", "netns", "exec", link.ns[rank]] + cmd + ["--addr", addr(0), "--ifname", link.dev[rank]]
        else:
            cmd += ["--addr", "127.0.0.1", "--ifname", "lo", "--throttle"]
        procs.append(subprocess.Popen(cmd))
        outs.append(out)
    try:
        for p in procs:
            if p.wait(timeout=1200) != 0:
                raise RuntimeError(f"a worker failed (exit code {p.returncode}); see its output above")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return [json.loads(o.read_text()) for o in outs]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bandwidths", default="20,100,1000", help="Mbit/s, comma-separated")
    ap.add_argument("--latency-ms", type=float, default=0.0, help="one-way delay per direction (needs netem)")
    ap.add_argument(
        "--methods",
        default=",".join(m for m in METHODS if m != "DiLoCo+eager"),
        help="comma-separated, of: " + ", ".join(METHODS),
    )
    ap.add_argument("--workers", type=int, default=2, help="M, worker processes (one namespace each)")
    ap.add_argument(
        "--queue-ms",
        type=float,
        default=100.0,
        help="tbf queue: packets that would wait longer are dropped (tbf's 'latency')",
    )
    ap.add_argument(
        "--shaper",
        choices=SHAPERS,
        default=None,
        help="tbf: one FIFO per link end; htb: one class (and FIFO) per peer, rate = link / peers, "
        "ceil = link (see Link._htb). Default: tbf for 2 workers (one peer), htb for more "
        "(one FIFO shared by several peers' flows drops packets)",
    )
    ap.add_argument(
        "--ack-priority",
        action="store_true",
        help="htb: packets under 128 bytes (pure ACKs) first, in a class of their own",
    )
    ap.add_argument(
        "--sysctl",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="set inside every worker namespace (repeatable), e.g. net.ipv4.tcp_wmem='4096 16384 4194304'",
    )
    ap.add_argument(
        "--exchanges",
        default="default",
        help="comma-separated: default, all_gather, reduce_scatter (each method runs with each)",
    )
    ap.add_argument("--H", type=int, default=24, help="sync_every for the DiLoCo methods")
    ap.add_argument("--fragments", type=int, default=3, help="P for Streaming (fragment 0 = non-block params)")
    ap.add_argument("--dp-steps", type=int, default=4)
    ap.add_argument("--size", default="cpu-1m")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument(
        "--compute-s",
        type=float,
        default=0.0,
        help="emulate each step's compute by a sleep of this many seconds (an accelerator's step: "
        "the CPU is left to the exchange); 0 = real forward/backward/AdamW on the CPU",
    )
    ap.add_argument("--quick", action="store_true", help="H=8, 2 DP steps (smoke run)")
    ap.add_argument("--force-throttle", action="store_true", help="skip namespaces; use the in-process throttle")
    ap.add_argument("--out", default=None, help="default benchmarks/results/link.json (link_m<M>.json for M != 2)")
    ap.add_argument(
        "--repredict",
        action="store_true",
        help="no training: recompute the simulator's predictions for the measurements in --out "
        "(after a change to the simulator) and print the table again",
    )
    # worker-only
    for flag in ("--rank", "--mbps", "--json-out", "--addr", "--ifname"):
        ap.add_argument(flag, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=PORT, help=argparse.SUPPRESS)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--throttle", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.out is None:
        args.out = str(
            Path(__file__).parent / "results" / ("link.json" if args.workers == 2 else f"link_m{args.workers}.json")
        )
    if args.workers < 2 or args.workers > 26:
        raise SystemExit(f"--workers must lie in 2..26, got {args.workers}")
    if args.shaper is None:
        args.shaper = "tbf" if args.workers == 2 else "htb"
    if args.ack_priority and args.shaper != "htb":
        raise SystemExit("--ack-priority needs --shaper htb")
    for name in args.methods.split(","):
        if name not in METHODS:
            raise SystemExit(f"--methods: unknown {name!r}; use {', '.join(METHODS)}")
    for e in args.exchanges.split(","):
        if e not in ("default", "all_gather", "reduce_scatter"):
            raise SystemExit(f"--exchanges: unknown {e!r}; use default, all_gather or reduce_scatter")
    if args.worker:
        args.rank, args.mbps = int(args.rank), float(args.mbps)
        worker(args)
        return 0
    if args.repredict:
        return repredict(Path(args.out))
    if args.quick:
        args.H, args.dp_steps = 8, 2
    bandwidths = [float(b) for b in args.bandwidths.split(",")]
    # SIGTERM takes the same path as Ctrl-C, so the with/finally clauses below tear the link down
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        return _orchestrate(args, bandwidths)
    except KeyboardInterrupt:
        print("interrupted: workers killed, namespaces and veth pair removed", file=sys.stderr)
        return 130


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def _orchestrate(args, bandwidths: list[float]) -> int:
    notes: list[str] = []
    link: Link | None = None
    with tempfile.TemporaryDirectory() as tmpdir, contextlib.ExitStack() as cleanup:
        if args.force_throttle:
            notes.append("namespaces skipped (--force-throttle): THROTTLE IN THE COMMUNICATOR, not a real link")
        elif os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("tc") is None:
            notes.append("no root or no iproute2: THROTTLE IN THE COMMUNICATOR (sleep bytes/bandwidth), not a link")
        else:
            try:
                link = cleanup.enter_context(
                    Link(  # always torn down
                        args.latency_ms,
                        args.workers,
                        args.queue_ms,
                        shaper=args.shaper,
                        ack_priority=args.ack_priority,
                        sysctls=dict(kv.split("=", 1) for kv in args.sysctl),
                    )
                )
            except (subprocess.CalledProcessError, OSError) as exc:
                detail = getattr(exc, "stderr", "") or str(exc)
                notes.append(f"network namespaces unavailable ({detail.strip()}): THROTTLE IN THE COMMUNICATOR")
        rows, probes = [], {}
        for mbps in bandwidths:
            if link is not None:
                link.shape(mbps)
            print(f"== {mbps:g} Mbit/s", file=sys.stderr, flush=True)
            results = launch(args, mbps, link, Path(tmpdir))
            probes[mbps] = results[0]["probe"]
            for i, run in enumerate(results[0]["runs"]):
                mates = [r["runs"][i] for r in results]
                util = sum(m["utilization"] for m in mates) / len(mates)
                rows.append(
                    run
                    | {
                        "mbps": mbps,
                        "utilization": util,
                        "s_per_step": max(m["s_per_step"] for m in mates),
                        "utilization_per_rank": [m["utilization"] for m in mates],
                        "cores_used": sum(m["cores_used"] for m in mates),
                    }
                    | with_predictions(run, probes[mbps], mbps, args.latency_ms)
                )
        if link is not None:
            notes += link.notes
    report(rows, probes, notes, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
