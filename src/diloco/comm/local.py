"""M replicas in one Python process: one thread per replica.

Why threads: each replica runs the *same* per-replica code it would run as its
own process under torch.distributed (its own model, optimizer and
:class:`~diloco.algorithm.streaming.StreamingDiLoCo`), and blocking ``wait()``
calls simply block that replica's thread until its peers catch up. PyTorch
releases the GIL inside its kernels, so two replicas really use two cores.

Collectives are matched by order, as in NCCL and gloo: the k-th collective a
replica issues meets the k-th collective of every other replica. A replica
that raises aborts the group, so its peers fail fast with :class:`CommError`
instead of hanging; a peer that never arrives makes ``wait()`` fail after
``timeout`` seconds, naming the missing ranks.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import torch

from diloco.comm.accounting import CommStats
from diloco.comm.base import CommError, Communicator, Work
from diloco.errors import ConfigError

T = TypeVar("T")


class _Slot:
    __slots__ = ("items", "arrived", "consumed")

    def __init__(self, world_size: int) -> None:
        self.items: list[Any] = [None] * world_size
        self.arrived = 0
        self.consumed = 0


class LocalGroup:
    """Shared state of ``world_size`` in-process replicas."""

    def __init__(self, world_size: int, *, timeout: float = 600.0) -> None:
        if world_size < 1:
            raise ConfigError(f"world_size must be >= 1, got {world_size}")
        self.world_size = world_size
        self.timeout = timeout
        self._cond = threading.Condition()
        self._slots: dict[int, _Slot] = {}
        self._aborted: BaseException | None = None
        self.communicators = [LocalCommunicator(self, r) for r in range(world_size)]

    def abort(self, reason: BaseException) -> None:
        with self._cond:
            if self._aborted is None:
                self._aborted = reason
            self._cond.notify_all()

    # -- matching ------------------------------------------------------------
    def _post(self, seq: int, rank: int, item: Any) -> None:
        with self._cond:
            slot = self._slots.setdefault(seq, _Slot(self.world_size))
            slot.items[rank] = item
            slot.arrived += 1
            if slot.arrived == self.world_size:
                self._cond.notify_all()

    def _ready(self, seq: int) -> bool:
        with self._cond:
            slot = self._slots.get(seq)
            return slot is not None and slot.arrived == self.world_size

    def _collect(self, seq: int, rank: int, what: str) -> list[Any]:
        deadline = time.monotonic() + self.timeout
        with self._cond:
            while True:
                if self._aborted is not None:
                    raise CommError(f"replica {rank}: group aborted while waiting for {what}: {self._aborted!r}")
                slot = self._slots[seq]
                if slot.arrived == self.world_size:
                    break
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    missing = [r for r, x in enumerate(slot.items) if x is None]
                    raise CommError(
                        f"replica {rank}: timed out after {self.timeout:.0f}s waiting for {what} "
                        f"(collective #{seq}); replicas {missing} never arrived"
                    )
                self._cond.wait(timeout=min(remaining, 1.0))
            items = list(slot.items)
            slot.consumed += 1
            if slot.consumed == self.world_size:
                del self._slots[seq]
            return items


class _LocalWork(Work):
    def __init__(self, group: LocalGroup, seq: int, rank: int, what: str, pick: Callable | None = None) -> None:
        self._group, self._seq, self._rank, self._what, self._pick = group, seq, rank, what, pick
        self._result: list[torch.Tensor] | None = None

    def wait(self) -> list[torch.Tensor]:
        if self._result is None:  # collected once: the slot is freed when every replica has
            items = self._group._collect(self._seq, self._rank, self._what)
            self._result = items if self._pick is None else self._pick(items)
        return self._result

    def is_completed(self) -> bool:
        return self._result is not None or self._group._ready(self._seq)


class LocalCommunicator(Communicator):
    """Replica ``rank``'s endpoint of a :class:`LocalGroup`."""

    def __init__(self, group: LocalGroup, rank: int) -> None:
        self.group = group
        self.rank = rank
        self.world_size = group.world_size
        self.stats = CommStats()
        self._seq = 0

    def _next_seq(self) -> int:
        seq = self._seq
        self._seq += 1
        return seq

    def _start_all_gather(self, payload: torch.Tensor, tag: str) -> Work:
        seq = self._next_seq()
        self.group._post(seq, self.rank, payload)
        return _LocalWork(self.group, seq, self.rank, f"all-gather {tag!r}")

    def _can_pipeline(self) -> bool:
        return True  # collectives are matched by their number

    def _reserve(self, what: str) -> int:
        return self._next_seq()

    def _start_all_to_all(
        self, chunks: Sequence[torch.Tensor], recv_sizes: Sequence[int], tag: str, seq: int | None = None
    ) -> Work:
        seq = self._next_seq() if seq is None else seq
        self.group._post(seq, self.rank, list(chunks))
        me = self.rank

        def pick(items: list[list[torch.Tensor]]) -> list[torch.Tensor]:
            out = [sent[me] for sent in items]  # replica j's chunk for this replica
            got = [c.numel() for c in out]
            if got != list(recv_sizes):
                raise CommError(
                    f"replica {me}: all-to-all {tag!r} expected chunks of {list(recv_sizes)} bytes, "
                    f"got {got}: the replicas disagree on the exchange"
                )
            return out

        return _LocalWork(self.group, seq, self.rank, f"all-to-all {tag!r}", pick)

    def broadcast_(self, tensors: Sequence[torch.Tensor], src: int = 0) -> None:
        seq = self._next_seq()
        self.group._post(seq, self.rank, [t.detach().clone() for t in tensors] if self.rank == src else ())
        items = self.group._collect(seq, self.rank, f"broadcast from replica {src}")
        if self.rank != src:
            with torch.no_grad():
                for dst, s in zip(tensors, items[src], strict=True):
                    dst.copy_(s)

    def barrier(self) -> None:
        seq = self._next_seq()
        self.group._post(seq, self.rank, True)
        self.group._collect(seq, self.rank, "barrier")


def run_replicas(fn: Callable[[LocalCommunicator], T], world_size: int, *, timeout: float = 600.0) -> list[T]:
    """Run ``fn(comm)`` for each of ``world_size`` replicas, one thread each; return results in rank order.

    If any replica raises, the group is aborted (peers stop with :class:`CommError`) and the first
    original exception is re-raised here.
    """
    group = LocalGroup(world_size, timeout=timeout)
    if world_size == 1:
        return [fn(group.communicators[0])]
    results: list[Any] = [None] * world_size
    errors: list[tuple[int, BaseException]] = []

    def target(rank: int) -> None:
        try:
            results[rank] = fn(group.communicators[rank])
        except BaseException as exc:
            errors.append((rank, exc))
            group.abort(exc)

    threads = [threading.Thread(target=target, args=(r,), name=f"replica-{r}") for r in range(world_size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        primary = [e for e in errors if not isinstance(e[1], CommError)] or errors
        raise primary[0][1]
    return results
