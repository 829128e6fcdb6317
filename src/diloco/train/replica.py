"""One replica of a training run: what it holds and how it is built.

:class:`Run` is what every replica of one run shares (data, validation batches, the
initial model, the clock); :class:`Replica` is one replica's (or one rank of a
worker's) training state, built by :func:`build_replica`: a copy of the initial model
(``fully_shard``'ed over the worker's ranks with ``worker_sharding = "fsdp"``), its
inner optimizer, its algorithm (:func:`build_algorithm`) and its data sampler.
:class:`Everyone` is the barrier over every process of the run. The trainer
(:mod:`diloco.train.trainer`) runs the replicas; their checkpoints are
:mod:`diloco.train.replica_checkpoint`.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch

from diloco.algorithm.base import ReplicaAlgorithm
from diloco.algorithm.data_parallel import DataParallel
from diloco.algorithm.inner import build_inner_optimizer
from diloco.algorithm.streaming import StreamingDiLoCo
from diloco.comm.base import Communicator
from diloco.methods import SYNCHRONOUS_METHODS
from diloco.train.config import TrainConfig
from diloco.train.sharding import shard_worker_model, worker_group
from diloco.train.speed import compile_in_place


@dataclass
class Run:
    """What every replica of one run shares: data, validation batches, the initial model, the clock."""

    data: Any  # diloco.data.TokenData
    val: list[tuple[torch.Tensor, torch.Tensor]]
    template: torch.nn.Module  # built once and seeded; every replica starts from a copy
    fragments: list[list[str]] | None  # explicit fragments (cfg.fragments), or None: the fragmenter's split
    start_step: int
    wall_before: float  # wall time of the run before this resume
    t0: float  # perf_counter when this process started the run
    threads: int | None = None  # torch intra-op threads per replica (in-process runs), kept across resumes
    data_sha256: str | None = None  # TokenData.digest(): kept in every checkpoint, checked on resume
    saved_replicas: int | None = None  # M of the checkpoint resumed from (differs after an elastic restart)
    saved_ranks: int | None = None  # R of the checkpoint resumed from (an FSDP run may resume with another)
    vocab_size: int | None = None  # the data's: the model's embedding rows (kept in checkpoints, for diloco export)
    offset: int = 0  # the run's number of this job's first replica (a decoupled site job runs learner `offset` alone)

    def wall_time(self) -> float:
        return time.perf_counter() - self.t0 + self.wall_before


@dataclass
class Replica:
    """One replica's (or one rank of a worker's) training state."""

    comm: Communicator
    intra: Communicator | None  # the worker's R ranks (torchrun, ranks_per_worker > 1), else None
    model: torch.nn.Module
    eval_model: torch.nn.Module | None  # only where this replica evaluates
    opt: torch.optim.Optimizer
    algo: ReplicaAlgorithm
    in_worker: DataParallel | None  # gradient average over the worker's ranks
    sampler: Any  # diloco.data.ShardSampler
    rows: slice  # the rows of each replica batch this rank computes
    params: list[torch.nn.Parameter]
    mesh: Any = None  # the worker's DeviceMesh when its model is fully_shard'ed over its ranks (fsdp), else None
    saved_ranks: int = 1  # R of the checkpoint this replica resumes from
    async_group: Any = None  # checkpoint_async: the worker's ranks, for the background checkpoint writes only
    writing: tuple[int, Any, dict[str, Any]] | None = None  # checkpoint_async: (step, Future, record) not committed
    dropped: int = 0
    compiled: bool = False  # the compiled model has run once (its compilation is behind us)
    train_time: float = 0.0

    @property
    def rank(self) -> int:
        return self.comm.rank

    index: int = 0  # this replica's number in the run (its data shard; a decoupled learner's number)

    @property
    def local(self) -> int:
        """This process's rank inside its worker (0 without workers)."""
        return 0 if self.intra is None else self.intra.rank

    @property
    def evaluates(self) -> bool:
        return self.rank == 0 and self.local == 0

    @property
    def sharded(self) -> bool:
        return self.mesh is not None

    def barrier(self) -> None:
        """Every process of the run (``comm`` alone spans only this rank's column when the workers are sharded)."""
        Everyone(self.comm, self.intra if self.sharded else None).barrier()


class Everyone:
    """A barrier over every process: ``comm``'s, then (sharded workers, whose ``comm`` is one column) ``intra``'s."""

    def __init__(self, comm: Communicator, intra: Communicator | None) -> None:
        self.comm, self.intra = comm, intra

    def barrier(self) -> None:
        self.comm.barrier()
        if self.intra is not None:
            self.intra.barrier()


def build_replica(
    cfg: TrainConfig,
    comm: Communicator,
    intra: Communicator | None,
    run: Run,
    *,
    device: torch.device,
    mesh: Any = None,
    session: Any = None,
) -> Replica:
    """This replica's model, inner optimizer, algorithm and data sampler (the algorithm equalises inits).

    ``mesh``: the worker's DeviceMesh (sharded workers); ``session``: the method's running service, if it has
    one (:class:`~diloco.train.runtime.Session`; it builds the algorithm).
    """
    from diloco.data import ShardSampler

    local = 0 if intra is None else intra.rank
    model = copy.deepcopy(run.template).to(device)
    eval_model = copy.deepcopy(model) if comm.rank == 0 and local == 0 else None
    async_group = None
    if mesh is not None:  # the worker's ranks shard one model (every rank built the same seeded template)
        shard_worker_model(model, mesh, mixed_precision=cfg.fsdp_mixed_precision)
        if cfg.checkpoint_async:
            async_group = worker_group(mesh, num_workers=cfg.replicas, ranks_per_worker=cfg.ranks_per_worker)
    if cfg.compile:  # in place: parameter names (fragments, checkpoints, global state) stay the same
        compile_in_place(model)
    opt = build_inner_optimizer(
        model, name=cfg.inner_optimizer, lr=cfg.inner_lr, betas=(cfg.beta1, cfg.beta2), weight_decay=cfg.weight_decay
    )
    index = run.offset + comm.rank  # this replica's number in the run: its shard of the data
    algo = (
        session.algorithm(cfg, model, comm, learner=index, fragments=run.fragments)
        if session is not None
        else build_algorithm(cfg, model, comm, fragments=run.fragments)
    )
    # Inside a worker of R replicated ranks: gradients averaged every step (fp32, exact up to the summation
    # order). Sharded workers: FSDP's reduce-scatter averages them.
    in_worker = DataParallel(model, comm=intra, codec="fp32") if intra is not None and mesh is None else None
    # The replica's sampler on every rank of the worker; rank `local` computes `rows` of each batch.
    sampler = ShardSampler(
        run.data.train,
        rank=index,
        world_size=cfg.replicas,
        batch_size=cfg.batch_per_replica,
        seq_len=cfg.seq_len,
        seed=cfg.seed,
    )
    rows = slice(local * cfg.batch_per_rank, (local + 1) * cfg.batch_per_rank)
    params = [p for p in model.parameters() if p.requires_grad]
    return Replica(
        comm=comm,
        intra=intra,
        model=model,
        eval_model=eval_model,
        opt=opt,
        algo=algo,
        in_worker=in_worker,
        sampler=sampler,
        rows=rows,
        params=params,
        mesh=mesh,
        async_group=async_group,
        index=index,
    )


def build_algorithm(
    cfg: TrainConfig,
    model: torch.nn.Module,
    comm: Communicator,
    *,
    fragments: list[list[str]] | None = None,
) -> ReplicaAlgorithm:
    """The config's synchronous method on this replica: data parallel or (Streaming) DiLoCo. (A method with a
    service of its own builds its replicas' algorithms through its session, :mod:`diloco.train.runtime`.)"""
    assert cfg.method in SYNCHRONOUS_METHODS, f"method {cfg.method!r} builds its algorithm in its session"
    if cfg.method == "dp":
        return DataParallel(model, comm=comm, codec=cfg.dp_codec)
    return StreamingDiLoCo(
        model,
        comm=comm,
        sync_every=cfg.sync_every,
        num_fragments=cfg.num_fragments,
        fragment_pattern=cfg.fragment_pattern,
        fragments=fragments,
        schedule=cfg.schedule_spec,
        overlap_steps=cfg.overlap_steps,
        merge_alpha=cfg.merge_alpha,
        codec=cfg.make_codec(),
        eager=cfg.eager,
        error_feedback_decay=cfg.ef_decay,
        guard=cfg.guard,
        guard_ratio=cfg.guard_ratio,
        outer_optimizer=partial(
            torch.optim.SGD,
            lr=cfg.outer_lr,
            momentum=cfg.outer_momentum,
            nesterov=cfg.outer_nesterov and cfg.outer_momentum > 0,
        ),
    )


__all__ = ["Everyone", "Replica", "Run", "build_algorithm", "build_replica"]
