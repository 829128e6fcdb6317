"""The FP32 average of the replicas' payloads: decode each, drop the non-finite ones, sum in rank order.

Every exchange ends here (:mod:`diloco.comm`), whatever the method: the all-gather averages the M
payloads, the reduce-scatter each shard's M pieces.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from diloco.wire.codec import Codec, all_finite


def average_payloads(
    payloads: Sequence[torch.Tensor], codec: Codec, numel: int, *, out_device: torch.device | None = None
) -> tuple[torch.Tensor | None, list[int]]:
    """Decode every replica's payload and average them in FP32, in rank order.

    Contributions that decode to any non-finite value are dropped from the
    average (the codecs turn a non-finite input into an all-NaN payload) and
    their ranks returned, so one diverged replica cannot poison the others.
    Returns ``(None, dropped)`` when every contribution was dropped.
    Summing in rank order makes the result bit-identical on every replica.
    """
    total: torch.Tensor | None = None
    dropped: list[int] = []
    for rank, payload in enumerate(payloads):
        value = codec.decode(payload, numel)
        if out_device is not None:
            value = value.to(out_device)
        if not bool(all_finite(value)):
            dropped.append(rank)
            continue
        total = value if total is None else total.add_(value)
    kept = len(payloads) - len(dropped)
    if total is None:
        return None, dropped
    return total.div_(kept), dropped
