"""The copies of each fragment the learners hold, as the syncer keeps them: shared by the learners that hold the
same one, encoded into a reply once a merge, saved once in a checkpoint.

The syncer forms a learner's Delta_m against the copy of Theta_p that learner holds, so it keeps that copy.
Learners that received the same version in the same merge hold the same copy (codecs are deterministic), and
with the lossless ``fp32`` codec that copy is Theta_p itself (the syncer's snapshot of it): ``None`` stands for
it in a checkpoint.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from diloco.wire.codec import Codec

#: A merge's replies by the copy a learner held: id(copy) -> (that copy, the payload, the copy it will hold).
Shared = dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]


def is_lossless(codec: Codec) -> bool:
    """The codec decodes exactly what was encoded (only ``fp32``)."""
    return codec.name == "fp32"


def copy_bases(
    bases: dict[Any, list[torch.Tensor | None]], snapshot: Sequence[torch.Tensor], *, restore: bool = False
) -> dict[Any, list[torch.Tensor | None]]:
    """Copies of the learners' bases in which learners that share a copy still share one: ``None`` for Theta itself
    (``restore``: Theta for ``None``, and copies on Theta's device). ``torch.save`` keeps the sharing, so a checkpoint
    holds each copy once."""
    copies: dict[int, torch.Tensor] = {}

    def one(b: torch.Tensor | None, theta: torch.Tensor) -> torch.Tensor | None:
        if b is None or b is theta:
            return theta if restore else None
        if id(b) not in copies:
            copies[id(b)] = b.to(theta.device, copy=True) if restore else b.clone()
        return copies[id(b)]

    return {m: [one(b, t) for b, t in zip(bs, snapshot, strict=True)] for m, bs in bases.items()}


def reply_payload(
    codec: Codec, theta: torch.Tensor, base: torch.Tensor, shared: Shared, *, lossless: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """The payload of a reply to a learner holding ``base`` after a merge gave ``theta``, and the copy it will then
    hold. Learners that held the same copy get the same payload and then hold the same copy again: it is encoded
    once a merge and kept once (``shared``). ``lossless``: the payload is ``theta`` itself, which it will hold. The
    payload is on the CPU (the wire), the copy on ``theta``'s device."""
    if lossless:
        if id(theta) not in shared:
            shared[id(theta)] = (theta, codec.encode(theta).cpu(), theta)
        _, payload, _ = shared[id(theta)]
        return payload, theta
    if id(base) not in shared:
        held = torch.sub(theta, base)  # the difference, then (decoded in its place) the copy the learner will hold
        payload = codec.encode(held)
        # what the learner will hold: base + decoded, summed in place into the decoded copy (a + b == b + a); one
        # fresh tensor for both (a fresh tensor's page faults cost several memcpys)
        shared[id(base)] = (base, payload.cpu(), codec.decode_into(payload, theta.numel(), held).add_(base))
    _, payload, held = shared[id(base)]
    return payload, held


__all__ = ["Shared", "copy_bases", "is_lossless", "reply_payload"]
