"""The idealized wall-clock model of Scaling Laws for DiLoCo (its Appendix A), as functions.

Notation of the paper: N parameters, D tokens, T = D / B inner steps for a
global batch of B tokens, R chips of Q FLOP/s each (achieved, i.e. peak x
MFU), M replicas (datacenters), H inner steps per outer step. W0 / e0 are
the bandwidth / latency inside a datacenter, W1 / e1 across datacenters.

* compute:              6 N D / (R Q)
* data-parallel comm:   (2N/W1 (1 - 1/R) + e1) T
* DiLoCo comm (M >= 2): (2N/W0 (1 - M/R) + e0) T  +  (2N/W1 (1 - 1/R) + e1) T / H

2N/W (1 - 1/r) is the bandwidth term of a ring all-reduce over r chips.
The paper writes the payload as N; here it is N x ``bits_per_param`` bits
against W in bits/s, so bf16 (16) and FP4 (4) can be told apart. Nothing
overlaps in this model: wall-clock = compute + communication, and the
utilization it implies is compute / wall-clock. (The per-layer simulator in
``diloco.sim.dag`` is the one that lets communication hide behind compute;
with one layer and nothing to hide behind, both give the same number.)

With M = 1 DiLoCo has no cross-datacenter traffic (its outer step is local),
so only the first term remains: data-parallel inside one datacenter.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from diloco.errors import ConfigError


@dataclass(frozen=True)
class Network:
    """A network tier: bandwidth in bits/s per chip and latency in seconds per all-reduce."""

    bandwidth_bps: float
    latency_s: float = 0.0

    def __post_init__(self) -> None:
        if not self.bandwidth_bps > 0:
            raise ConfigError(f"bandwidth_bps must be > 0 bits/s, got {self.bandwidth_bps!r}")
        if not (self.latency_s >= 0 and np.isfinite(self.latency_s)):
            raise ConfigError(f"latency_s must be >= 0 seconds, got {self.latency_s!r}")


@dataclass(frozen=True)
class WallClock:
    """Seconds spent computing and communicating (inside and across datacenters) over a whole run."""

    compute_s: float
    within_comm_s: float
    cross_comm_s: float

    @property
    def comm_s(self) -> float:
        return self.within_comm_s + self.cross_comm_s

    @property
    def total_s(self) -> float:
        return self.compute_s + self.comm_s

    @property
    def utilization(self) -> float:
        """Compute time / wall-clock time."""
        return self.compute_s / self.total_s


def _positive(**values: float) -> None:
    for name, v in values.items():
        if not (np.isfinite(v) and v > 0):
            raise ConfigError(f"{name} must be a positive number, got {v!r}")


def num_steps(*, num_tokens: float, batch_tokens: float) -> float:
    """T = D / B: inner steps to consume ``num_tokens`` at ``batch_tokens`` per (global) step."""
    _positive(num_tokens=num_tokens, batch_tokens=batch_tokens)
    return num_tokens / batch_tokens


def compute_time_s(*, num_params: float, num_tokens: float, num_chips: int, flops_per_chip: float) -> float:
    """6 N D / (R Q): the training FLOPs of a dense transformer over the chips' achieved FLOP/s."""
    _positive(num_params=num_params, num_tokens=num_tokens, num_chips=num_chips, flops_per_chip=flops_per_chip)
    return 6.0 * num_params * num_tokens / (num_chips * flops_per_chip)


def allreduce_time_s(*, num_params: float, ring_size: float, network: Network, bits_per_param: float = 16.0) -> float:
    """2 N b / W (1 - 1/r) + e: one ring all-reduce of N parameters of b bits over r chips."""
    _positive(num_params=num_params, ring_size=ring_size, bits_per_param=bits_per_param)
    if ring_size < 1:
        raise ConfigError(f"ring_size must be >= 1 chip, got {ring_size!r}")
    payload = num_params * bits_per_param
    return 2.0 * payload / network.bandwidth_bps * (1.0 - 1.0 / ring_size) + network.latency_s


def data_parallel_wallclock(
    *,
    num_params: float,
    num_tokens: float,
    batch_tokens: float,
    num_chips: int,
    flops_per_chip: float,
    cross: Network,
    bits_per_param: float = 16.0,
) -> WallClock:
    """Data-parallel across datacenters: every step all-reduces the gradients over all R chips on W1."""
    T = num_steps(num_tokens=num_tokens, batch_tokens=batch_tokens)
    compute = compute_time_s(
        num_params=num_params, num_tokens=num_tokens, num_chips=num_chips, flops_per_chip=flops_per_chip
    )
    per_step = allreduce_time_s(
        num_params=num_params, ring_size=num_chips, network=cross, bits_per_param=bits_per_param
    )
    return WallClock(compute, 0.0, per_step * T)


def diloco_wallclock(
    *,
    num_params: float,
    num_tokens: float,
    batch_tokens: float,
    num_chips: int,
    flops_per_chip: float,
    num_replicas: int,
    sync_every: int,
    within: Network,
    cross: Network,
    bits_per_param: float = 16.0,
) -> WallClock:
    """DiLoCo with M replicas of R/M chips: data-parallel inside each, an outer all-reduce every H steps."""
    M, R, H = num_replicas, num_chips, sync_every
    if not (isinstance(M, int) and M >= 1):
        raise ConfigError(f"num_replicas (M) must be a positive int, got {M!r}")
    if not (isinstance(H, int) and H >= 1):
        raise ConfigError(f"sync_every (H) must be a positive int, got {H!r}")
    if R < M or R % M:
        raise ConfigError(f"num_chips (R={R}) must be a multiple of num_replicas (M={M}): each replica gets R/M chips")
    T = num_steps(num_tokens=num_tokens, batch_tokens=batch_tokens)
    compute = compute_time_s(num_params=num_params, num_tokens=num_tokens, num_chips=R, flops_per_chip=flops_per_chip)
    inner = allreduce_time_s(num_params=num_params, ring_size=R / M, network=within, bits_per_param=bits_per_param)
    outer = 0.0
    if M >= 2:
        outer = (
            allreduce_time_s(num_params=num_params, ring_size=R, network=cross, bits_per_param=bits_per_param) * T / H
        )
    return WallClock(compute, inner * T, outer)


__all__ = [
    "Network",
    "WallClock",
    "num_steps",
    "compute_time_s",
    "allreduce_time_s",
    "data_parallel_wallclock",
    "diloco_wallclock",
]
