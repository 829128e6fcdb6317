"""The communicator interface every backend implements.

The algorithm needs three things from the replicas' network:

* ``mean_async(contribution)``: the FP32 mean over replicas of one vector (an
  outer gradient, a step's gradients), whose encoded contribution
  ``encode(values, codec)`` made. Two exchanges (:mod:`diloco.comm.exchange`,
  bytes in :mod:`diloco.traffic`): for M <= 2 an all-gather of the encoded
  payloads, each replica decoding and summing all M in FP32 in rank order; for
  M >= 3 a reduce-scatter at the bandwidth limit of an all-reduce (all-to-all of
  encoded shards, each shard's owner sums its shard in FP32 in rank order and
  encodes the mean, all-gather of the means). Either way every replica ends with
  the same bits, and non-finite contributions are dropped and reported.
  ``exchange`` (an attribute, default :func:`diloco.traffic.default_exchange`)
  picks one by name, e.g. to compare them.
* ``broadcast_(tensors, src)``: used once at start-up so that all replicas start
  from identical parameters.
* ``barrier()``: used by the trainer around checkpoints.

``all_gather_async(payload)`` (every replica's byte buffer, in rank order) is
public too: the mesh's intra-worker stage and the link benchmark's probe use it.

Byte accounting is the same for every backend (see :mod:`diloco.comm.accounting`):
``bytes_sent`` / ``bytes_received`` are what crosses this replica's link each
way, from the traffic function; ``wire_sent`` / ``wire_received`` what the
backend's collectives were really handed, for checking one against the other.

Backends implement two collectives on 1-D uint8 tensors: ``_start_all_gather``
(same size everywhere) and ``_start_all_to_all`` (piece ``j`` to replica ``j``,
sizes given).
"""

from __future__ import annotations

import abc
import threading
from collections.abc import Sequence

import torch

from diloco.comm.accounting import CommStats
from diloco.comm.exchange import chunk_bytes, decode_contribution, encode_contribution, link_bytes, resolve_exchange
from diloco.errors import ConfigError, RunError
from diloco.traffic import LinkBytes, all_gather_bytes, check_exchange, default_exchange, shard_sizes
from diloco.wire.average import average_payloads
from diloco.wire.codec import Codec


class CommError(RunError):
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
    _exchange: str | None = None

    @abc.abstractmethod
    def _start_all_gather(self, payload: torch.Tensor, tag: str) -> Work:
        """Backend hook: start gathering a 1-D uint8 ``payload`` from every replica."""

    @abc.abstractmethod
    def _start_all_to_all(
        self, chunks: Sequence[torch.Tensor], recv_sizes: Sequence[int], tag: str, seq: int | None = None
    ) -> Work:
        """Backend hook: send 1-D uint8 ``chunks[j]`` to replica ``j``; ``wait()`` gives the chunk each
        replica ``j`` sent here (``recv_sizes[j]`` bytes), in rank order (``chunks[rank]`` for this one).

        ``seq``: a collective number :meth:`_reserve` gave earlier (only where :meth:`_can_pipeline`)."""

    def _can_pipeline(self) -> bool:
        """Whether an all-to-all may be issued from a helper thread with a number reserved in program
        order (it is matched by that number, not by the order in which ranks issue it)."""
        return False

    def _reserve(self, what: str) -> int:
        """Reserve the next collective number, in program order (see :meth:`_can_pipeline`)."""
        raise NotImplementedError

    @abc.abstractmethod
    def broadcast_(self, tensors: Sequence[torch.Tensor], src: int = 0) -> None:
        """Overwrite ``tensors`` in place with those of replica ``src`` (blocking)."""

    @abc.abstractmethod
    def barrier(self) -> None:
        """Block until every replica reaches this point."""

    # -- which exchange -------------------------------------------------------
    @property
    def exchange(self) -> str:
        """The exchange :meth:`mean_async` runs (``"all_gather"`` or ``"reduce_scatter"``)."""
        return self._exchange if self._exchange is not None else default_exchange(self.world_size)

    @exchange.setter
    def exchange(self, name: str | None) -> None:
        self._exchange = None if name is None else check_exchange(name)

    def exchange_for(self, numel: int, codec: Codec | None = None) -> str:
        """The exchange really run for ``numel`` values (all-gather for M <= 2, numel < M or a sparse codec)."""
        return resolve_exchange(self.exchange, num_replicas=self.world_size, numel=numel, codec=codec)

    # -- public collectives -----------------------------------------------------
    def all_gather_async(self, payload: torch.Tensor, *, tag: str = "") -> Work:
        """Start gathering ``payload`` (1-D uint8, same size on every replica) from all replicas.

        ``tag`` labels the exchange in the byte accounting (e.g. ``"fragment 3"``).
        """
        _check_bytes(payload, "payload")
        lb = all_gather_bytes(payload.numel(), self.world_size)
        handle = self.stats.start(tag, sent=lb.sent, received=lb.received)
        work = self._all_gather(payload, tag)
        return _AccountedWork(work, self.stats, handle)

    def encode(self, values: torch.Tensor, codec: Codec) -> torch.Tensor:
        """This replica's encoded contribution of 1-D FP32 ``values`` to :meth:`mean_async`."""
        return encode_contribution(
            values, codec, num_replicas=self.world_size, exchange=self.exchange_for(values.numel(), codec)
        )

    def decode_own(self, contribution: torch.Tensor, *, codec: Codec, numel: int) -> torch.Tensor:
        """This replica's contribution (from :meth:`encode`) decoded to FP32: what its peers receive from it."""
        return decode_contribution(
            contribution, codec, numel=numel, num_replicas=self.world_size, exchange=self.exchange_for(numel, codec)
        )

    def mean_async(self, contribution: torch.Tensor, *, codec: Codec, numel: int, tag: str = "") -> MeanWork:
        """Start averaging ``contribution`` (from :meth:`encode`, ``numel`` values) over the replicas.

        ``wait()`` returns ``(mean, dropped)``: the FP32 mean on the contribution's device (``None``
        when every contribution was non-finite) and the ranks whose contribution was dropped.
        """
        _check_bytes(contribution, "contribution")
        exchange = self.exchange_for(numel, codec)
        sizes = chunk_bytes(codec, numel=numel, num_replicas=self.world_size, exchange=exchange)
        if contribution.numel() != sum(sizes):
            raise ConfigError(
                f"contribution of {contribution.numel()} bytes, but {exchange} of {numel} values "
                f"with {codec.name} among {self.world_size} replicas takes {sum(sizes)}: encode it "
                f"with this communicator's encode() (same codec, same exchange)"
            )
        lb = link_bytes(codec, numel=numel, num_replicas=self.world_size, exchange=exchange, rank=self.rank)
        handle = self.stats.start(tag, sent=lb.sent, received=lb.received)
        if exchange == "all_gather":
            return MeanWork(self, handle, lb, codec, numel, tag, gather=self._all_gather(contribution, tag))
        recv = [sizes[self.rank]] * self.world_size
        first = self._all_to_all(list(contribution.split(sizes)), recv, f"{tag} shards")
        means_seq = None
        if self._can_pipeline():  # the means' all-gather will start on a helper thread: number it now
            means_seq = self._reserve(f"all-to-all {tag + ' means'!r}")
            others = self.world_size - 1
            self.stats.wire(sent=sizes[self.rank] * others, received=sum(sizes) - sizes[self.rank])
        return MeanWork(self, handle, lb, codec, numel, tag, shards=first, sizes=sizes, means_seq=means_seq)

    def close(self) -> None:
        """Release backend resources (no-op by default)."""

    # -- hooks, with the bytes they really move ---------------------------------
    def _all_gather(self, payload: torch.Tensor, tag: str) -> Work:
        others = self.world_size - 1
        self.stats.wire(sent=payload.numel() * others, received=payload.numel() * others)
        return self._start_all_gather(payload, tag)

    def _all_to_all(self, chunks: Sequence[torch.Tensor], recv_sizes: Sequence[int], tag: str) -> Work:
        assert len(chunks) == len(recv_sizes) == self.world_size
        self.stats.wire(
            sent=sum(c.numel() for j, c in enumerate(chunks) if j != self.rank),
            received=sum(s for j, s in enumerate(recv_sizes) if j != self.rank),
        )
        return self._start_all_to_all(chunks, recv_sizes, tag)


def _check_bytes(t: torch.Tensor, what: str) -> None:
    if t.dtype != torch.uint8 or t.dim() != 1:
        raise TypeError(f"{what} must be a 1-D uint8 tensor, got {t.dtype} with shape {tuple(t.shape)}")


class MeanWork:
    """Handle of :meth:`Communicator.mean_async`; ``wait()`` -> ``(mean or None, dropped ranks)``.

    All-gather: one collective, started at once. Reduce-scatter: the all-to-all of
    shards starts at once (it overlaps with whatever the caller computes until
    ``wait``). The owner's sum, the encoding of the mean and the all-gather of the
    means follow on a helper thread as soon as the shards are in, where the backend
    matches collectives by a number reserved at the start (in-process; gloo with
    pairwise all-to-alls), so the whole exchange overlaps with compute; elsewhere
    (nccl, workers of several ranks) they run inside ``wait()``, in program order, so
    every replica issues its collectives in the same order.
    """

    def __init__(
        self,
        comm: Communicator,
        handle: int,
        link: LinkBytes,
        codec: Codec,
        numel: int,
        tag: str,
        *,
        gather: Work | None = None,
        shards: Work | None = None,
        sizes: list[int] | None = None,
        means_seq: int | None = None,
    ) -> None:
        self._comm, self._handle, self._codec, self._numel, self._tag = comm, handle, codec, numel, tag
        #: Bytes this exchange moves over this replica's link (the traffic function), each way.
        self.link_bytes = link
        self._gather, self._shards, self._sizes = gather, shards, sizes
        self._result: tuple[torch.Tensor | None, list[int]] | None = None
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        if means_seq is not None:
            self._thread = threading.Thread(
                target=self._pipeline, args=(means_seq,), daemon=True, name=f"diloco-mean-{means_seq}"
            )
            self._thread.start()

    def _pipeline(self, means_seq: int) -> None:
        try:
            self._result = self._reduce(means_seq)
        except BaseException as exc:
            self._error = exc

    @property
    def exchange(self) -> str:
        return "all_gather" if self._gather is not None else "reduce_scatter"

    def is_completed(self) -> bool:
        """True when ``wait`` would not block (on the all-to-all of shards, where the rest runs in ``wait``)."""
        if self._thread is not None:
            return not self._thread.is_alive()
        first = self._gather if self._gather is not None else self._shards
        return self._result is not None or first.is_completed()

    def wait(self) -> tuple[torch.Tensor | None, list[int]]:
        if self._thread is not None:
            self._thread.join()  # bounded: each collective inside has the communicator's timeout
            self._thread = None
            if self._error is None:
                self._comm.stats.finish(self._handle)
        if self._error is not None:
            raise self._error
        if self._result is None:
            self._result = self._reduce(None)
            self._comm.stats.finish(self._handle)
        return self._result

    def _reduce(self, means_seq: int | None) -> tuple[torch.Tensor | None, list[int]]:
        comm, codec = self._comm, self._codec
        if self._gather is not None:
            return average_payloads(self._gather.wait(), codec, self._numel)
        M, me = comm.world_size, comm.rank
        counts = shard_sizes(self._numel, M)
        shards = self._shards.wait()
        mine, dropped = average_payloads(shards, codec, counts[me])
        if mine is None:  # every replica dropped (all agree): send a defined placeholder
            mine = torch.full((counts[me],), float("nan"), device=shards[me].device)
        encoded = codec.encode(mine)
        what = f"{self._tag} means"
        if means_seq is None:
            means = comm._all_to_all([encoded] * M, self._sizes, what).wait()
        else:  # numbered at the start; its bytes were counted there
            means = comm._start_all_to_all([encoded] * M, self._sizes, what, seq=means_seq).wait()
        if len(dropped) == M:
            return None, dropped
        return torch.cat([codec.decode(b, n) for b, n in zip(means, counts, strict=True)]), dropped


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
