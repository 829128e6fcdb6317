"""Compute utilization of data-parallel, DiLoCo and Streaming DiLoCo at a given bandwidth.

The public entry points:

* :class:`MethodSpec` and its constructors (:func:`data_parallel`,
  :func:`diloco`, :func:`streaming`, :func:`paper_methods`) say what is synced
  and when (H, P, tau, bits);
* :func:`utilization_curve` gives utilization over an array of bandwidths;
* :func:`predict_utilization` is the one-number form for a measured setup
  (step time, parameters, bits, link bandwidth and latency);
* :func:`bandwidth_needed` reads off the smallest grid bandwidth reaching each
  target utilization, the way the papers' tables do; :func:`sweep` does all of
  it for several methods.

Fragments follow the trainer's convention (``diloco.algorithm.fragments``):
with P = 1 everything is one fragment; with P >= 2 fragment 0 holds the
non-block parameters and the L blocks are split into P - 1 groups, block i in
group ``i mod (P-1)`` (strided) or in contiguous runs (sequential).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from diloco.algorithm.schedule import Schedule
from diloco.errors import ConfigError
from diloco.layout import PATTERNS, block_fragments
from diloco.methods import SYNCHRONOUS_METHODS as METHODS  # decoupled learners are not modelled here
from diloco.sim.dag import ComputeStream, SyncPlan, simulate_utilization
from diloco.sim.hardware import GBIT, PAPER_EXCHANGE, ModelSpec, latency_hops
from diloco.traffic import exchange_bytes

#: Target utilizations of the papers' tables.
TARGETS: tuple[float, ...] = (0.5, 0.8, 0.9, 0.95, 0.99)


@dataclass(frozen=True)
class MethodSpec:
    """How a method syncs: H = ``sync_every``, P = ``num_fragments``, tau = ``overlap_steps``.

    Data-parallel is H = 1, P = 1, tau = 0 (every step every layer is reduced).
    ``bits`` is bits per parameter on the wire (16 for bf16, 4 for FP4).
    ``fragment_spacing`` = s makes fragment p first sync after step (p+1)*s
    (the paper's "one fragment every s steps"); None uses the schedule's even
    spread, the trainer's default. ``eager``: eager updates, with ``overlap_steps = sync_every``
    (a whole outer step hides each exchange).
    """

    label: str
    sync_every: int = 1
    num_fragments: int = 1
    overlap_steps: int = 0
    bits: float = 16.0
    fragment_pattern: str = "strided"
    fragment_spacing: int | None = None
    eager: bool = False
    schedule: Schedule = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not (np.isfinite(self.bits) and self.bits > 0):
            raise ConfigError(f"bits must be > 0 (bits per parameter on the wire), got {self.bits!r}")
        if self.fragment_pattern not in PATTERNS:
            raise ConfigError(f"fragment_pattern must be 'strided' or 'sequential', got {self.fragment_pattern!r}")
        offsets = None
        if self.fragment_spacing is not None:
            s, P, H = self.fragment_spacing, self.num_fragments, self.sync_every
            if not 1 <= s * P <= H:
                raise ConfigError(
                    f"fragment_spacing={s} with P={P} fragments needs 1 <= s*P <= H={H}; use s <= {H // max(P, 1)}"
                )
            offsets = tuple((p + 1) * s for p in range(P))
        sched = Schedule(self.sync_every, self.num_fragments, self.overlap_steps, offsets=offsets, eager=self.eager)
        object.__setattr__(self, "schedule", sched)


def data_parallel(*, bits: float = 16.0, label: str = "Data-Parallel") -> MethodSpec:
    return MethodSpec(label, sync_every=1, bits=bits)


def diloco(
    *, sync_every: int, bits: float = 16.0, overlap_steps: int = 0, label: str = "DiLoCo", eager: bool = False
) -> MethodSpec:
    """DiLoCo; ``eager=True`` runs eager updates (tau = H, whatever ``overlap_steps`` says)."""
    tau = sync_every if eager else overlap_steps
    return MethodSpec(label, sync_every=sync_every, overlap_steps=tau, bits=bits, eager=eager)


def streaming(
    *,
    sync_every: int,
    num_fragments: int,
    overlap_steps: int = 0,
    bits: float = 16.0,
    fragment_pattern: str = "strided",
    fragment_spacing: int | None = None,
    label: str = "Streaming DiLoCo",
    eager: bool = False,
) -> MethodSpec:
    """Streaming DiLoCo; ``eager=True`` runs eager updates (tau = H, whatever ``overlap_steps`` says)."""
    tau = sync_every if eager else overlap_steps
    return MethodSpec(label, sync_every, num_fragments, tau, bits, fragment_pattern, fragment_spacing, eager)


def paper_fragments(num_layers: int, fragment_layers: int = 3) -> int:
    """P for blocks of ``fragment_layers`` layers each, plus the non-block fragment: ceil(L/k) + 1."""
    if fragment_layers < 1 or fragment_layers > num_layers:
        raise ConfigError(f"fragment_layers must lie in 1..num_layers={num_layers}, got {fragment_layers}")
    return math.ceil(num_layers / fragment_layers) + 1


def paper_methods(
    num_layers: int,
    *,
    sync_every: int = 100,
    fragment_layers: int = 3,
    overlap_steps: int = 1,
    bits: float = 16.0,
    low_bits: float = 4.0,
) -> list[MethodSpec]:
    """Streaming DiLoCo Table 4's five rows for a model of ``num_layers`` layers.

    Streaming fragments hold ``fragment_layers`` blocks (strided) plus the
    non-block fragment, one fragment every floor(H / P) steps, as the paper's
    "one fragment every 11 / 5 / 2 steps" for 1B / 10B / 100B says.
    """
    P = paper_fragments(num_layers, fragment_layers)
    spacing = sync_every // P
    if spacing < 1:
        raise ConfigError(f"{P} fragments do not fit in H={sync_every} steps; raise H or fragment_layers")
    stream = dict(sync_every=sync_every, num_fragments=P, fragment_spacing=spacing)
    return [
        data_parallel(bits=bits),
        diloco(sync_every=sync_every, bits=bits),
        streaming(**stream, bits=bits, label="Streaming DiLoCo"),
        streaming(**stream, bits=bits, overlap_steps=overlap_steps, label="+ overlap"),
        streaming(**stream, bits=low_bits, overlap_steps=overlap_steps, label=f"+ overlap + {low_bits:g}-bit"),
    ]


def fragment_units(num_layers: int, num_fragments: int, pattern: str = "strided") -> tuple[tuple[int, ...], ...]:
    """Units (layers 0..L-1, non-block = L) of each fragment, in the trainer's layout (:func:`diloco.layout.block_fragments`)."""
    L, P = num_layers, num_fragments
    if P == 1:
        return (tuple(range(L + 1)),)
    frag = block_fragments(L, P, pattern)
    return ((L,), *(tuple(i for i in range(L) if frag[i] == p) for p in range(1, P)))


def link_bits_per_param(bits: float, num_workers: int, exchange: str = PAPER_EXCHANGE) -> float:
    """Bits one worker's link carries (each way) per parameter synced: :func:`diloco.traffic.exchange_bytes`."""
    return 8.0 * exchange_bytes(payload_bytes=bits / 8.0, num_replicas=num_workers, exchange=exchange)


def build_plan(
    model: ModelSpec,
    method: MethodSpec,
    *,
    num_workers: int = 2,
    overlap_backward: bool = True,
    exchange: str = PAPER_EXCHANGE,
) -> SyncPlan:
    """The transfer units and their bits on one worker's link for ``method`` on ``model``.

    ``overlap_backward``: see :class:`~diloco.sim.dag.SyncPlan` (True: the papers' per-layer
    release; False: whole-payload exchanges after the step, as this project's trainer does).
    ``exchange``: how the payload is reduced (:mod:`diloco.traffic`); the papers assume an
    all-reduce at its bandwidth limit ("reduce_scatter", 2(M-1)/M); at M = 2 both exchanges send
    the whole payload once.
    """
    per_param = link_bits_per_param(method.bits, num_workers, exchange)
    unit_bits = (model.params_per_layer * per_param,) * model.num_layers + (model.non_block_params * per_param,)
    units = fragment_units(model.num_layers, method.num_fragments, method.fragment_pattern)
    return SyncPlan(method.schedule, units, unit_bits, overlap_backward=overlap_backward)


def utilization_curve(
    model: ModelSpec,
    method: MethodSpec,
    bandwidth_bps: np.ndarray | Sequence[float],
    *,
    latency_s: float = 0.0,
    num_workers: int = 2,
    overlap_backward: bool = True,
    exchange: str = PAPER_EXCHANGE,
) -> np.ndarray:
    """Steady-state compute utilization at each bandwidth (bits/s) of one worker's cross-datacenter link.

    ``latency_s`` is one hop's latency; an exchange among M workers pays it
    :func:`~diloco.sim.hardware.latency_hops` times (pipelined: see :mod:`diloco.sim.dag`).
    """
    if not (latency_s >= 0 and np.isfinite(latency_s)):
        raise ConfigError(f"latency_s must be >= 0 seconds, got {latency_s!r}")
    stream = ComputeStream(model.num_layers, model.step_time_s)
    plan = build_plan(model, method, num_workers=num_workers, overlap_backward=overlap_backward, exchange=exchange)
    hops = latency_hops(exchange, num_workers)
    return simulate_utilization(stream, plan, bandwidth_bps, latency_s=latency_s * hops)


def predict_utilization(
    *,
    method: str,
    num_params: float,
    num_layers: int,
    step_time_s: float,
    bandwidth_bps: float,
    latency_s: float = 0.0,
    sync_every: int = 1,
    num_fragments: int = 1,
    overlap_steps: int = 0,
    bits: float = 16.0,
    num_workers: int = 2,
    non_block_params: float = 0.0,
    fragment_pattern: str = "strided",
    overlap_backward: bool = True,
    exchange: str = PAPER_EXCHANGE,
    eager: bool = False,
) -> float:
    """Predicted compute utilization (0..1] of one configuration at one link bandwidth.

    ``method`` is ``"dp"`` (gradients reduced every step; leave H, P, tau at
    their defaults), ``"diloco"`` (P = 1) or ``"streaming"``. The other
    arguments are the run's measured or configured values: step time in
    seconds (compute only, without communication), bandwidth in bits/s,
    latency in seconds per hop (pipelined; an exchange among M workers pays
    :func:`~diloco.sim.hardware.latency_hops` hops), bits per parameter on
    the wire, and the parameters outside the repeated blocks. ``exchange``
    names how the payload is reduced (:mod:`diloco.traffic`; the papers'
    all-reduce is "reduce_scatter", this project's default at M = 2 is
    "all_gather": the same bytes at M = 2).
    ``num_fragments`` counts fragment 0 (non-block parameters) as the trainer does.
    ``eager=True``: eager updates, which need ``overlap_steps == sync_every`` (as the library's).
    ``overlap_backward=False`` predicts this project's ``DataParallel`` / ``StreamingDiLoCo``,
    which exchange whole payloads after the step instead of layer by layer during the backward.
    """
    if method not in METHODS:
        raise ConfigError(f"method must be one of {', '.join(METHODS)}, got {method!r}")
    if method == "dp" and (sync_every, num_fragments, overlap_steps) != (1, 1, 0):
        raise ConfigError(
            f"data-parallel reduces every step: leave sync_every=1, num_fragments=1, overlap_steps=0 "
            f"(got {sync_every}, {num_fragments}, {overlap_steps}); use method='diloco' or 'streaming'"
        )
    if method == "diloco" and num_fragments != 1:
        raise ConfigError(
            f"DiLoCo syncs all parameters at once (num_fragments=1), got {num_fragments}; use method='streaming'"
        )
    if eager and overlap_steps != sync_every:
        raise ConfigError(
            f"eager updates overlap a whole round: overlap_steps must equal sync_every "
            f"({sync_every}), got {overlap_steps}"
        )
    model = ModelSpec(num_layers, float(num_params), float(step_time_s), float(non_block_params))
    spec = MethodSpec(method, sync_every, num_fragments, overlap_steps, float(bits), fragment_pattern, eager=eager)
    cu = utilization_curve(
        model,
        spec,
        [float(bandwidth_bps)],
        latency_s=latency_s,
        num_workers=num_workers,
        overlap_backward=overlap_backward,
        exchange=exchange,
    )
    return float(cu[0])


def bandwidth_needed(
    bandwidth_bps: np.ndarray, utilization: np.ndarray, targets: Sequence[float] = TARGETS
) -> np.ndarray:
    """For each target, the smallest grid bandwidth (bits/s) whose utilization reaches it; NaN if none."""
    bw, cu = np.asarray(bandwidth_bps, dtype=float), np.asarray(utilization, dtype=float)
    if bw.shape != cu.shape or np.any(np.diff(bw) <= 0):
        raise ConfigError("bandwidth_bps must be increasing and the same shape as utilization")
    out = np.full(len(targets), np.nan)
    for i, q in enumerate(targets):
        hit = np.flatnonzero(cu >= q - 1e-12)  # tolerance: a curve that is exactly q reaches q
        if hit.size:
            out[i] = bw[hit[0]]
    return out


@dataclass(frozen=True)
class SweepResult:
    """Utilization curves and bandwidth-needed table of several methods on one model."""

    model: ModelSpec
    bandwidth_bps: np.ndarray
    curves: dict[str, np.ndarray]
    needed_bps: dict[str, np.ndarray]
    targets: tuple[float, ...]

    def to_dict(self) -> dict:
        def gbps(a: np.ndarray) -> list[float | None]:
            return [None if np.isnan(x) else float(x) / GBIT for x in a]

        return {
            "model": {
                "name": self.model.name,
                "num_layers": self.model.num_layers,
                "num_params": self.model.num_params,
                "non_block_params": self.model.non_block_params,
                "step_time_s": self.model.step_time_s,
            },
            "targets": list(self.targets),
            "bandwidth_gbps": gbps(self.bandwidth_bps),
            "utilization": {k: [float(x) for x in v] for k, v in self.curves.items()},
            "bandwidth_needed_gbps": {k: gbps(v) for k, v in self.needed_bps.items()},
        }


def sweep(
    model: ModelSpec,
    methods: Sequence[MethodSpec],
    bandwidth_bps: np.ndarray,
    *,
    latency_s: float = 0.0,
    num_workers: int = 2,
    targets: Sequence[float] = TARGETS,
    overlap_backward: bool = True,
    exchange: str = PAPER_EXCHANGE,
) -> SweepResult:
    """Curves and the table of bandwidth needed per target for each method."""
    labels = [m.label for m in methods]
    if len(set(labels)) != len(labels):
        raise ConfigError(f"method labels must be distinct, got {labels}")
    bw = np.asarray(bandwidth_bps, dtype=float)
    curves = {
        m.label: utilization_curve(
            model,
            m,
            bw,
            latency_s=latency_s,
            num_workers=num_workers,
            overlap_backward=overlap_backward,
            exchange=exchange,
        )
        for m in methods
    }
    needed = {k: bandwidth_needed(bw, c, targets) for k, c in curves.items()}
    return SweepResult(model, bw, curves, needed, tuple(targets))


__all__ = [
    "TARGETS",
    "MethodSpec",
    "data_parallel",
    "diloco",
    "streaming",
    "paper_fragments",
    "paper_methods",
    "fragment_units",
    "link_bits_per_param",
    "build_plan",
    "utilization_curve",
    "predict_utilization",
    "bandwidth_needed",
    "SweepResult",
    "sweep",
]
