"""Compute-utilization simulator and wall-clock model for training across datacenters.

* :mod:`diloco.sim.dag` — the per-layer DAG (forward, backward, reductions) of one worker, simulated
  over a grid of bandwidths; reductions are placed by :class:`diloco.algorithm.schedule.Schedule`.
* :mod:`diloco.sim.utilization` — methods (data-parallel, DiLoCo, Streaming DiLoCo, overlap, low-bit),
  utilization curves, :func:`predict_utilization`, bandwidth needed per target.
* :mod:`diloco.sim.paper` — Streaming DiLoCo Table 4 and Scaling Laws Table 6, and their reproduction.
* :mod:`diloco.sim.wallclock` — the Scaling Laws paper's wall-clock model.
* :mod:`diloco.sim.hardware` — model presets (1B / 10B / 100B), bandwidth grids, step time from
  hardware, latency hops.
* :mod:`diloco.sim.loss` — predicted eval loss of a setting: scaling law plus the ablations' costs.
* :mod:`diloco.sim.goodput` — goodput under chip failures and stragglers (non-elastic and elastic DP,
  synchronous and decoupled learners); :mod:`diloco.sim.goodput_mc` its Monte-Carlo and
  :mod:`diloco.sim.goodput_paper` Decoupled DiLoCo's Table 1 and the fit of its constants.
* :mod:`diloco.sim.planner` — candidates (DP, DiLoCo over H, Streaming over P, tau, codec, eager
  updates at tau = H, stat / top-k codecs with error feedback) ranked by predicted wall-clock within a
  loss tolerance of DP (``diloco plan``).

Nothing here imports torch (``import diloco.sim`` takes numpy only).
"""

from diloco.sim.goodput import FailureModel, goodput, goodput_by_method
from diloco.sim.hardware import (
    GBIT,
    PAPER_EXCHANGE,
    PRESETS,
    ModelSpec,
    bandwidth_grid,
    latency_hops,
    preset,
    step_time_from_hardware,
)
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
    "FailureModel",
    "goodput",
    "goodput_by_method",
    "GBIT",
    "PAPER_EXCHANGE",
    "PRESETS",
    "ModelSpec",
    "bandwidth_grid",
    "latency_hops",
    "preset",
    "step_time_from_hardware",
    "TARGETS",
    "MethodSpec",
    "SweepResult",
    "bandwidth_needed",
    "data_parallel",
    "diloco",
    "paper_methods",
    "predict_utilization",
    "streaming",
    "sweep",
    "utilization_curve",
    "Network",
    "WallClock",
    "data_parallel_wallclock",
    "diloco_wallclock",
]
