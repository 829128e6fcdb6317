"""How a replica's contribution is cut and encoded for an exchange, and what it costs on the link.

The communicator averages one FP32 vector (an outer gradient, or a step's
gradients) over M replicas through one of two exchanges (:mod:`diloco.traffic`):

* ``"all_gather"``: the contribution is ``codec.encode(values)``; every replica
  receives all M and decodes and sums them in FP32 in rank order.
* ``"reduce_scatter"`` (M >= 3): the values are cut into M contiguous shards
  (:func:`diloco.traffic.shard_sizes`) and each shard encoded on its own; the
  contribution is their concatenation. Shard ``j`` of every replica goes to
  replica ``j`` (all-to-all), which decodes and sums them in FP32 in rank order,
  encodes the mean with the same codec and sends it to every replica (all-gather).

Non-finite contributions. A replica whose values hold any NaN or inf encodes
*every* shard as non-finite (the codecs turn a non-finite input into an all-NaN
payload), so every shard owner sees the same replicas' shards as non-finite and
drops the same ranks: the replicas agree on the dropped set without an extra
collective or an extra byte (each one learns it from its own shard). That is
why a shard may never be empty: the reduce-scatter exchange needs at least one
value per replica; a smaller vector uses the all-gather (:func:`resolve_exchange`).

Sparse payloads (the top-k codec) always use the all-gather: the owner of a shard
would have to re-encode the mean of M sparse shards, whose union of supports no
longer fits k values, so the re-encoding would drop some of what was sent.

Result. With the fp32 codec the mean is bit-identical to the all-gather's (the
same FP32 additions in the same order, element by element, and fp32 is exact on
the wire). With a lossy codec the mean of the decoded contributions is rounded
once more, by one ``codec.encode``/``decode`` of the mean shard: the result is
exactly ``decode(encode(mean))`` shard by shard, whose error the codec bounds
(tested in tests/distributed/test_exchange.py).
"""

from __future__ import annotations

import torch

from diloco.traffic import LinkBytes, all_gather_bytes, check_exchange, reduce_scatter_bytes, shard_sizes
from diloco.wire.codec import Codec, all_finite


def resolve_exchange(exchange: str, *, num_replicas: int, numel: int, codec: Codec | None = None) -> str:
    """The exchange really run: ``exchange``, except all-gather for M <= 2, fewer values than replicas,
    or a codec whose payloads do not sum in place (sparse top-k: :attr:`Codec.reduces_in_place`)."""
    check_exchange(exchange)
    sparse = codec is not None and not codec.reduces_in_place
    if exchange == "reduce_scatter" and (num_replicas <= 2 or numel < num_replicas or sparse):
        return "all_gather"
    return exchange


def chunk_bytes(codec: Codec, *, numel: int, num_replicas: int, exchange: str) -> list[int]:
    """Encoded sizes of the contribution's pieces: one payload (all-gather) or one per shard."""
    if exchange == "all_gather":
        return [codec.num_bytes(numel)]
    return [codec.num_bytes(s) for s in shard_sizes(numel, num_replicas)]


def encode_contribution(values: torch.Tensor, codec: Codec, *, num_replicas: int, exchange: str) -> torch.Tensor:
    """1-D FP32 ``values`` -> this replica's 1-D uint8 contribution to ``exchange``."""
    if exchange == "all_gather":
        return codec.encode(values)
    if not bool(all_finite(values)):  # poison every shard: the owners all drop this replica
        values = torch.full_like(values, float("nan"))
    shards = values.split(shard_sizes(values.numel(), num_replicas))
    return torch.cat([codec.encode(s) for s in shards])


def link_bytes(codec: Codec, *, numel: int, num_replicas: int, exchange: str, rank: int) -> LinkBytes:
    """What one exchange of ``numel`` values moves over replica ``rank``'s link (the traffic function)."""
    sizes = chunk_bytes(codec, numel=numel, num_replicas=num_replicas, exchange=exchange)
    if exchange == "all_gather":
        return all_gather_bytes(sizes[0], num_replicas)
    return reduce_scatter_bytes(sizes, rank)


def decode_contribution(
    payload: torch.Tensor, codec: Codec, *, numel: int, num_replicas: int, exchange: str
) -> torch.Tensor:
    """This replica's own contribution as its peers will decode it (FP32): what it really sent."""
    if exchange == "all_gather":
        return codec.decode(payload, numel)
    counts = shard_sizes(numel, num_replicas)
    sizes = chunk_bytes(codec, numel=numel, num_replicas=num_replicas, exchange=exchange)
    return torch.cat([codec.decode(b, n) for b, n in zip(payload.split(sizes), counts, strict=True)])
