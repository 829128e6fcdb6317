"""Run a replica function in N fresh processes on gloo: the multi-process twin of ``run_replicas``.

``run_replicas(fn, M)`` (threads, in-process backend) and ``run_processes(fn, M)``
(processes, :class:`~diloco.comm.torch_dist.TorchDistCommunicator`) call the same
``fn(comm)``, so a test or a benchmark can run one replica function both ways
and compare the results. Used by tests/distributed and benchmarks/link.py; a
real job is launched by torchrun instead (see :mod:`diloco.distributed.launch`).

How: this (parent) process hosts the rendezvous ``TCPStore`` on ``host`` (loopback
by default, a free port), so the store outlives any child and a survivor can
read from it which peer stopped. Children start from a *forkserver* that has
already imported torch (a child costs ~0.1 s instead of ~2 s for a fresh
interpreter) and that never ran a kernel, so forking it is safe. Each child joins
the process group, runs ``fn(comm, *args)`` and sends back its result (pickled
with ``torch.save``) or its exception; a child that exits without either is
reported with its exit code. ``fn`` must be importable (a module-level function).
"""

from __future__ import annotations

import io
import multiprocessing as mp
import os
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from multiprocessing.connection import Connection, wait
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from diloco.distributed.launch import bind_gloo_to_loopback_if_local
from diloco.errors import ConfigError, RunError

T = TypeVar("T")

# Imported once by the forkserver, inherited by every child. torch._dynamo (~2 s) is what
# DistributedDataParallel's constructor imports; preloading it makes a DDP child start in ~0.1 s.
_PRELOAD = [
    "torch",
    "torch.distributed",
    "torch._dynamo",
    "diloco.comm.torch_dist",
    "diloco.comm.mesh",
    "diloco.algorithm.streaming",
    "diloco.algorithm.data_parallel",
]


@dataclass
class RankFailure:
    """Why one rank did not return a result."""

    rank: int
    error_type: str  # exception class name, or "exit" for a process that died without a word
    message: str
    traceback: str = ""
    exitcode: int | None = None


class ProcessFailure(RunError):
    """One or more ranks raised or died; ``failures`` says which and why, ``results`` holds the rest."""

    def __init__(self, failures: Sequence[RankFailure], results: dict[int, Any]) -> None:
        self.failures = {f.rank: f for f in failures}
        self.results = results
        lines = [f"rank {f.rank}: {f.error_type}: {f.message}" for f in failures]
        detail = "\n".join(f"--- rank {f.rank} ---\n{f.traceback}" for f in failures if f.traceback)
        super().__init__("; ".join(lines) + (f"\n{detail}" if detail else ""))


def _child(
    rank: int,
    world_size: int,
    host: str,
    port: int,
    fn: Callable[..., Any],
    args: tuple,
    conn: Connection,
    options: dict[str, Any],
) -> None:
    from diloco.comm.torch_dist import TorchDistCommunicator

    torch.set_num_threads(options["threads"])
    bind_gloo_to_loopback_if_local(host)
    if options["backend"] == "nccl":  # one GPU per rank (before the communicator picks the current device)
        torch.cuda.set_device(rank % torch.cuda.device_count())
    try:
        store = dist.TCPStore(host, port, is_master=False, timeout=timedelta(seconds=options["pg_timeout_s"]))
        dist.init_process_group(
            options["backend"],
            store=store,
            rank=rank,
            world_size=world_size,
            timeout=timedelta(seconds=options["pg_timeout_s"]),
        )
        comm = TorchDistCommunicator(timeout_s=options["comm_timeout_s"], store=store)
        result = fn(comm, *args)
        buf = io.BytesIO()
        torch.save(result, buf)
        conn.send(("ok", buf.getvalue()))
    except BaseException as exc:
        conn.send(("error", type(exc).__name__, str(exc), traceback.format_exc()))
    conn.close()
    # Skip interpreter teardown: gloo threads may still be blocked on a dead peer.
    os._exit(0)


def _context(start_method: str):
    ctx = mp.get_context(start_method)
    if start_method == "forkserver":
        ctx.set_forkserver_preload(_PRELOAD)
    return ctx


def run_processes(
    fn: Callable[..., T],
    world_size: int,
    *,
    args: tuple = (),
    timeout_s: float = 300.0,
    comm_timeout_s: float = 60.0,
    pg_timeout_s: float | None = None,
    grace_s: float | None = None,
    backend: str = "gloo",
    threads: int = 1,
    host: str = "127.0.0.1",
    start_method: str = "forkserver",
) -> list[T]:
    """Run ``fn(comm, *args)`` in ``world_size`` processes; return the results in rank order.

    Args:
        fn: a module-level function; ``comm`` is a :class:`TorchDistCommunicator` over all ranks.
        timeout_s: the whole run's deadline; past it every child is killed and ``TimeoutError`` raised.
        comm_timeout_s: the communicator's wait timeout (see ``TorchDistCommunicator``).
        pg_timeout_s: the process group's timeout (default ``max(comm_timeout_s, 60)``).
        grace_s: once a rank has failed, how long the others may still run before being killed
            (default ``comm_timeout_s + 10``: long enough for them to hit their own timeout and report).
        threads: ``torch.set_num_threads`` in each child (1: deterministic and no oversubscription).
        host: address the store and gloo bind to (loopback by default).

    Raises:
        ProcessFailure: some rank raised or exited without a result (all ranks' reasons inside).
    """
    if world_size < 1:
        raise ConfigError(f"world_size must be >= 1, got {world_size}")
    options = {
        "backend": backend,
        "threads": threads,
        "comm_timeout_s": comm_timeout_s,
        "pg_timeout_s": pg_timeout_s if pg_timeout_s is not None else max(comm_timeout_s, 60.0),
    }
    ctx = _context(start_method)
    store = dist.TCPStore(host, 0, is_master=True, wait_for_workers=False)
    procs, readers = [], {}
    for rank in range(world_size):
        reader, writer = ctx.Pipe(duplex=False)
        p = ctx.Process(
            target=_child,
            args=(rank, world_size, host, store.port, fn, args, writer, options),
            name=f"diloco-rank-{rank}",
            daemon=True,
        )
        p.start()
        writer.close()
        procs.append(p)
        readers[rank] = reader
    results: dict[int, Any] = {}
    failures: list[RankFailure] = []
    deadline = time.monotonic() + timeout_s
    # Once a rank has failed, its peers get the communicator's timeout (plus slack) to fail in turn.
    grace_s = options["comm_timeout_s"] + 10.0 if grace_s is None else grace_s
    pending = set(range(world_size))
    try:
        while pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                if not failures:
                    raise TimeoutError(
                        f"run_processes: ranks {sorted(pending)} still running after "
                        f"{timeout_s:g}s; killed them (results so far: ranks {sorted(results)})"
                    )
                failures += [
                    RankFailure(r, "killed", f"still running {grace_s:g}s after another rank failed")
                    for r in sorted(pending)
                ]
                break
            ready = wait([readers[r] for r in pending] + [procs[r].sentinel for r in pending], timeout=remaining)
            for r in sorted(pending):
                if readers[r] in ready or procs[r].sentinel in ready:
                    had_failed = bool(failures)
                    _collect(r, readers[r], procs[r], results, failures)
                    pending.discard(r)
                    if failures and not had_failed:
                        deadline = min(deadline, time.monotonic() + grace_s)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
            p.join(timeout=10)
        del store
    if failures:
        raise ProcessFailure(sorted(failures, key=lambda f: f.rank), results)
    return [results[r] for r in range(world_size)]


def _collect(rank: int, reader: Connection, proc, results: dict[int, Any], failures: list[RankFailure]) -> None:
    try:
        msg = reader.recv() if reader.poll(timeout=5.0) else None
    except EOFError:
        msg = None
    if msg is None:
        proc.join(timeout=10)
        failures.append(
            RankFailure(
                rank, "exit", f"process exited with code {proc.exitcode} without a result", exitcode=proc.exitcode
            )
        )
    elif msg[0] == "ok":
        results[rank] = torch.load(io.BytesIO(msg[1]), weights_only=False)
    else:
        failures.append(RankFailure(rank, msg[1], msg[2], msg[3]))
