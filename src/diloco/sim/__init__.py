"""Compute-utilization simulator and wall-clock model for training across datacenters.

* :mod:`diloco.sim.dag` — the per-layer DAG (forward, backward, reductions) of one worker, simulated
  over a grid of bandwidths; reductions are placed by :class:`diloco.algorithm.schedule.Schedule`.
* :mod:`diloco.sim.utilization` — methods (data-parallel, DiLoCo, Streaming DiLoCo, overlap, low-bit),
  utilization curves, :func:`predict_utilization`, bandwidth needed per target.
* :mod:`diloco.sim.paper` — Streaming DiLoCo Table 4 and Scaling Laws Table 6, and their reproduction.
* :mod:`diloco.sim.wallclock` — the Scaling Laws paper's wall-clock model.
* :mod:`diloco.sim.hardware` — model presets (1B / 10B / 100B), bandwidth grids, ring all-reduce factor.
"""

from diloco.sim.hardware import GBIT, PRESETS, ModelSpec, bandwidth_grid, preset, ring_allreduce_factor
from diloco.sim.utilization import (
    TARGETS,
    MethodSpec,
    SweepResult,
    bandwidth_needed,
    data_parallel,
    diloco,
    paper_methods,
    predict_utilization,
    streaming,
    sweep,
    utilization_curve,
)
from diloco.sim.wallclock import Network, WallClock, data_parallel_wallclock, diloco_wallclock

__all__ = [
    "GBIT", "PRESETS", "ModelSpec", "bandwidth_grid", "preset", "ring_allreduce_factor",
    "TARGETS", "MethodSpec", "SweepResult", "bandwidth_needed", "data_parallel", "diloco", "paper_methods",
    "predict_utilization", "streaming", "sweep", "utilization_curve",
    "Network", "WallClock", "data_parallel_wallclock", "diloco_wallclock",
]
