"""Workers of several ranks: the 2-D layout (DiLoCo workers x data-parallel ranks inside a worker).

A DiLoCo *worker* (replica) may itself be R processes training one model copy
with data parallelism (DDP): gradients are averaged inside the worker every
step over its fast links; outer gradients cross between workers only every H
steps (one fragment every ~H/P steps), over the slow link. With M workers of R
ranks, global rank ``g = worker * R + local_rank`` (torchrun's node-major
order: one worker per node with ``--nproc-per-node R``)::

                 local 0   local 1          intra group  = a row    (DDP, every step)
    worker 0:     g=0       g=1             cross group  = a column (outer gradients)
    worker 1:     g=2       g=3

    layout = build_layout(num_workers=2, ranks_per_worker=2)
    ddp = DistributedDataParallel(model, process_group=layout.intra_group)
    algo = StreamingDiLoCo(model, comm=layout.communicator(timeout_s=300), ...)

Which ranks exchange the outer gradients. After DDP every rank of a worker holds
the same parameters, so each rank computes the same payload of n bytes. Three
ways to exchange it across workers:

(a) every local rank all-gathers its whole copy in its column: R (M-1) n bytes
    per worker cross the slow link, R times more than needed;
(b) only local rank 0 exchanges, then broadcasts the M payloads in the worker:
    (M-1) n bytes per worker on the slow link, all through one rank (one NIC);
(c) **chosen**: local rank l exchanges only byte-shard l (n/R bytes) of the payload
    in its column, then the worker all-gathers the shards internally: the same
    (M-1) n bytes per worker on the slow link as (b), but split over R ranks (R
    NICs, R parallel streams), plus (R-1) M n/R bytes per rank on the fast
    intra-worker link. Every rank ends with all M full payloads, bit-identical to
    a one-rank-per-worker all-gather, so the algorithm runs unchanged.

The intra-worker stage runs in ``wait()`` (program order, so every rank issues
the intra collectives in the same order): with overlap (tau >= 1) only the
slow cross-worker stage overlaps with compute, the fast stage does not.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from diloco.comm.accounting import CommStats
from diloco.comm.base import Communicator, Work
from diloco.comm.torch_dist import TorchDistCommunicator
from diloco.errors import ConfigError


@dataclass(frozen=True)
class Layout:
    """This rank's place in the M x R grid and the two process groups it belongs to."""

    num_workers: int
    ranks_per_worker: int
    worker: int
    local_rank: int
    intra_group: dist.ProcessGroup
    cross_group: dist.ProcessGroup
    #: The (worker, local) DeviceMesh; ``device_mesh["local"]`` is the mesh to ``fully_shard`` a worker's model on.
    device_mesh: Any = None

    def communicator(self, *, timeout_s: float) -> WorkerCommunicator:
        """The communicator DiLoCo uses across workers of replicated ranks (rank = worker index, world size = M)."""
        return WorkerCommunicator(self, timeout_s=timeout_s)

    def shard_communicator(self, *, timeout_s: float) -> TorchDistCommunicator:
        """The communicator across workers whose ranks hold *shards* (FSDP inside a worker).

        This rank's column: the ranks with the same local index in every worker, which hold the same
        shard of the parameters. Each exchanges its own shard only; no intra-worker stage.
        """
        return TorchDistCommunicator(self.cross_group, timeout_s=timeout_s)


def build_layout(num_workers: int, ranks_per_worker: int, *, device_type: str | None = None) -> Layout:
    """Split the initialised default group into M workers of R consecutive ranks.

    Uses ``torch.distributed.device_mesh.init_device_mesh`` (works on gloo/CPU in torch 2.13):
    mesh dim ``"local"`` gives the intra-worker group, dim ``"worker"`` the cross-worker group.
    ``device_type`` defaults to ``"cuda"`` for nccl and ``"cpu"`` otherwise.
    """
    from torch.distributed.device_mesh import init_device_mesh

    if not dist.is_initialized():
        raise ConfigError(
            "torch.distributed is not initialized: call init_process_group (or "
            "diloco.distributed.init_from_env under torchrun) before build_layout"
        )
    if num_workers < 1 or ranks_per_worker < 1:
        raise ConfigError(f"num_workers and ranks_per_worker must be >= 1, got {num_workers} x {ranks_per_worker}")
    world = dist.get_world_size()
    if num_workers * ranks_per_worker != world:
        hint = f"; e.g. ranks_per_worker={world // num_workers}" if world % num_workers == 0 else ""
        raise ConfigError(
            f"num_workers x ranks_per_worker = {num_workers} x {ranks_per_worker} must equal "
            f"the world size {world}{hint}"
        )
    if device_type is None:
        device_type = "cuda" if str(dist.get_backend()).lower() == "nccl" else "cpu"
    mesh = init_device_mesh(device_type, (num_workers, ranks_per_worker), mesh_dim_names=("worker", "local"))
    rank = dist.get_rank()
    return Layout(
        num_workers,
        ranks_per_worker,
        worker=rank // ranks_per_worker,
        local_rank=rank % ranks_per_worker,
        intra_group=mesh.get_group("local"),
        cross_group=mesh.get_group("worker"),
        device_mesh=mesh,
    )


class _ShardedWork(Work):
    """Stage 1 (slow link, asynchronous): my shard of every worker's payload. Stage 2 (in wait): the rest."""

    def __init__(self, comm: WorkerCommunicator, cross: Work, numel: int, shard: int, tag: str) -> None:
        self._comm, self._cross, self._numel, self._shard, self._tag = comm, cross, numel, shard, tag
        self._result: list[torch.Tensor] | None = None

    def wait(self) -> list[torch.Tensor]:
        if self._result is None:
            mine = self._cross.wait()  # M shards (one per worker), all with my shard index
            M, s = len(mine), self._shard
            if self._comm.layout.ranks_per_worker == 1:
                self._result = [m[: self._numel] for m in mine]
            else:
                rows = self._comm.intra.all_gather_async(torch.cat(mine), tag=self._tag).wait()
                grid = torch.stack([r.view(M, s) for r in rows], dim=1)  # [worker, shard index, bytes]
                self._result = [grid[w].reshape(-1)[: self._numel] for w in range(M)]
        return self._result

    def is_completed(self) -> bool:
        # What remains after the cross-worker stage is one all-gather on the fast intra-worker link.
        return self._result is not None or self._cross.is_completed()


class _ShardedAllToAllWork(Work):
    """As :class:`_ShardedWork` for an all-to-all: byte-piece l of every chunk crosses in column l."""

    def __init__(
        self, comm: WorkerCommunicator, cross: Work, recv_sizes: list[int], piece: list[int], tag: str
    ) -> None:
        self._comm, self._cross, self._recv, self._piece, self._tag = comm, cross, recv_sizes, piece, tag
        self._result: list[torch.Tensor] | None = None

    def wait(self) -> list[torch.Tensor]:
        if self._result is None:
            mine = self._cross.wait()  # piece l of the chunk every worker sent to this worker
            R = self._comm.layout.ranks_per_worker
            if R == 1:
                self._result = [m[:n] for m, n in zip(mine, self._recv, strict=True)]
            else:
                rows = self._comm.intra.all_gather_async(torch.cat(mine), tag=self._tag).wait()
                by_rank = [r.split(self._piece) for r in rows]  # [local rank][worker] -> piece
                self._result = [torch.cat([by_rank[r][w] for r in range(R)])[:n] for w, n in enumerate(self._recv)]
        return self._result

    def is_completed(self) -> bool:
        return self._result is not None or self._cross.is_completed()


class WorkerCommunicator(Communicator):
    """Replica ``layout.worker`` of ``layout.num_workers``: DiLoCo's communicator across workers of R ranks.

    Byte accounting in ``stats`` is per worker, as for every backend (what crosses the worker's
    slow link, from :mod:`diloco.traffic`), so it compares directly with the in-process run. What
    the ranks really move is counted by the two inner communicators: ``cross.stats`` /
    ``cross.stats.wire_*`` (this rank's byte-pieces over the slow link) and ``intra.stats`` (the fast
    intra-worker stage). Both exchanges work: the all-to-all of the reduce-scatter exchange is cut
    into byte-pieces per local rank exactly like the all-gather.
    """

    def __init__(self, layout: Layout, *, timeout_s: float) -> None:
        self.layout = layout
        self.rank, self.world_size = layout.worker, layout.num_workers
        self.stats = CommStats()
        self.cross = TorchDistCommunicator(layout.cross_group, timeout_s=timeout_s)
        self.intra = TorchDistCommunicator(layout.intra_group, timeout_s=timeout_s)

    def _start_all_gather(self, payload: torch.Tensor, tag: str) -> Work:
        R, n = self.layout.ranks_per_worker, payload.numel()
        shard = -(-n // R)  # ceil: the last shard is zero-padded, every rank sends the same size
        padded = payload.new_zeros(R * shard)
        padded[:n] = payload
        mine = padded[self.layout.local_rank * shard : (self.layout.local_rank + 1) * shard]
        cross = self.cross.all_gather_async(mine, tag=f"{tag} shard {self.layout.local_rank}/{R}")
        return _ShardedWork(self, cross, n, shard, tag)

    def _start_all_to_all(
        self, chunks: Sequence[torch.Tensor], recv_sizes: Sequence[int], tag: str, seq: int | None = None
    ) -> Work:
        assert seq is None, "workers of several ranks never pipeline (their intra stage is order-matched)"
        R, lr = self.layout.ranks_per_worker, self.layout.local_rank
        pieces = []
        for c in chunks:
            k = -(-c.numel() // R)  # ceil, zero-padded: every local rank sends pieces of the same size
            padded = c.new_zeros(R * k)
            padded[: c.numel()] = c
            pieces.append(padded[lr * k : (lr + 1) * k])
        piece = [-(-n // R) for n in recv_sizes]
        cross = self.cross._all_to_all(pieces, piece, f"{tag} piece {lr}/{R}")
        return _ShardedAllToAllWork(self, cross, list(recv_sizes), piece, tag)

    def broadcast_(self, tensors: Sequence[torch.Tensor], src: int = 0) -> None:
        """Worker ``src``'s values everywhere: across workers per column, then from local rank 0 in each row."""
        self.cross.broadcast_(tensors, src=src)
        self.intra.broadcast_(tensors, src=0)

    def barrier(self) -> None:
        # After the column barrier, a row barrier can only pass once every column's has: a full barrier.
        self.cross.barrier()
        self.intra.barrier()
