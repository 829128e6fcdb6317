"""Decoupled DiLoCo's merge rules, pure functions: token weights, radial-directional averaging, mean.

For one fragment, the syncer holds each merged learner m's outer gradient Delta_m (FP32, formed
against the syncer's own global copy) and its counters since it last received the fragment:
``steps`` (c_steps) and ``tokens`` (c_tok).

* Token weights ("quantity x quality"): w_m = c_tok * (c_tok / c_steps), normalised to sum 1
  over the learners merged; a learner with no steps has weight 0.
* Radial-directional averaging (RDA), per tensor:
  ``RDA = (sum w_m |Delta_m| / sum w_m) * unit(sum w_m unit(Delta_m))``, unit(x) = x / |x|,
  unit(0) = 0. It keeps the weighted mean norm and takes the weighted mean direction: learners'
  outer gradients are nearly orthogonal, so a plain mean shrinks by ~1/sqrt(M) and the outer
  learning rate would have to change with M.
* Weighted mean, ``sum w_m Delta_m / sum w_m``: the merge of embedding tensors under ``rda``, and of
  every tensor under ``mean``. With equal weights it is computed as the plain sum in learner order
  divided by the count, the same operations (hence the same bits) as synchronous Streaming DiLoCo's
  average.

:class:`MergeFold` computes :func:`merge_outer_gradients` with one learner's outer gradient at a time
(the syncer's streaming merge: memory of one fragment's accumulator whatever the number of learners),
with the same floating-point operations in the same order, hence the same bits.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from diloco.decoupled_choices import MERGE_NAMES
from diloco.errors import ConfigError


def check_merge(name: str) -> str:
    """``name`` if it is a merge rule, else a ValueError naming the choices."""
    if name not in MERGE_NAMES:
        raise ConfigError(
            f"merge={name!r} is not a merge rule: choose 'rda' (radial-directional averaging, "
            f"embeddings averaged) or 'mean' (token-weighted mean of every tensor)"
        )
    return name


def token_weights(steps: Sequence[int], tokens: Sequence[float]) -> list[float]:
    """w_m = c_tok * (c_tok / c_steps), normalised to sum 1; 0 for a learner with no steps.

    All zero (no learner did any work) gives all zero.
    """
    if len(steps) != len(tokens):
        raise ConfigError(f"{len(steps)} step counters but {len(tokens)} token counters: give one of each per learner")
    raw = [float(c) * (float(c) / s) if s > 0 else 0.0 for s, c in zip(steps, tokens, strict=True)]
    total = sum(raw)
    return [w / total for w in raw] if total > 0 else [0.0] * len(raw)


def _equal(weights: Sequence[float]) -> bool:
    return all(w == weights[0] for w in weights)


def weighted_mean(deltas: Sequence[torch.Tensor], weights: Sequence[float]) -> torch.Tensor:
    """sum w_m Delta_m / sum w_m (FP32); equal weights: the plain mean, summed in the given order."""
    assert deltas and len(deltas) == len(weights)
    if _equal(weights):
        total = deltas[0].float().clone()
        for d in deltas[1:]:
            total.add_(d)
        return total.div_(len(deltas))
    total_w = sum(weights)
    assert total_w > 0, "weighted mean of learners that all have weight 0"
    out = torch.zeros_like(deltas[0], dtype=torch.float32)
    for d, w in zip(deltas, weights, strict=True):
        out.add_(d.float(), alpha=w / total_w)
    return out


def _unit(x: torch.Tensor) -> torch.Tensor:
    norm = torch.linalg.vector_norm(x)
    return x / norm if norm > 0 else torch.zeros_like(x)


def radial_directional_average(deltas: Sequence[torch.Tensor], weights: Sequence[float]) -> torch.Tensor:
    """RDA of one tensor: (sum w |Delta| / sum w) * unit(sum w unit(Delta)) (FP32)."""
    assert deltas and len(deltas) == len(weights)
    total_w = sum(weights)
    assert total_w > 0, "RDA of learners that all have weight 0"
    radius = sum(w * float(torch.linalg.vector_norm(d.float())) for d, w in zip(deltas, weights, strict=True)) / total_w
    direction = torch.zeros_like(deltas[0], dtype=torch.float32)
    for d, w in zip(deltas, weights, strict=True):
        direction.add_(_unit(d.float()), alpha=w)
    return _unit(direction).mul_(radius)


def merge_outer_gradients(
    deltas: Sequence[torch.Tensor],
    weights: Sequence[float],
    *,
    sizes: Sequence[int],
    embedding: Sequence[bool],
    merge: str = "rda",
) -> torch.Tensor:
    """Merge learners' flat outer gradients of one fragment, tensor by tensor.

    ``sizes``: the numel of each tensor in the flat layout; ``embedding``: which of them are embedding
    tensors (averaged, never RDA'd). Learners of weight 0 are left out; returns a new flat FP32 tensor.
    """
    check_merge(merge)
    assert len(sizes) == len(embedding) and all(d.numel() == sum(sizes) for d in deltas)
    kept = [(d, w) for d, w in zip(deltas, weights, strict=True) if w > 0]
    assert kept, "a merge with no learner of positive weight"
    ds, ws = [d for d, _ in kept], [w for _, w in kept]
    if merge == "mean" or not any(not e for e in embedding):
        return weighted_mean(ds, ws)
    out, offset = [], 0
    for n, is_embedding in zip(sizes, embedding, strict=True):
        parts = [d[offset : offset + n] for d in ds]
        out.append(weighted_mean(parts, ws) if is_embedding else radial_directional_average(parts, ws))
        offset += n
    return torch.cat(out)


class MergeFold:
    """:func:`merge_outer_gradients` folded one learner at a time, bit for bit the same.

    Give the weights of the learners that will be folded (in the order they will be folded; those of weight 0
    are skipped by :meth:`add`), then :meth:`add` each one's flat FP32 outer gradient in that order and take
    :meth:`result`. Memory: one flat FP32 accumulator (the first outer gradient itself under an equal-weight
    mean, which it then changes in place; else ``out`` where given, zeroed), per-tensor running sums of w |Delta| as
    Python floats.

    The same operations as the stacked functions: an equal-weight mean is the first outer gradient plus the
    others in order, divided by the count; a weighted mean adds ``alpha = w / sum w`` times each to zeros; RDA
    adds ``w * (Delta / |Delta|)`` to zeros per tensor, sums ``w * |Delta|`` in a float from 0, and at the end
    takes the unit of the sum times ``sum w |Delta| / sum w``. :meth:`add` divides the outer gradient it is
    given in place (RDA): pass one the caller no longer needs.
    """

    def __init__(
        self,
        *,
        weights: Sequence[float],
        sizes: Sequence[int],
        embedding: Sequence[bool],
        merge: str = "rda",
        out: torch.Tensor | None = None,
    ) -> None:
        check_merge(merge)
        assert len(sizes) == len(embedding)
        self.out = out  # a flat FP32 buffer of the fragment's size to accumulate in (zeroed first), else a new one
        self.weights = [float(w) for w in weights]
        self.ws = [w for w in self.weights if w > 0]
        assert self.ws, "a merge with no learner of positive weight"
        self.numel = sum(sizes)
        self.equal = _equal(self.ws)
        self.total_w = sum(self.ws)
        assert self.total_w > 0, "a merge of learners that all have weight 0"
        whole = merge == "mean" or not any(not e for e in embedding)
        # (offset, size, rda?) per part: one part for the whole fragment when every tensor is averaged
        self.parts: list[tuple[int, int, bool]] = []
        if whole:
            self.parts.append((0, self.numel, False))
        else:
            offset = 0
            for n, is_embedding in zip(sizes, embedding, strict=True):
                self.parts.append((offset, n, not is_embedding))
                offset += n
        self.radius = [0 for _ in self.parts]  # sum w |Delta| per RDA tensor, from 0 as Python's sum()
        self.acc: torch.Tensor | None = None
        self.seen = 0  # learners given to add(), weight 0 included
        self.folded = 0  # learners folded in (weight > 0)

    def add(self, delta: torch.Tensor) -> None:
        """Fold the next learner's flat FP32 outer gradient (skipped if its weight is 0); may change it in place."""
        assert self.seen < len(self.weights), "more outer gradients than weights"
        w = self.weights[self.seen]
        self.seen += 1
        if not w > 0:
            return
        assert delta.dtype == torch.float32 and delta.numel() == self.numel
        first = self.folded == 0
        self.folded += 1
        if first and self.equal and len(self.parts) == 1 and not self.parts[0][2]:
            self.acc = delta  # the equal-weight mean of the whole fragment: the first, then the others added to it
            return
        if self.acc is None:
            if self.out is None:
                self.acc = torch.zeros(self.numel, dtype=torch.float32, device=delta.device)
            else:
                self.acc = self.out.zero_()
        for i, (offset, n, rda) in enumerate(self.parts):
            acc, d = self.acc[offset : offset + n], delta[offset : offset + n]
            if rda:
                norm = torch.linalg.vector_norm(d)
                self.radius[i] = self.radius[i] + w * float(norm)
                if norm > 0:
                    d.div_(norm)
                else:
                    d.zero_()
                acc.add_(d, alpha=w)
            elif self.equal:
                if first:
                    acc.copy_(d)
                else:
                    acc.add_(d)
            else:
                acc.add_(d, alpha=w / self.total_w)

    def result(self) -> torch.Tensor:
        """The merged flat FP32 outer gradient (the accumulator itself: no copy)."""
        assert self.seen == len(self.weights) and self.acc is not None, "fold every learner before the result"
        for i, (offset, n, rda) in enumerate(self.parts):
            acc = self.acc[offset : offset + n]
            if rda:
                norm = torch.linalg.vector_norm(acc)
                if norm > 0:
                    acc.div_(norm)
                else:
                    acc.zero_()
                acc.mul_(self.radius[i] / self.total_w)
            elif self.equal:
                acc.div_(len(self.ws))
        return self.acc


__all__ = [
    "MERGE_NAMES",
    "MergeFold",
    "check_merge",
    "merge_outer_gradients",
    "radial_directional_average",
    "token_weights",
    "weighted_mean",
]
