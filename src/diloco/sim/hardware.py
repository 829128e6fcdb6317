"""Model presets, bandwidth grids and link arithmetic for the compute-utilization simulator.

The presets are Streaming DiLoCo's simulator models (its Table 4): layer
count, parameter count and the step time the paper states. They are the
simulator's own, independent of the trainable model sizes in
``diloco.models``; the paper's 1B/10B/100B are not the Chinchilla shapes.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

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
            raise ValueError(f"num_layers must be a positive int, got {self.num_layers!r}")
        if not (np.isfinite(self.num_params) and self.num_params > 0):
            raise ValueError(f"num_params must be > 0, got {self.num_params!r}")
        if not (np.isfinite(self.step_time_s) and self.step_time_s > 0):
            raise ValueError(f"step_time_s must be > 0 seconds, got {self.step_time_s!r}")
        if not 0 <= self.non_block_params < self.num_params:
            raise ValueError(
                f"non_block_params must lie in [0, num_params={self.num_params:g}), got {self.non_block_params!r}"
            )

    @property
    def params_per_layer(self) -> float:
        return (self.num_params - self.non_block_params) / self.num_layers

    def scaled(self, step_time_scale: float) -> "ModelSpec":
        """The same model with its step time multiplied by ``step_time_scale``."""
        if not (np.isfinite(step_time_scale) and step_time_scale > 0):
            raise ValueError(f"step_time_scale must be > 0, got {step_time_scale!r}")
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
        raise ValueError(f"unknown model size {name!r}; choose one of {', '.join(PRESETS)}") from None


def bandwidth_grid(low_gbps: float = 0.1, high_gbps: float = 1000.0, num: int = 50) -> np.ndarray:
    """Log-spaced bandwidths in bits/s. The default is the grid every paper value lies on."""
    if not (0 < low_gbps < high_gbps):
        raise ValueError(f"need 0 < low < high Gbit/s, got low={low_gbps!r}, high={high_gbps!r}")
    if num < 2:
        raise ValueError(f"a bandwidth grid needs at least 2 points, got num={num}")
    return np.logspace(np.log10(low_gbps), np.log10(high_gbps), num) * GBIT


def ring_allreduce_factor(num_workers: int) -> float:
    """Fraction of a payload each worker sends (and receives) in a ring all-reduce: 2(M-1)/M.

    For M = 2 workers it is 1: each sends the full payload, the assumption
    that fits the paper's table.
    """
    if not isinstance(num_workers, int) or num_workers < 1:
        raise ValueError(f"num_workers must be a positive int, got {num_workers!r}")
    return 2.0 * (num_workers - 1) / num_workers


__all__ = ["GBIT", "ModelSpec", "PRESETS", "preset", "bandwidth_grid", "ring_allreduce_factor"]
