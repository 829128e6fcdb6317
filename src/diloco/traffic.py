"""Bytes on each replica's link for one exchange: the one traffic function.

The communicator's accounting, the simulator and the planner all ask this
module, so that what is counted, what is simulated and what is planned are
the same numbers. Pure Python, no torch: ``diloco.sim`` and ``diloco plan``
import it without loading torch.


Two exchanges of an encoded payload among ``M`` replicas (workers):

* ``"all_gather"``: every replica sends its whole encoded payload of ``n``
  bytes to each of the ``M - 1`` others and receives theirs, then decodes and
  sums all ``M`` in FP32 in rank order. Per replica: ``(M - 1)·n`` bytes each
  way. At ``M = 2`` this is ``n``, the bandwidth limit of an all-reduce.
* ``"reduce_scatter"`` (a quantized all-reduce, the shape of torchft's): the
  payload is cut into ``M`` shards; an all-to-all sends shard ``j`` of every
  replica to replica ``j``, which decodes and sums them in FP32 in rank order,
  encodes the mean and all-gathers it. Per replica: the ``M - 1`` shards it
  sends and the ``M - 1`` copies of its own shard it receives in the
  all-to-all, then its mean shard to ``M - 1`` peers and the others' mean
  shards from them: ``2(M - 1)/M·n`` each way for equal shards, the
  bandwidth limit of any all-reduce.

Sparse payloads (the top-k codec) always take the all-gather: their sum is not
one of them, so a shard owner could not re-encode the mean
(:func:`diloco.comm.exchange.resolve_exchange`). Eager updates (tau = H) change
when an exchange lands, not what it moves: these functions apply unchanged.

Both count logical point-to-point bytes (each message crosses the sender's
and the receiver's link once); a ring implementation of the same collective
moves the same number of bytes per link.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from diloco.errors import ConfigError

#: The exchanges a communicator can run, by name.
EXCHANGES = ("all_gather", "reduce_scatter")


@dataclass(frozen=True)
class LinkBytes:
    """Bytes one replica's link carries for one exchange: ``sent`` out, ``received`` in."""

    sent: int
    received: int


def _check_replicas(num_replicas: int) -> None:
    if not isinstance(num_replicas, int) or isinstance(num_replicas, bool) or num_replicas < 1:
        raise ConfigError(f"num_replicas must be a positive int, got {num_replicas!r}")


def check_exchange(exchange: str) -> str:
    """``exchange`` if it names a known exchange, else a ValueError listing them."""
    if exchange not in EXCHANGES:
        raise ConfigError(f"unknown exchange {exchange!r}; choose one of {', '.join(EXCHANGES)}")
    return exchange


def shard_sizes(num_elements: int, num_shards: int) -> list[int]:
    """Split ``num_elements`` values into ``num_shards`` contiguous shards, the first ones larger by one.

    The reduce-scatter exchange cuts every payload this way (before encoding),
    so every replica and the accounting agree on the shard boundaries.
    """
    _check_replicas(num_shards)
    if num_elements < 0:
        raise ConfigError(f"num_elements must be >= 0, got {num_elements!r}")
    base, extra = divmod(num_elements, num_shards)
    return [base + (1 if i < extra else 0) for i in range(num_shards)]


def all_gather_bytes(payload_bytes: int, num_replicas: int) -> LinkBytes:
    """Per-replica link bytes of an all-gather of a ``payload_bytes`` payload: (M-1)·n each way."""
    _check_replicas(num_replicas)
    if payload_bytes < 0:
        raise ConfigError(f"payload_bytes must be >= 0, got {payload_bytes!r}")
    each = payload_bytes * (num_replicas - 1)
    return LinkBytes(sent=each, received=each)


def reduce_scatter_bytes(shard_bytes: Sequence[int], rank: int) -> LinkBytes:
    """Per-replica link bytes of the reduce-scatter exchange, for replica ``rank``.

    ``shard_bytes[j]`` is the encoded size of shard ``j`` (owned by replica
    ``j``); the encoded mean of a shard is assumed the same size as one
    contribution (same codec, same number of values).
    """
    m = len(shard_bytes)
    _check_replicas(m)
    if not 0 <= rank < m:
        raise ConfigError(f"rank must lie in [0, {m}), got {rank!r}")
    others = sum(shard_bytes) - shard_bytes[rank]
    own = shard_bytes[rank] * (m - 1)
    # all-to-all: send the others' shards, receive M-1 copies of our own;
    # all-gather of the means: send our mean M-1 times, receive each other mean once.
    return LinkBytes(sent=others + own, received=own + others)


def exchange_bytes(*, payload_bytes: float, num_replicas: int, exchange: str) -> float:
    """Per-replica bytes each way for a payload of ``payload_bytes`` (analytic, equal shards).

    What the simulator and the planner use: ``(M-1)·n`` for ``"all_gather"``,
    ``2(M-1)/M·n`` for ``"reduce_scatter"``. Fractional payloads (bits per
    parameter times a parameter count) are fine here.
    """
    _check_replicas(num_replicas)
    check_exchange(exchange)
    if payload_bytes < 0:
        raise ConfigError(f"payload_bytes must be >= 0, got {payload_bytes!r}")
    if exchange == "all_gather":
        return payload_bytes * (num_replicas - 1)
    return payload_bytes * 2.0 * (num_replicas - 1) / num_replicas


def default_exchange(num_replicas: int) -> str:
    """The exchange the communicator runs by default: all-gather for M <= 2, reduce-scatter above."""
    _check_replicas(num_replicas)
    return "all_gather" if num_replicas <= 2 else "reduce_scatter"


__all__ = [
    "EXCHANGES",
    "LinkBytes",
    "all_gather_bytes",
    "check_exchange",
    "default_exchange",
    "exchange_bytes",
    "reduce_scatter_bytes",
    "shard_sizes",
]
