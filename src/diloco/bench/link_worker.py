"""The workers of the slow-link benchmark (``benchmarks/link.py``, which starts each as its own process across the
emulated link, and reads back the JSON each writes): the overlap and exchange probes, then each method's measured
window (compute utilization, bytes, the CPU used). ``throttle`` is the fallback link where network namespaces
cannot be made: a sleep of bytes / bandwidth in the communicator.
"""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import timedelta
from pathlib import Path

from diloco.bench import time_it

METHODS = {  # name -> (algorithm, num_fragments, overlap_steps, codec)
    "DP": ("dp", 1, 0, "bf16"),
    "DiLoCo": ("diloco", 1, 0, "bf16"),
    "Streaming": ("streaming", None, 0, "bf16"),
    "+overlap": ("streaming", None, 1, "bf16"),
    "+overlap+FP4": ("streaming", None, 1, "fp4_e3m0"),
    "DiLoCo+eager": ("diloco", 1, "H", "bf16"),  # eager updates, tau = H: the exchange overlaps a whole round
}


def _exchanges(args) -> list[str | None]:
    return [None if e == "default" else e for e in args.exchanges.split(",")]


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


__all__ = ["METHODS", "probe_exchanges", "probe_overlap", "run_method", "throttle", "worker"]
