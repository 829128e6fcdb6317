"""The communicator interface every backend implements.

The algorithm needs three things from the replicas' network:

* ``all_gather_async(payload)``: every replica contributes one encoded byte
  buffer of the same size; the returned :class:`Work` handle, once waited on,
  gives all replicas' buffers in rank order. Each replica then decodes and sums
  them in FP32 *in rank order*, so every replica computes bit-identical averages
  whatever the wire format. (A quantized all-reduce cannot be summed in the
  quantized domain without losing the FP32 sum the paper asks for; all-gather
  of packed bytes keeps the sum exact and the payload small.)
* ``broadcast_(tensors, src)``: used once at start-up so that all replicas start
  from identical parameters.
* ``barrier()``: used by the trainer around checkpoints.

Byte accounting is the same for every backend (see :mod:`diloco.comm.accounting`):
``bytes_sent`` is the payload this replica contributes, ``bytes_received`` the
payloads of the M-1 others. How many bytes a given collective *algorithm* moves
on the physical links (ring, tree, ...) is a property of the backend, documented
there; the logical counts here are what the codec produced.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence

import torch

from diloco.comm.accounting import CommStats, exchanged_bytes


class CommError(RuntimeError):
    """A collective failed: a peer died, hung past the timeout, or the group was aborted."""


class Work(abc.ABC):
    """Handle of an asynchronous collective."""

    @abc.abstractmethod
    def wait(self) -> list[torch.Tensor]:
        """Block until the collective completes; return every replica's payload, in rank order."""

    @abc.abstractmethod
    def is_completed(self) -> bool:
        """True when :meth:`wait` would not block."""


class Communicator(abc.ABC):
    """One replica's endpoint in a group of ``world_size`` replicas."""

    rank: int
    world_size: int
    stats: CommStats

    @abc.abstractmethod
    def _start_all_gather(self, payload: torch.Tensor, tag: str) -> Work:
        """Backend hook: start gathering a 1-D uint8 ``payload`` from every replica."""

    @abc.abstractmethod
    def broadcast_(self, tensors: Sequence[torch.Tensor], src: int = 0) -> None:
        """Overwrite ``tensors`` in place with those of replica ``src`` (blocking)."""

    @abc.abstractmethod
    def barrier(self) -> None:
        """Block until every replica reaches this point."""

    def all_gather_async(self, payload: torch.Tensor, *, tag: str = "") -> Work:
        """Start gathering ``payload`` (1-D uint8, same size on every replica) from all replicas.

        ``tag`` labels the exchange in the byte accounting (e.g. ``"fragment 3"``).
        """
        if payload.dtype != torch.uint8 or payload.dim() != 1:
            raise TypeError(f"payload must be a 1-D uint8 tensor, got {payload.dtype} with shape {tuple(payload.shape)}")
        sent, received = exchanged_bytes(payload.numel(), self.world_size)
        handle = self.stats.start(tag, sent=sent, received=received)
        work = self._start_all_gather(payload, tag)
        return _AccountedWork(work, self.stats, handle)

    def close(self) -> None:
        """Release backend resources (no-op by default)."""


class _AccountedWork(Work):
    """Marks the exchange finished in the accounting when it is waited on."""

    def __init__(self, inner: Work, stats: CommStats, handle: int) -> None:
        self._inner, self._stats, self._handle = inner, stats, handle
        self._result: list[torch.Tensor] | None = None

    def wait(self) -> list[torch.Tensor]:
        if self._result is None:
            self._result = self._inner.wait()
            self._stats.finish(self._handle)
        return self._result

    def is_completed(self) -> bool:
        return self._result is not None or self._inner.is_completed()
