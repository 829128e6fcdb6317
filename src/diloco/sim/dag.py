"""The per-layer DAG of one worker's training, simulated over a grid of link bandwidths at once.

What is modelled (Streaming DiLoCo's simulator, as reconstructed in PAPERS.md)
-----------------------------------------------------------------------------
* **Compute** is one serial stream per inner step: forward of layers 1..L, then
  for layers L..1 the backward w.r.t. activations followed by the backward
  w.r.t. parameters. Layer 1's activation-backward is dropped (nothing below
  it needs that gradient), so a step has 3L - 1 nodes; each takes an equal
  share of the step time (forward : activation-backward : parameter-backward
  = 1 : 1 : 1).
* **Communication** goes over one FIFO link per worker. The reduction of a
  unit (one layer, or the non-block parameters) is *released* when that
  unit's parameter-backward finishes in the step its sync starts; it holds
  the link for ``bits / bandwidth`` seconds once the link is free, and
  completes ``latency`` seconds after its last bit is sent. Latency is
  pipelined: it delays a message's completion but does not hold the link, so
  the next message starts sending at once (``latency`` is the whole
  exchange's, e.g. one hop's latency times the hops of a ring: see
  :func:`diloco.sim.hardware.latency_hops`).
* **Who reduces when** is asked of :class:`diloco.algorithm.schedule.Schedule`,
  the one the trainer runs: fragments in ``schedule.starts(t)`` release their
  units during step t; fragments in ``schedule.finishes(t - 1)`` gate step t.
  A gate makes compute wait for the unit's reduction:

  - ``tau = 0`` (data-parallel, DiLoCo, Streaming DiLoCo): before that unit's
    forward in step t. The reduction overlaps with the forward of the layers
    before it, as data-parallel gradient bucketing does.
  - ``tau >= 1`` (overlapping communication): the outer step and merge run at
    the step boundary after step ``t_start + tau``, so every unit of the
    fragment gates the *start* of step ``t_start + tau + 1``.
  - ``tau = H`` (eager updates): the same rule, so a whole outer step of compute
    hides the exchange; the fragment's next reduction is released in step
    ``t_start + H``, before that gate, and each gate waits for its own
    reduction (completions are kept per unit and start step).

  The non-block unit (embeddings, head, final norm) is released at the end of
  the backward and gates the first forward.

Compute utilization = compute time / wall-clock time over one period of the
schedule (H steps) in the steady state. Both workers are identical, so one
is simulated; the number of workers enters through the bits each puts on
its link (:func:`diloco.traffic.exchange_bytes`) and the latency hops.

Why it is fast: time only needs care around events. Between two events the
clock advances by the nominal compute time, steps with no event advance by
one step time, and every quantity is a numpy vector over the bandwidth grid,
so a whole sweep costs one pass over the events of a few periods.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from diloco.algorithm.schedule import Schedule
from diloco.errors import ConfigError

_RELEASE, _GATE = 0, 1  # at equal offsets a release (end of a node) precedes a gate (start of the next)


@dataclass(frozen=True)
class ComputeStream:
    """One worker's serial compute in one inner step (layers indexed 0..L-1 from the input)."""

    num_layers: int
    step_time_s: float

    def __post_init__(self) -> None:
        if not isinstance(self.num_layers, int) or self.num_layers < 1:
            raise ConfigError(f"num_layers must be a positive int, got {self.num_layers!r}")
        if not (np.isfinite(self.step_time_s) and self.step_time_s > 0):
            raise ConfigError(f"step_time_s must be a positive number of seconds, got {self.step_time_s!r}")

    @property
    def num_nodes(self) -> int:
        return 3 * self.num_layers - 1

    @property
    def node_time_s(self) -> float:
        return self.step_time_s / self.num_nodes

    def forward_start(self, layer: int) -> float:
        """Offset within the step at which ``layer``'s forward begins."""
        return layer * self.node_time_s

    def param_backward_end(self, layer: int) -> float:
        """Offset within the step at which ``layer``'s parameter gradient is ready."""
        L, d = self.num_layers, self.node_time_s
        if layer == 0:
            return self.step_time_s
        return (L + 2 * (L - layer)) * d


@dataclass(frozen=True)
class SyncPlan:
    """What is reduced: transfer units, their sizes, and the fragments the schedule moves.

    Units ``0 .. L-1`` are the layers; unit ``L`` (if present) is the non-block
    parameters. ``fragment_units[p]`` lists the units of schedule fragment p.
    ``unit_bits[u]`` is what one worker puts on its link to reduce unit u.

    ``overlap_backward`` says when reductions may start and what they hold up:
    True (the papers' simulator; bucketed DDP) releases each layer's reduction
    when its parameter-backward finishes and, at tau = 0, gates that layer's
    next forward. False models this project's ``DataParallel`` and
    ``StreamingDiLoCo``, which exchange whole payloads after the step's backward
    (DP) or optimizer step (DiLoCo): every unit is released at the end of the
    step and gates the start of the step it is due in.
    """

    schedule: Schedule
    fragment_units: tuple[tuple[int, ...], ...]
    unit_bits: tuple[float, ...]
    overlap_backward: bool = True

    def __post_init__(self) -> None:
        if len(self.fragment_units) != self.schedule.num_fragments:
            raise ConfigError(
                f"{len(self.fragment_units)} fragments given but the schedule has {self.schedule.num_fragments}"
            )
        units = [u for frag in self.fragment_units for u in frag]
        if len(units) != len(set(units)):
            raise ConfigError(f"a unit is in two fragments: {self.fragment_units}")
        if not all(0 <= u < len(self.unit_bits) for u in units):
            raise ConfigError(f"fragments name units outside 0..{len(self.unit_bits) - 1}: {self.fragment_units}")


def _step_events(stream: ComputeStream, plan: SyncPlan, starts: Sequence[int], gated: Sequence[int]) -> list:
    """Sorted (offset, kind, unit) events of one step; units that send nothing are skipped."""
    L = stream.num_layers
    tau = plan.schedule.overlap_steps
    whole_step = not plan.overlap_backward  # exchanges after the step, never inside it
    events = []
    for p in gated:
        for u in plan.fragment_units[p]:
            if plan.unit_bits[u] > 0:
                at = 0.0 if (tau > 0 or u == L or whole_step) else stream.forward_start(u)
                events.append((at, _GATE, u))
    for p in starts:
        for u in plan.fragment_units[p]:
            if plan.unit_bits[u] > 0:
                at = stream.step_time_s if (u == L or whole_step) else stream.param_backward_end(u)
                events.append((at, _RELEASE, u))
    events.sort()
    return events


def simulate_utilization(
    stream: ComputeStream,
    plan: SyncPlan,
    bandwidth_bps: np.ndarray | Sequence[float] | float,
    *,
    latency_s: float = 0.0,
    max_periods: int = 200,
    rtol: float = 1e-12,
) -> np.ndarray:
    """Steady-state compute utilization for each bandwidth (bits/s), as an array of the same length.

    Periods of H steps are simulated until two consecutive ones take the same
    time (to ``rtol``) at every bandwidth; if that never happens within
    ``max_periods`` the mean over the second half of the run is returned.
    """
    bw = np.atleast_1d(np.asarray(bandwidth_bps, dtype=float))
    if bw.ndim != 1 or not np.all(bw > 0):
        raise ConfigError(f"bandwidth_bps must be positive (bits/s), got {bandwidth_bps!r}")
    if not (latency_s >= 0 and np.isfinite(latency_s)):
        raise ConfigError(f"latency_s must be >= 0 seconds, got {latency_s!r}")
    if len(plan.unit_bits) not in (stream.num_layers, stream.num_layers + 1):
        raise ConfigError(
            f"the plan has {len(plan.unit_bits)} units for {stream.num_layers} layers; "
            f"give one per layer, plus optionally the non-block parameters"
        )
    sched = plan.schedule
    H, T = sched.sync_every, stream.step_time_s

    bits = np.asarray(plan.unit_bits, dtype=float)
    transfer = bits[:, None] / bw[None, :]  # (units, bandwidths) seconds the link is busy
    clock = np.zeros(bw.size)  # this worker's wall clock
    link_free = np.zeros(bw.size)  # when the link finishes its last queued reduction
    # When each reduction in flight completes, by (unit, step it was released in): with tau = H a unit's
    # next reduction is released before the gate of the previous one.
    done: dict[tuple[int, int], np.ndarray] = {}
    tau = sched.overlap_steps

    cache: dict[tuple, list] = {}
    periods: list[np.ndarray] = []  # wall-clock length of each simulated period
    step = 1
    converged = False
    for _ in range(max_periods):
        for _ in range(H):
            starts, gated = sched.starts(step), sched.finishes(step - 1)
            key = (starts, gated)
            if key not in cache:
                cache[key] = _step_events(stream, plan, starts, gated)
            events = cache[key]
            if not events:
                clock = clock + T
            else:
                pos = 0.0  # nominal offset within the step that `clock` corresponds to
                for at, kind, u in events:
                    clock = clock + (at - pos)
                    pos = at
                    if kind == _GATE:  # the reduction released tau + 1 steps ago, in step `step - 1 - tau`
                        clock = np.maximum(clock, done.pop((u, step - 1 - tau)))
                    else:  # FIFO: starts when released and the link is free
                        link_free = np.maximum(link_free, clock) + transfer[u]
                        done[(u, step)] = link_free + latency_s  # pipelined: latency delays, never blocks
                clock = clock + (T - pos)
            step += 1
        periods.append(clock)
        # Rebase every time to the period's end: keeps numbers small, so period lengths stay exact.
        link_free = link_free - clock
        done = {key: t - clock for key, t in done.items()}
        clock = np.zeros(bw.size)
        # with tau = H the first gate falls in the third period: compare only once it has run
        if len(periods) >= (3 if tau >= H else 2) and np.all(np.abs(periods[-1] - periods[-2]) <= rtol * periods[-1]):
            converged = True
            break
    if converged:
        wall = periods[-1]
    else:
        wall = np.mean(periods[len(periods) // 2 :], axis=0)
    # Summing step times can leave wall a rounding error below H T when nothing stalls.
    return np.minimum(H * T / wall, 1.0)


__all__ = ["ComputeStream", "SyncPlan", "simulate_utilization"]
