"""Error feedback: what a lossy codec dropped is kept by the replica and sent later.

One accumulator ``e_p`` per fragment, per replica (FP32, the fragment's size),
starting at zero. At each sync of fragment p with outer gradient ``Delta``::

    e    <- beta * e + Delta        (beta = ``decay``)
    sent  = Q(e)                    (decode(encode(e)): exactly what the peers receive)
    e    <- e - sent

so ``e_new + sent = beta * e_old + Delta`` (the invariant the tests check). With
beta = 1 nothing is lost, only delayed (classic error feedback); SparseLoCo
uses beta = 0.95 with top-k and drops the outer momentum, the decaying
accumulator playing its part; MuLoCo uses 0.9 with 2- and 4-bit quantization.

The accumulator is replica state (checkpointed by the algorithm's
``state_dict``), never the codec's: codecs stay stateless, and the same codec
object serves every fragment and replica.

A non-finite outer gradient leaves the accumulator untouched (the exchange
drops that contribution anyway), so one diverged sync cannot poison later ones.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from diloco.errors import ConfigError
from diloco.wire.codec import all_finite


def error_feedback_step_(
    accumulator: torch.Tensor,
    delta: torch.Tensor,
    *,
    decay: float,
    encode: Callable[[torch.Tensor], torch.Tensor],
    decode: Callable[[torch.Tensor], torch.Tensor],
) -> tuple[torch.Tensor, torch.Tensor]:
    """One sync's error feedback, in place on ``accumulator``: returns ``(payload, sent)``.

    ``encode`` maps FP32 values to the payload; ``decode`` maps the payload back to what the peers
    receive. The accumulator is left unchanged when ``delta`` is not finite.
    """
    if not bool(all_finite(delta)):
        payload = encode(delta)  # decodes to NaN: the exchange drops this replica
        return payload, decode(payload)
    corrected = accumulator.mul(decay).add_(delta.to(accumulator.device))
    payload = encode(corrected)
    sent = decode(payload)
    accumulator.copy_(corrected.sub_(sent.to(corrected.device)))
    return payload, sent


class ErrorFeedback:
    """The accumulators of one replica, one per fragment (see the module docstring).

    Args:
        sizes: values in each fragment.
        decay: beta in ``e <- beta * e + Delta`` (0 < beta <= 1).
        device: where the accumulators live (the global copy's device).
    """

    def __init__(self, sizes: Sequence[int], *, decay: float, device: torch.device | str | None = None) -> None:
        if not 0.0 < float(decay) <= 1.0:
            raise ConfigError(
                f"error-feedback decay (beta) must lie in (0, 1], got {decay}; 1 keeps everything "
                f"not yet sent, SparseLoCo uses 0.95, MuLoCo 0.9 (0 turns error feedback off)"
            )
        self.decay = float(decay)
        self.accumulators = [torch.zeros(int(n), dtype=torch.float32, device=device) for n in sizes]

    def step_(
        self,
        fragment: int,
        delta: torch.Tensor,
        *,
        encode: Callable[[torch.Tensor], torch.Tensor],
        decode: Callable[[torch.Tensor], torch.Tensor],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Fragment ``fragment``'s sync: ``(payload, sent)``; see :func:`error_feedback_step_`."""
        return error_feedback_step_(self.accumulators[fragment], delta, decay=self.decay, encode=encode, decode=decode)

    def num_bytes(self) -> int:
        """Memory the accumulators take (bytes)."""
        return sum(a.numel() * a.element_size() for a in self.accumulators)

    def state_dict(self) -> dict[str, Any]:
        return {"decay": self.decay, "accumulators": [a.clone() for a in self.accumulators]}

    @torch.no_grad()
    def load_state_dict(self, state: dict[str, Any]) -> None:
        saved = state["accumulators"]
        if len(saved) != len(self.accumulators) or any(s.shape != a.shape for s, a in zip(saved, self.accumulators)):
            raise ConfigError(
                f"checkpoint has error-feedback accumulators of {[s.numel() for s in saved]} values, "
                f"this run expects {[a.numel() for a in self.accumulators]}"
            )
        for a, s in zip(self.accumulators, saved, strict=True):
            a.copy_(s)


__all__ = ["ErrorFeedback", "error_feedback_step_"]
