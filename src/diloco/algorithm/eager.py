"""Eager updates (Kale, Douillard, Donchev; arXiv 2502.12996): overlap a whole outer step.

With tau = H the average of the outer gradients sent after step t arrives only
when the next ones are sent, after step t + H. Naively applying it then (one
outer step late) costs a lot of loss. Eagerly, replica m applies its *own*
share at once and the others' one round late, swapping its share out when the
average lands::

    share_m(t)  = Q_m(t) / M                           (Q: what m really sent, decoded)
    Delta~_m(t) = (mean(t-1) - share_m(t-1)) + share_m(t)
    theta_m(t)  = Outer_m(theta_m(t-1), Delta~_m(t))

Over two rounds every contribution is applied exactly once with weight 1/M
(before the first average lands, ``Delta~ = share``). Replicas differ only by
what their own latest shares did. At M = 1 the correction is exactly zero
(the mean *is* the share), so eager updates equal DiLoCo bit for bit: the
correction is formed first and the share added last for that reason.

Each replica keeps one extra fragment-sized buffer: the share in flight.
"""

from __future__ import annotations

import torch


def eager_share(sent: torch.Tensor, num_replicas: int) -> torch.Tensor:
    """This replica's share of the average, ``sent / M``; zero where ``sent`` is not finite (the
    exchange drops such a contribution, so it must not be applied locally either)."""
    share = sent / num_replicas
    if not bool(torch.isfinite(share).all()):
        return torch.zeros_like(share)
    return share


def eager_outer_gradient(
    share: torch.Tensor, *, landed_mean: torch.Tensor | None = None, landed_share: torch.Tensor | None = None
) -> torch.Tensor:
    """``(landed_mean - landed_share) + share``: the outer gradient an eager replica applies.

    ``landed_mean`` is the average that just arrived (None when nothing arrived, or when every
    contribution was dropped), ``landed_share`` this replica's share of it, applied one round ago.
    """
    if landed_share is None:
        assert landed_mean is None, "an average landed without the share it swaps out"
        return share.clone()
    correction = -landed_share if landed_mean is None else landed_mean.to(share.device) - landed_share
    return correction.add_(share)


def eager_landing(*, landed_mean: torch.Tensor | None, landed_share: torch.Tensor) -> torch.Tensor:
    """The outer gradient when the last average lands and nothing new is sent (at the end of training)."""
    return -landed_share if landed_mean is None else landed_mean.to(landed_share.device) - landed_share


__all__ = ["eager_landing", "eager_outer_gradient", "eager_share"]
