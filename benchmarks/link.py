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

Prints a table and writes benchmarks/results/link.json (link_m<M>.json for M != 2).
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
import time
from datetime import timedelta
from pathlib import Path

from diloco.bench import time_it
from diloco.bench.link_emulation import SHAPERS, Link, addr
from diloco.bench.link_report import report, repredict, with_predictions

PORT = 29517
METHODS = {  # name -> (algorithm, num_fragments, overlap_steps, codec)
    "DP": ("dp", 1, 0, "bf16"),
    "DiLoCo": ("diloco", 1, 0, "bf16"),
    "Streaming": ("streaming", None, 0, "bf16"),
    "+overlap": ("streaming", None, 1, "bf16"),
    "+overlap+FP4": ("streaming", None, 1, "fp4_e3m0"),
    "DiLoCo+eager": ("diloco", 1, "H", "bf16"),  # eager updates, tau = H: the exchange overlaps a whole round
}


# ============================================================================================ the worker
class _ThrottledWork:
    def __init__(self, inner, ready_at: float) -> None:
        self.inner, self.ready_at = inner, ready_at

    def wait(self):
        out = self.inner.wait()
        time.sleep(max(0.0, self.ready_at - time.monotonic()))
        return out

    def is_completed(self) -> bool:
        return self.inner.is_completed() and time.monotonic() >= self.ready_at


def throttle(comm, mbps: float, latency_ms: float):
    """Fallback link: a collective moving b bytes to the others finishes b * 8 / bandwidth after the link is free."""
    state = {"free_at": 0.0}
    gather, a2a = comm._start_all_gather, comm._start_all_to_all

    def ready_at(nbytes: int) -> float:
        state["free_at"] = max(time.monotonic(), state["free_at"]) + nbytes * 8 / (mbps * 1e6)
        return state["free_at"] + latency_ms / 1e3

    def throttled_gather(payload, tag):
        return _ThrottledWork(gather(payload, tag), ready_at((comm.world_size - 1) * payload.numel()))

    def throttled_a2a(chunks, recv_sizes, tag, seq=None):
        out = sum(c.numel() for j, c in enumerate(chunks) if j != comm.rank)
        return _ThrottledWork(a2a(chunks, recv_sizes, tag, seq), ready_at(out))

    comm._start_all_gather, comm._start_all_to_all = throttled_gather, throttled_a2a
    return comm


def _tx_bytes(dev: str | None) -> int:
    if dev is None:
        return 0
    return int(Path(f"/sys/class/net/{dev}/statistics/tx_bytes").read_text())


def probe_overlap(comm, mbps: float) -> dict:
    """Does an async gloo all-gather progress while this process computes? ~1 s of traffic vs ~1 s of matmuls."""
    import torch

    others = comm.world_size - 1  # an all-gather moves (M-1) payloads each way per rank
    payload = torch.randint(0, 255, (int(min(mbps * 1e6 / 8, 40e6) / others),), dtype=torch.uint8)
    a = torch.randn(256, 256)
    reps = 1
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < 0.2:
        a @ a
        reps += 1
    reps = int(reps * 5)  # ~1 s

    def compute() -> None:
        for _ in range(reps):
            a @ a

    def timed(fn) -> float:  # median of three, each started together on both ranks
        return time_it(fn, repeats=3, before=comm.barrier).median

    def both() -> None:
        work = comm.all_gather_async(payload, tag="probe")
        compute()
        work.wait()

    t_comm = timed(lambda: comm.all_gather_async(payload, tag="probe").wait())
    t_compute = timed(compute)
    t_both = timed(both)
    hidden = (t_comm + t_compute - t_both) / min(t_comm, t_compute)
    return {
        "payload_bytes": payload.numel(),
        "comm_s": t_comm,
        "compute_s": t_compute,
        "overlapped_s": t_both,
        "serial_s": t_comm + t_compute,
        "fraction_hidden": hidden,
        "effective_mbps": others * payload.numel() * 8 / t_comm / 1e6,
    }  # per rank, each way, both at once


def probe_exchanges(comm, numel: int, codec_name: str, mbps: float) -> dict:
    """Seconds of one ``mean_async`` of ``numel`` values with each exchange, alone (no compute): median of 3,
    beside the link time of the bytes the traffic function says cross each worker's link."""
    import torch

    from diloco.wire.registry import get_codec

    codec = get_codec(codec_name)
    values = torch.randn(numel, generator=torch.Generator().manual_seed(comm.rank))
    out = {}
    for exchange in ("all_gather", "reduce_scatter"):
        comm.exchange = exchange
        payload = comm.encode(values, codec)
        comm.mean_async(payload, codec=codec, numel=numel, tag="probe").wait()  # warm every connection
        works = []

        def exchange_once() -> None:
            works.append(comm.mean_async(payload, codec=codec, numel=numel, tag="probe"))
            works[-1].wait()

        seconds = time_it(exchange_once, repeats=3, before=comm.barrier).median
        sent = max(works[-1].link_bytes.sent, works[-1].link_bytes.received)
        out[exchange] = {"s": seconds, "bytes_each_way": sent, "link_s": sent * 8 / (mbps * 1e6)}
    comm.exchange = None
    return out


def run_method(comm, name: str, args, dev: str | None, exchange: str | None = None) -> dict:
    import torch

    from diloco.algorithm.data_parallel import DataParallel
    from diloco.algorithm.streaming import StreamingDiLoCo
    from diloco.models import Transformer, make_config

    kind, P, tau, codec = METHODS[name]
    P = args.fragments if P is None else P
    eager = tau == "H"
    tau = args.H if eager else tau
    comm.exchange = exchange  # None: the communicator's default for M
    torch.manual_seed(0)
    model = Transformer(make_config(args.size, vocab_size=args.vocab, seq_len=args.seq))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    if kind == "dp":
        algo = DataParallel(model, comm=comm, codec=codec)
        warmup, measured = 1, args.dp_steps
    else:
        algo = StreamingDiLoCo(
            model, comm=comm, sync_every=args.H, num_fragments=P, overlap_steps=tau, codec=codec, eager=eager
        )
        # the window of H steps holds exactly one sync of every fragment; eager (tau = H): the window
        # is the second round, so it holds one landing (the wait for the exchange started H steps
        # before) and one start
        warmup, measured = (3 + args.H if eager else 3), args.H
    gen = torch.Generator().manual_seed(comm.rank)
    compute = 0.0
    # One exchange of the payload's size first, so that every pair of workers' TCP connection is past slow
    # start, as in a long run (a ring all-gather uses only neighbours; the all-to-all uses every pair).
    n_params = sum(p.numel() for p in model.parameters())
    warm = algo.codec
    comm.mean_async(comm.encode(torch.zeros(n_params), warm), codec=warm, numel=n_params, tag="warm-up").wait()
    comm.barrier()
    emulated = args.compute_s > 0
    in_step = 0.0
    for step in range(1, warmup + measured + 1):
        if step == warmup + 1:
            compute, sent0, tx0, t_start = 0.0, comm.stats.bytes_sent, _tx_bytes(dev), time.perf_counter()
            cpu0, in_step = time.process_time(), 0.0
        t0 = time.perf_counter()
        if emulated:  # an accelerator's step: the CPU is left to the exchange meanwhile
            time.sleep(args.compute_s)
            with torch.no_grad():  # the parameters still move, so every outer gradient is non-zero
                for p in model.parameters():
                    p.mul_(1.0 + 1e-4 * (1 + comm.rank))
        else:
            x = torch.randint(0, args.vocab, (args.batch, args.seq), generator=gen)
            _, loss = model(x, x.roll(-1, dims=1))
            loss.backward()
        compute += time.perf_counter() - t0
        if kind == "dp":
            algo.sync_gradients()
        t0 = time.perf_counter()
        if not emulated:
            opt.step()
            opt.zero_grad(set_to_none=True)
            compute += time.perf_counter() - t0
        t0 = time.perf_counter()
        algo.step()
        in_step += time.perf_counter() - t0
    wall = time.perf_counter() - t_start
    cpu = time.process_time() - cpu0  # every thread of this worker: compute, encode, the exchange's
    sent, wire = comm.stats.bytes_sent - sent0, _tx_bytes(dev) - tx0  # the window's, before the flush
    if kind != "dp":
        algo.flush()  # outside the window: no exchange left in flight (eager ends the window with one)
    n_params = sum(p.numel() for p in model.parameters())
    non_block = n_params - sum(p.numel() for p in model.blocks.parameters())
    ran = comm.exchange_for(n_params)  # every payload here is far larger than M values
    return {
        "method": name if exchange is None else f"{name} [{exchange}]",
        "base_method": name,
        "workers": comm.world_size,
        "exchange": ran,
        "kind": kind,
        "H": 1 if kind == "dp" else args.H,
        "P": P,
        "tau": tau,
        "eager": eager,
        "codec": codec,
        "bits": algo.codec.bits_per_value,
        "steps": measured,
        "compute_s": compute,
        "wall_s": wall,
        "utilization": compute / wall,
        "s_per_step": wall / measured,
        "compute_s_per_step": compute / measured,
        "bytes_sent": sent,
        "compute_emulated": emulated,
        "cpu_s": cpu,
        "cores_used": cpu / wall,
        "in_step_s": in_step,
        "wire_tx_bytes": wire,
        "num_params": n_params,
        "non_block_params": non_block,
        "num_layers": len(model.blocks),
    }


def worker(args) -> None:
    import torch
    import torch.distributed as dist

    from diloco.comm.torch_dist import TorchDistCommunicator

    torch.set_num_threads(1)
    os.environ["GLOO_SOCKET_IFNAME"] = args.ifname
    store = dist.TCPStore(
        args.addr, args.port, world_size=args.workers, is_master=args.rank == 0, timeout=timedelta(seconds=120)
    )
    dist.init_process_group(
        "gloo", store=store, rank=args.rank, world_size=args.workers, timeout=timedelta(seconds=900)
    )
    comm = TorchDistCommunicator(timeout_s=900, heartbeat_s=0)  # no heartbeat traffic on the measured link
    if args.throttle:
        throttle(comm, args.mbps, args.latency_ms)
    dev = None if args.throttle else args.ifname
    out = {"rank": args.rank, "probe": probe_overlap(comm, args.mbps), "runs": []}
    if args.workers > 2:
        from diloco.models import Transformer, make_config

        n = sum(
            p.numel() for p in Transformer(make_config(args.size, vocab_size=args.vocab, seq_len=args.seq)).parameters()
        )
        out["probe"]["exchanges"] = probe_exchanges(comm, n, "bf16", args.mbps)
    for name in args.methods.split(","):
        for exchange in _exchanges(args):
            out["runs"].append(run_method(comm, name, args, dev, exchange))
            print(
                f"  [rank {args.rank}] {out['runs'][-1]['method']}: {out['runs'][-1]['utilization']:.1%}",
                file=sys.stderr,
                flush=True,
            )
    comm.barrier()
    Path(args.json_out).write_text(json.dumps(out))
    dist.destroy_process_group()


# ====================================================================================== the orchestrator
def _exchanges(args) -> list[str | None]:
    return [None if e == "default" else e for e in args.exchanges.split(",")]


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
