"""Replica functions run both ways: threads (``run_replicas``) and gloo processes (``run_processes``).

Module-level so that the child processes can import them; each returns plain
tensors and dicts (results travel back to the test through ``torch.save``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import time
from functools import partial

import torch
import torch.distributed as dist
from _tiny import batches, make_model

from diloco.algorithm.data_parallel import DataParallel
from diloco.algorithm.streaming import StreamingDiLoCo


@contextlib.contextmanager
def single_thread():
    """One intra-op thread, as in each gloo child: the in-process run then computes the same bits."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _outer(lr: float = 0.7):
    return partial(torch.optim.SGD, lr=lr, momentum=0.9, nesterov=True)


def streaming_replica(comm, cfg: dict) -> dict:
    """Train TinyNet with StreamingDiLoCo for ``cfg['steps']``; optionally poison one replica once."""
    model = make_model(seed=comm.rank)  # different inits on purpose: the algorithm must equalise them
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    algo = StreamingDiLoCo(
        model,
        comm=comm,
        sync_every=cfg["H"],
        num_fragments=cfg.get("P", 1),
        overlap_steps=cfg.get("tau", 0),
        merge_alpha=cfg.get("alpha", 0.0),
        codec=cfg.get("codec", "fp32"),
        outer_optimizer=_outer(),
    )
    reports = []
    for t, (x, y) in enumerate(batches(comm.rank, cfg["steps"], seed=cfg.get("seed", 0)), start=1):
        model(x, y)[1].backward()
        opt.step()
        opt.zero_grad()
        if cfg.get("poison") == (comm.rank, t):
            with torch.no_grad():
                model.blocks[0].fc.weight[0, 0] = float("nan")
        reports += algo.step()
    reports += algo.flush()
    return {
        "global": [g.detach().clone() for g in algo.global_flat],
        "local": [p.detach().clone() for p in model.parameters()],
        "stats": comm.stats.totals(),
        "reports": [dataclasses.asdict(r) for r in reports],
        "fragment_sizes": list(algo.fragment_sizes()),
    }


def data_parallel_replica(comm, cfg: dict) -> dict:
    model = make_model(seed=comm.rank)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    dp = DataParallel(model, comm=comm, codec=cfg.get("codec", "fp32"))
    reports = []
    for x, y in batches(comm.rank, cfg["steps"]):
        model(x, y)[1].backward()
        reports.append(dp.sync_gradients())
        opt.step()
        opt.zero_grad()
    return {
        "local": [p.detach().clone() for p in model.parameters()],
        "stats": comm.stats.totals(),
        "reports": [dataclasses.asdict(r) for r in reports],
        "numel": sum(p.numel() for p in model.parameters()),
    }


# -- 2 workers x 2 ranks ----------------------------------------------------------------------------------------------
def mesh_inner_optimizer(params):
    return torch.optim.SGD(params, lr=0.05, momentum=0.9)


def _mesh_algo(model, opt, comm, cfg):
    return StreamingDiLoCo(
        model,
        comm=comm,
        sync_every=cfg["H"],
        num_fragments=cfg["P"],
        overlap_steps=cfg["tau"],
        codec="fp32",
        outer_optimizer=_outer(),
    )


def mesh_rank(comm, cfg: dict) -> dict:
    """One rank of an M x R grid: DDP inside the worker, StreamingDiLoCo across workers."""
    from torch.nn.parallel import DistributedDataParallel

    from diloco.comm.mesh import build_layout

    layout = build_layout(cfg["workers"], cfg["ranks_per_worker"])
    rank = dist.get_rank()
    model = make_model(seed=rank)
    ddp = DistributedDataParallel(model, process_group=layout.intra_group)
    opt = mesh_inner_optimizer(model.parameters())
    wcomm = layout.communicator(timeout_s=60)
    algo = _mesh_algo(model, opt, wcomm, cfg)
    for x, y in batches(rank, cfg["steps"]):
        ddp(x, y)[1].backward()
        opt.step()
        opt.zero_grad()
        algo.step()
    algo.flush()
    return {
        "worker": layout.worker,
        "local_rank": layout.local_rank,
        "intra": dist.get_process_group_ranks(layout.intra_group),
        "cross": dist.get_process_group_ranks(layout.cross_group),
        "global": [g.detach().clone() for g in algo.global_flat],
        "local": [p.detach().clone() for p in model.parameters()],
        "stats": wcomm.stats.totals(),
        "cross_stats": wcomm.cross.stats.totals(),
        "intra_stats": wcomm.intra.stats.totals(),
        "fragment_sizes": list(algo.fragment_sizes()),
    }


def _train_mesh_reference(comm, cfg: dict):
    """The in-process twin of a worker: one replica whose batch is its R ranks' batches concatenated."""
    R = cfg["ranks_per_worker"]
    model = make_model(seed=comm.rank * R)
    opt = mesh_inner_optimizer(model.parameters())
    algo = _mesh_algo(model, opt, comm, cfg)
    shards = [batches(comm.rank * R + j, cfg["steps"]) for j in range(R)]
    for step in zip(*shards, strict=True):
        x = torch.cat([b[0] for b in step])
        y = torch.cat([b[1] for b in step])
        model(x, y)[1].backward()
        opt.step()
        opt.zero_grad()
        algo.step()
    algo.flush()
    return model, algo


def mesh_reference_replica(comm, cfg: dict) -> dict:
    """The in-process twin of a worker (see :func:`_train_mesh_reference`): flat global copies."""
    model, algo = _train_mesh_reference(comm, cfg)
    return {
        "global": [g.detach().clone() for g in algo.global_flat],
        "local": [p.detach().clone() for p in model.parameters()],
        "stats": comm.stats.totals(),
    }


# -- faults -------------------------------------------------------------------------------------------------------------
def dies_before_exchange(comm, cfg: dict) -> dict:
    """Rank ``cfg['victim']`` dies (``how`` = "exit" or "sigkill") or hangs ("hang") after step ``die_at``,
    just before that step's sync; the others re-raise the CommError they get with the step and time waited."""
    from diloco.comm.base import CommError

    model = make_model(seed=comm.rank)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    algo = StreamingDiLoCo(model, comm=comm, sync_every=cfg["H"], codec="fp32")
    for t, (x, y) in enumerate(batches(comm.rank, cfg["steps"]), start=1):
        model(x, y)[1].backward()
        opt.step()
        opt.zero_grad()
        if comm.rank == cfg["victim"] and t == cfg["die_at"]:
            if cfg["how"] == "hang":
                time.sleep(cfg["hang_s"])
            elif cfg["how"] == "sigkill":
                os.kill(os.getpid(), signal.SIGKILL)
            else:
                os._exit(17)  # no cleanup, no goodbye
        t0 = time.monotonic()
        try:
            algo.step()
        except CommError as exc:  # re-raised with what the test checks: the step and the time waited
            raise CommError(f"{exc} [step={t} waited_s={time.monotonic() - t0:.3f}]") from exc
    return {"steps": cfg["steps"]}


# -- the exchange itself ----------------------------------------------------------------------------------------------
def exchange_values(rank: int, numel: int, case: dict) -> torch.Tensor:
    """Replica ``rank``'s vector for one exchange case (reproducible in the test process)."""
    gen = torch.Generator().manual_seed(1000 * case.get("seed", 0) + rank)
    values = torch.randn(numel, generator=gen) * case.get("scale", 1.0)
    if rank in case.get("poison", ()):
        values[numel // 2] = float("inf") if rank % 2 else float("nan")
    return values


def exchange_cases(comm, cases: list[dict]) -> list[dict]:
    """Average one vector per case through ``comm.mean_async``; what every rank saw and counted."""
    from diloco.wire.registry import get_codec

    out = []
    for case in cases:
        codec = get_codec(case["codec"])
        comm.exchange = case.get("exchange")  # None: the default for this M
        if "pairwise" in case:  # gloo: M-1 rounds of isend/irecv (default) or one all_to_all_single
            comm.pairwise_all_to_all = case["pairwise"]
        before = dict(comm.stats.totals(), wire_sent=comm.stats.wire_sent, wire_received=comm.stats.wire_received)
        values = exchange_values(comm.rank, case["numel"], case)
        contribution = comm.encode(values, codec)
        work = comm.mean_async(contribution, codec=codec, numel=case["numel"], tag="test")
        mean, dropped = work.wait()
        after = dict(comm.stats.totals(), wire_sent=comm.stats.wire_sent, wire_received=comm.stats.wire_received)
        out.append(
            {
                "mean": mean,
                "dropped": dropped,
                "exchange": work.exchange,
                "link": (work.link_bytes.sent, work.link_bytes.received),
                "counted": {
                    k: after[k] - before[k] for k in ("bytes_sent", "bytes_received", "wire_sent", "wire_received")
                },
                "in_flight_after": comm.stats.in_flight,
            }
        )
    return out


def mesh_exchange_rank(comm, cfg: dict) -> dict:
    """One rank of an M x R grid: the worker's vector (the same on its R ranks) through the worker communicator."""
    from diloco.comm.mesh import build_layout

    layout = build_layout(cfg["workers"], cfg["ranks_per_worker"])
    wcomm = layout.communicator(timeout_s=60)
    out = exchange_cases(wcomm, cfg["cases"])  # exchange_values keyed by wcomm.rank = the worker index
    return {
        "worker": layout.worker,
        "cases": out,
        "cross": wcomm.cross.stats.totals(),
        "cross_wire": wcomm.cross.stats.wire_sent,
    }


# -- FSDP inside a worker ---------------------------------------------------------------------------------------------
def algorithm_state_bytes(algo) -> dict:
    """Bytes this rank holds for the global copy and for the outer optimizers' state (storage sizes)."""
    glob = sum(g.untyped_storage().nbytes() for g in algo.global_flat)
    outer = sum(
        v.untyped_storage().nbytes()
        for o in algo.outer_optimizers
        for st in o.state.values()
        for v in st.values()
        if isinstance(v, torch.Tensor) and v.dim() > 0
    )
    return {"global_bytes": glob, "outer_state_bytes": outer}


def fsdp_rank(comm, cfg: dict) -> dict:
    """One rank of an M x R grid: the worker's model ``fully_shard``'ed over its R ranks (FSDP2, gloo),
    StreamingDiLoCo on this rank's shards, exchanging with the same-index rank of every other worker."""
    from torch.distributed.fsdp import fully_shard

    from diloco.comm.mesh import build_layout

    layout = build_layout(cfg["workers"], cfg["ranks_per_worker"])
    R = layout.ranks_per_worker
    model = make_model(seed=layout.worker * R)  # every rank of a worker starts from the worker's model
    for block in model.blocks:
        fully_shard(block, mesh=layout.device_mesh["local"])
    fully_shard(model, mesh=layout.device_mesh["local"])
    opt = mesh_inner_optimizer(model.parameters())
    scomm = layout.shard_communicator(timeout_s=60)
    algo = _mesh_algo(model, opt, scomm, cfg)
    for x, y in batches(dist.get_rank(), cfg["steps"]):  # this rank's half of the worker's batch
        model(x, y)[1].backward()
        opt.step()
        opt.zero_grad()
        algo.step()
    algo.flush()
    glob = algo.global_state_dict()
    return {
        "worker": layout.worker,
        "local_rank": layout.local_rank,
        "global": {k: v.full_tensor() if hasattr(v, "full_tensor") else v for k, v in glob.items()},
        "local": {k: v.full_tensor() for k, v in model.state_dict().items()},
        "sharded": all(hasattr(p, "to_local") for p in model.parameters()),
        "memory": algorithm_state_bytes(algo),
        "stats": scomm.stats.totals(),
    }


def reference_state(comm, cfg: dict) -> dict:
    """``mesh_reference_replica`` with the states by name and the algorithm's memory."""
    model, algo = _train_mesh_reference(comm, cfg)
    return {
        "global": algo.global_state_dict(),
        "local": {k: v.clone() for k, v in model.state_dict().items()},
        "memory": algorithm_state_bytes(algo),
        "stats": comm.stats.totals(),
    }
