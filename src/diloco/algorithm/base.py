"""The interface every replica algorithm offers a training loop: data-parallel and (Streaming) DiLoCo alike.

A loop written against :class:`ReplicaAlgorithm` needs no ``isinstance``::

    loss.backward()
    reports = algo.before_optimizer_step()   # data-parallel: the gradients are averaged here
    inner.step(); inner.zero_grad()
    reports += algo.after_optimizer_step()   # DiLoCo: the syncs the schedule says start / finish here
    ...
    reports += algo.flush()                  # at the end: finish every exchange still in flight
    evaluate(algo.global_state_dict())       # the global (outer) parameters

Every hook returns the :class:`SyncReport` of each exchange it finished.
``state_dict`` / ``load_state_dict`` hold what the algorithm adds to the model
and inner optimizer (global copy, outer optimizer, counters, in-flight payloads).
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from diloco.comm.base import Communicator


@dataclass
class SyncReport:
    """What one finished sync did."""

    step: int
    fragment: int
    started_at: int
    numel: int
    bytes_sent: int
    bytes_received: int
    dropped_replicas: list[int] = field(default_factory=list)
    skipped: bool = False  # every replica's contribution was non-finite: global left unchanged
    guard: dict[str, Any] | None = None  # this replica's contribution guard dropped or clipped its outer gradient


def local_shard(t: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a parameter sharded by ``fully_shard`` (a DTensor), else ``t`` itself.

    A view of the shard's storage, taken afresh at every use (FSDP may re-point it at lazy init):
    with FSDP inside a worker, the global copy, the outer optimizer and the exchange (between the
    same-index ranks of the workers) all work on this rank's shard only.
    """
    to_local = getattr(t, "to_local", None)
    return to_local() if to_local is not None else t


def local_shards(params) -> list[torch.Tensor]:
    """Each tensor's local shard (see :func:`local_shard`)."""
    return [local_shard(p.detach()) for p in params]


def broadcast_parameters(model: nn.Module, comm: Communicator, src: int = 0) -> None:
    """Make every replica start from replica ``src``'s parameters and buffers (their local shards)."""
    tensors = local_shards(model.parameters()) + local_shards(model.buffers())
    comm.broadcast_(tensors, src=src)


class ReplicaAlgorithm(abc.ABC):
    """One replica's side of a distributed training method (see the module docstring)."""

    def before_optimizer_step(self) -> list[SyncReport]:
        """Between ``backward`` and the inner optimizer step (default: nothing)."""
        return []

    def after_optimizer_step(self) -> list[SyncReport]:
        """After every inner optimizer step (default: nothing)."""
        return []

    def step(self) -> list[SyncReport]:
        """Short for :meth:`after_optimizer_step`."""
        return self.after_optimizer_step()

    def flush(self) -> list[SyncReport]:
        """Finish every exchange still in flight (default: there are none)."""
        return []

    def finish(self) -> list[SyncReport]:
        """After the run's last step: finish every exchange still in flight (default: :meth:`flush`); a method
        whose peers keep waiting for it (a decoupled learner's syncer) also says it is done."""
        return self.flush()

    @abc.abstractmethod
    def global_state_dict(self) -> dict[str, torch.Tensor]:
        """The model's state dict with the global (outer) parameter values: what to evaluate."""

    @abc.abstractmethod
    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint needs beyond the model and inner optimizer."""

    @abc.abstractmethod
    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (every replica loads the same step)."""


__all__ = ["ReplicaAlgorithm", "SyncReport", "broadcast_parameters"]
