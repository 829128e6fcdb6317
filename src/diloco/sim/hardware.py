"""Model presets, bandwidth grids, step time from hardware and latency hops for the simulator.

The presets are Streaming DiLoCo's simulator models (its Table 4): layer
count, parameter count and the step time the paper states. They are the
simulator's own, independent of the trainable model sizes in
``diloco.models``; the paper's 1B/10B/100B are not the Chinchilla shapes.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from diloco.errors import ConfigError
from diloco.traffic import check_exchange

GBIT = 1e9  # bits per second in one Gbit/s


@dataclass(frozen=True)
class ModelSpec:
    """What the simulator needs to know about a model and its hardware.

    ``num_params`` counts every trainable parameter; ``non_block_params`` of
    them (embeddings, head, final norm) sit outside the ``num_layers`` repeated
    blocks, which share the rest equally. ``step_time_s`` is the time of one
    inner step (forward + backward + optimizer) on one worker.
    """

    num_layers: int
    num_params: float
    step_time_s: float
    non_block_params: float = 0.0
    name: str = "custom"

    def __post_init__(self) -> None:
        if not isinstance(self.num_layers, int) or isinstance(self.num_layers, bool) or self.num_layers < 1:
            raise ConfigError(f"num_layers must be a positive int, got {self.num_layers!r}")
        if not (np.isfinite(self.num_params) and self.num_params > 0):
            raise ConfigError(f"num_params must be > 0, got {self.num_params!r}")
        if not (np.isfinite(self.step_time_s) and self.step_time_s > 0):
            raise ConfigError(f"step_time_s must be > 0 seconds, got {self.step_time_s!r}")
        if not 0 <= self.non_block_params < self.num_params:
            raise ConfigError(
                f"non_block_params must lie in [0, num_params={self.num_params:g}), got {self.non_block_params!r}"
            )

    @property
    def params_per_layer(self) -> float:
        return (self.num_params - self.non_block_params) / self.num_layers

    def scaled(self, step_time_scale: float) -> ModelSpec:
        """The same model with its step time multiplied by ``step_time_scale``."""
        if not (np.isfinite(step_time_scale) and step_time_scale > 0):
            raise ConfigError(f"step_time_scale must be > 0, got {step_time_scale!r}")
        return replace(self, step_time_s=self.step_time_s * step_time_scale)


#: Streaming DiLoCo Table 4's simulated models, with the step times the paper states.
PRESETS: dict[str, ModelSpec] = {
    "1B": ModelSpec(num_layers=24, num_params=1e9, step_time_s=0.1, name="1B"),
    "10B": ModelSpec(num_layers=48, num_params=1e10, step_time_s=0.8, name="10B"),
    "100B": ModelSpec(num_layers=108, num_params=1e11, step_time_s=4.9, name="100B"),
}


def preset(name: str) -> ModelSpec:
    try:
        return PRESETS[name]
    except KeyError:
        raise ConfigError(f"unknown model size {name!r}; choose one of {', '.join(PRESETS)}") from None


def bandwidth_grid(low_gbps: float = 0.1, high_gbps: float = 1000.0, num: int = 50) -> np.ndarray:
    """Log-spaced bandwidths in bits/s. The default is the grid every paper value lies on.

    ``num = 1`` (with ``low == high``) is one bandwidth.
    """
    if num == 1 and low_gbps == high_gbps and low_gbps > 0:
        return np.array([low_gbps * GBIT])
    if not (0 < low_gbps < high_gbps):
        raise ConfigError(
            f"need 0 < low < high Gbit/s (or low == high with num 1), got low={low_gbps!r}, high={high_gbps!r}"
        )
    if num < 2:
        raise ConfigError(f"a bandwidth grid from low to high needs at least 2 points, got num={num}")
    return np.logspace(np.log10(low_gbps), np.log10(high_gbps), num) * GBIT


def step_time_from_hardware(
    *, num_params: float, tokens_per_step: float, num_chips: float, peak_flops: float, mfu: float
) -> float:
    """Seconds per inner step: 6 N B / (R Q u), the training FLOPs of a step over the chips' achieved FLOP/s.

    ``tokens_per_step`` B is the global batch in tokens (all workers together)
    and ``num_chips`` R counts every chip of every worker: each of M workers
    runs B / M tokens on R / M chips, so the step time does not depend on M.
    """
    for name, v in (
        ("num_params", num_params),
        ("tokens_per_step", tokens_per_step),
        ("num_chips", num_chips),
        ("peak_flops", peak_flops),
    ):
        if not (np.isfinite(v) and v > 0):
            raise ConfigError(f"{name} must be a positive number, got {v!r}")
    if not (np.isfinite(mfu) and 0 < mfu <= 1):
        raise ConfigError(f"mfu must lie in (0, 1] (a fraction of peak, e.g. 0.4), got {mfu!r}")
    return 6.0 * num_params * tokens_per_step / (num_chips * peak_flops * mfu)


def latency_hops(exchange: str, num_workers: int) -> int:
    """Sequential message rounds of one exchange among M workers, each paying the link latency once.

    ``"reduce_scatter"`` (the papers' all-reduce, run as a ring): 2(M - 1)
    hops, M - 1 to reduce-scatter and M - 1 to all-gather. ``"all_gather"``
    (as a ring): M - 1 hops. One worker sends nothing: 0.
    """
    check_exchange(exchange)
    if not isinstance(num_workers, int) or isinstance(num_workers, bool) or num_workers < 1:
        raise ConfigError(f"num_workers must be a positive int, got {num_workers!r}")
    rounds = num_workers - 1
    return 2 * rounds if exchange == "reduce_scatter" else rounds


#: The exchange the papers' simulators assume: an all-reduce at its bandwidth limit, 2(M-1)/M of the payload.
PAPER_EXCHANGE = "reduce_scatter"


__all__ = [
    "GBIT",
    "ModelSpec",
    "PAPER_EXCHANGE",
    "PRESETS",
    "preset",
    "bandwidth_grid",
    "latency_hops",
    "step_time_from_hardware",
]
