"""The planner: from a model, hardware, workers, link and token budget to a recommended setting.

For every candidate (data-parallel; DiLoCo over H and codec; Streaming DiLoCo over H, fragment
size, tau and codec) and every link bandwidth asked about:

* **utilization**: the per-layer simulator (:func:`diloco.sim.utilization.utilization_curve`),
  at the given step time, exchange and release;
* **wall-clock**: steps x step time / utilization, steps = tokens / tokens per step;
* **bits per parameter**: the codec's exact payload for the model's N values x 8 / N
  (:func:`diloco.wire.sizes.payload_bytes`, the function the codecs' ``num_bytes`` use);
* **bytes**: what one worker sends over the run (:func:`diloco.traffic.exchange_bytes` of each
  exchange; DP every step, DiLoCo and Streaming DiLoCo the whole model once per H steps);
* **peak bandwidth**: the largest single exchange sent within one step (Streaming DiLoCo's
  measure: DiLoCo does not lower it, fragments divide it by about P);
* **bandwidth for 90 %**: the smallest bandwidth of the papers' grid at which the candidate
  reaches 90 % utilization;
* **eval loss**: :class:`diloco.sim.loss.LossModel` (scaling law plus ablation costs, each with
  its source).

Besides the papers' settings, the newer bandwidth settings are candidates: Streaming DiLoCo with the
statistical quantizers and SparseLoCo's top-k sent with error feedback (``stat4``, ``stat2``,
``topk``: the communicator all-gathers top-k at every M), and eager updates (tau = H: an exchange
may take a whole outer step). Their loss costs are this project's laptop-scale measurements (see
:mod:`diloco.sim.loss`), marked so.

The recommendation is the fastest candidate whose predicted loss is within ``tolerance`` of
data-parallel's and whose run takes at least :data:`diloco.outer_steps.MIN_OUTER_STEPS` outer steps (ties:
lower loss, then fewer bytes), with the outer momentum :data:`diloco.outer_steps.OUTER_MOMENTUM` names for its
method (both measured in studies/outer-steps). Pure numpy: no torch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from diloco.errors import ConfigError
from diloco.outer_steps import MIN_OUTER_STEPS, OUTER_MOMENTUM
from diloco.outer_steps import SOURCE as OUTER_STEPS_SOURCE
from diloco.sim.hardware import GBIT, PAPER_EXCHANGE, ModelSpec
from diloco.sim.loss import MEASURED_CODECS, MEASURED_MARK, LossEstimate, LossModel
from diloco.sim.utilization import MethodSpec, data_parallel, diloco, streaming, utilization_curve
from diloco.traffic import exchange_bytes
from diloco.wire.sizes import SPARSE_CODECS, bits_per_value

#: Codecs the planner considers by default: the papers' (costless at their scale) and the ones sent with
#: error feedback (:data:`diloco.sim.loss.MEASURED_CODECS`, charged their laptop-scale cost; Streaming
#: DiLoCo only, as measured). Their bits per parameter are not typed here: :func:`codec_bits` asks the
#: codecs' own byte function.
DEFAULT_CODECS: tuple[str, ...] = ("bf16", "fp8_e4m3", "fp4_e3m0", "stat4", "stat2", "topk")
DEFAULT_SYNC_EVERY = (30, 100, 300)
DEFAULT_OVERLAP = (0, 1, 5)
DEFAULT_FRAGMENT_LAYERS = (3,)
DEFAULT_TOLERANCE = 0.005
_SIMPLER = {"dp": 0, "diloco": 1, "streaming": 2}
#: Planner labels of the codecs sent with error feedback.
_CODEC_LABELS = {c: f"{c}+EF" for c in MEASURED_CODECS}


def codec_bits(codec: str, num_params: float) -> float:
    """Exact bits per parameter of ``codec`` for one payload of ``num_params`` values (scales, tables, indices
    included): ``payload_bytes * 8 / n``, from the byte function the codecs' ``num_bytes`` use."""
    n = max(1, round(num_params))
    return bits_per_value(codec, n)


#: The bandwidths (Gbit/s) on which "bandwidth for 90 %" is read: the papers' grid.
READ_GRID_GBPS = np.logspace(-2, 3, 61)


@dataclass(frozen=True)
class Candidate:
    """One setting: method, H, fragments (P counts the non-block fragment), tau and codec."""

    method: str  # "dp", "diloco" or "streaming"
    sync_every: int = 1
    num_fragments: int = 1
    fragment_layers: int | None = None
    overlap_steps: int = 0
    codec: str = "bf16"
    eager: bool = False  # eager updates: tau = H (overlap_steps is set to sync_every)

    def __post_init__(self) -> None:
        if self.eager:
            if self.method == "dp":
                raise ConfigError("eager updates are an outer-step setting: not for data-parallel")
            object.__setattr__(self, "overlap_steps", self.sync_every)

    @property
    def measured(self) -> bool:
        """Whether this setting's loss cost is a laptop-scale measurement (eager, or a codec sent with EF)."""
        return self.eager or self.codec in MEASURED_CODECS

    @property
    def exchange_override(self) -> str | None:
        """Sparse payloads (top-k) cannot be reduced in place: the communicator all-gathers them at every M."""
        return "all_gather" if self.codec in SPARSE_CODECS else None

    def bits_per_param(self, num_params: float) -> float:
        return codec_bits(self.codec, num_params)

    @property
    def label(self) -> str:
        codec = _CODEC_LABELS.get(self.codec, self.codec)
        if self.method == "dp":
            return f"DP {codec}"
        if self.method == "diloco":
            return f"{'Eager DiLoCo' if self.eager else 'DiLoCo'} H={self.sync_every} {codec}"
        if self.eager:
            return f"Eager H={self.sync_every} P={self.num_fragments} tau=H {codec}"
        return f"Streaming H={self.sync_every} P={self.num_fragments} tau={self.overlap_steps} {codec}"

    def spec(self, num_params: float) -> MethodSpec:
        """The simulator's view at ``num_params`` parameters (the exact bits per parameter depend on it)."""
        bits = self.bits_per_param(num_params)
        if self.method == "dp":
            return data_parallel(bits=bits, label=self.label)
        if self.method == "diloco":
            return diloco(sync_every=self.sync_every, bits=bits, label=self.label, eager=self.eager)
        return streaming(
            sync_every=self.sync_every,
            num_fragments=self.num_fragments,
            overlap_steps=self.overlap_steps,
            bits=bits,
            label=self.label,
            eager=self.eager,
        )

    @property
    def outer_momentum(self) -> float | None:
        """The outer momentum to run it with: :data:`diloco.outer_steps.OUTER_MOMENTUM` (None for DP)."""
        return None if self.method == "dp" else OUTER_MOMENTUM[self.method]

    def enough_outer_steps(self, steps: float) -> bool:
        """Whether a run of ``steps`` inner steps takes :data:`~diloco.outer_steps.MIN_OUTER_STEPS` outer steps."""
        return self.method == "dp" or steps / self.sync_every >= MIN_OUTER_STEPS

    def to_dict(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "method": self.method,
            "sync_every": self.sync_every,
            "num_fragments": self.num_fragments,
            "fragment_layers": self.fragment_layers,
            "overlap_steps": self.overlap_steps,
            "codec": self.codec,
            "eager": self.eager,
            "outer_momentum": self.outer_momentum,
            "measured_at_laptop_scale": self.measured,
        }


def candidates(
    num_layers: int,
    *,
    sync_every: Sequence[int] = DEFAULT_SYNC_EVERY,
    overlap: Sequence[int] = DEFAULT_OVERLAP,
    fragment_layers: Sequence[int] = DEFAULT_FRAGMENT_LAYERS,
    codecs: Sequence[str] = DEFAULT_CODECS,
    num_workers: int = 2,
    eager: bool = True,
) -> list[Candidate]:
    """DP (bf16); DiLoCo over H x codec; Streaming DiLoCo over H x fragment size x tau x codec; with ``eager``,
    eager updates (Streaming DiLoCo at tau = H) over H x fragment size x codec.

    The codecs sent with error feedback (:data:`~diloco.sim.loss.MEASURED_CODECS`) are tried with Streaming
    DiLoCo only (not with plain DiLoCo, nor eagerly): the settings the laptop-scale costs were measured in.
    """
    unknown = [c for c in codecs if c not in DEFAULT_CODECS]
    if unknown:
        raise ConfigError(f"unknown codec(s) {unknown}; the planner knows {', '.join(DEFAULT_CODECS)}")
    for name, values, low in (
        ("sync_every", sync_every, 1),
        ("overlap", overlap, 0),
        ("fragment_layers", fragment_layers, 1),
    ):
        if not values or any(not isinstance(v, int) or v < low for v in values):
            raise ConfigError(f"{name}={list(values)}: give whole numbers >= {low}")
    out = [Candidate("dp")]
    if num_workers < 2:
        return out
    dense = [c for c in codecs if c not in MEASURED_CODECS]
    for H in sync_every:
        for codec in dense:
            out.append(Candidate("diloco", sync_every=H, codec=codec))
    for H in sync_every:
        for k in fragment_layers:
            if k > num_layers:
                continue
            P = math.ceil(num_layers / k) + 1  # k-block fragments plus the non-block one (the trainer's layout)
            if P > H:
                continue
            for tau in overlap:
                if tau >= H:
                    continue
                for codec in codecs:
                    out.append(
                        Candidate(
                            "streaming",
                            sync_every=H,
                            num_fragments=P,
                            fragment_layers=k,
                            overlap_steps=tau,
                            codec=codec,
                        )
                    )
            if eager:
                for codec in dense:
                    out.append(
                        Candidate(
                            "streaming", sync_every=H, num_fragments=P, fragment_layers=k, codec=codec, eager=True
                        )
                    )
    return out


@dataclass(frozen=True)
class Setup:
    """What the planner is asked about."""

    model: ModelSpec
    step_time_source: str
    num_workers: int
    tokens: float
    tokens_per_step: float
    latency_s: float = 0.0
    exchange: str = PAPER_EXCHANGE
    overlap_backward: bool = True

    @property
    def steps(self) -> float:
        return self.tokens / self.tokens_per_step

    def to_dict(self) -> dict[str, Any]:
        m = self.model
        return {
            "model": {
                "name": m.name,
                "num_params": m.num_params,
                "num_layers": m.num_layers,
                "non_block_params": m.non_block_params,
                "step_time_s": m.step_time_s,
            },
            "step_time_source": self.step_time_source,
            "num_workers": self.num_workers,
            "tokens": self.tokens,
            "tokens_per_step": self.tokens_per_step,
            "steps": self.steps,
            "latency_s": self.latency_s,
            "exchange": self.exchange,
            "release": "per-layer" if self.overlap_backward else "after-step",
        }


@dataclass(frozen=True)
class Evaluated:
    """A candidate's predicted numbers at one bandwidth."""

    candidate: Candidate
    bandwidth_bps: float
    utilization: float
    wall_clock_s: float
    bytes_sent: float  # per worker over the run
    peak_gbps: float
    bandwidth_for_90_gbps: float | None
    loss: LossEstimate
    loss_vs_dp: float  # relative: loss / DP loss - 1
    bits: float = 16.0  # exact bits per parameter on the wire at the model's N

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.candidate.to_dict(),
            "bits": self.bits,
            "bandwidth_gbps": self.bandwidth_bps / GBIT,
            "utilization": self.utilization,
            "wall_clock_s": self.wall_clock_s,
            "bytes_sent": self.bytes_sent,
            "peak_gbps": self.peak_gbps,
            "bandwidth_for_90_gbps": self.bandwidth_for_90_gbps,
            "loss": self.loss.to_dict(),
            "loss_vs_dp": self.loss_vs_dp,
        }


@dataclass
class Plan:
    setup: Setup
    tolerance: float
    rows: dict[float, list[Evaluated]]  # bandwidth (bits/s) -> every candidate, fastest first
    recommended: dict[float, Evaluated]
    sources: dict[str, str] = field(default_factory=dict)
    #: The laptop-scale measurements charged to eager / error-feedback candidates (empty when none is a candidate).
    measured: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "setup": self.setup.to_dict(),
            "tolerance": self.tolerance,
            "sources": self.sources,
            **({"measured_at_laptop_scale": self.measured} if self.measured else {}),
            "bandwidths": [
                {
                    "bandwidth_gbps": bw / GBIT,
                    "recommended": self.recommended[bw].candidate.label,
                    "candidates": [e.to_dict() for e in rows],
                }
                for bw, rows in self.rows.items()
            ],
        }


def _payload_bytes(num_params: float, bits: float, setup: Setup, exchange: str | None = None) -> float:
    return exchange_bytes(
        payload_bytes=num_params * bits / 8.0, num_replicas=setup.num_workers, exchange=exchange or setup.exchange
    )


def _peak_params(model: ModelSpec, c: Candidate) -> float:
    """Parameters in the largest single exchange: the whole model, or the largest fragment."""
    if c.method != "streaming" or c.num_fragments == 1:
        return model.num_params
    per_layer = model.params_per_layer
    blocks = max(math.ceil(model.num_layers / (c.num_fragments - 1)), 1)
    return max(model.non_block_params, blocks * per_layer)


def evaluate(
    setup: Setup,
    cands: Sequence[Candidate],
    bandwidths_bps: Sequence[float],
    loss_model: LossModel,
    *,
    tolerance: float = DEFAULT_TOLERANCE,
) -> Plan:
    """Every candidate at every bandwidth, and the recommendation at each."""
    if not (math.isfinite(tolerance) and tolerance >= 0):
        raise ConfigError(f"tolerance={tolerance!r}: give a relative loss tolerance >= 0, e.g. 0.005 for 0.5 %")
    bws = np.array(sorted(set(float(b) for b in bandwidths_bps)))
    if bws.size == 0 or np.any(~(bws > 0)):
        raise ConfigError(f"bandwidths must be positive bits/s, got {list(bandwidths_bps)}")
    if not any(c.method == "dp" for c in cands):
        raise ConfigError("the candidates must include data-parallel: the loss tolerance is relative to it")
    model, M, T = setup.model, setup.num_workers, setup.model.step_time_s
    read_grid = READ_GRID_GBPS * GBIT
    bits = {c: c.bits_per_param(model.num_params) for c in cands}
    losses = {
        c: loss_model.estimate(
            method=c.method,
            num_params=model.num_params,
            replicas=M,
            tokens=setup.tokens,
            sync_every=c.sync_every,
            num_fragments=c.num_fragments,
            fragment_layers=c.fragment_layers,
            overlap_steps=c.overlap_steps,
            bits=bits[c],
            codec=c.codec,
            eager=c.eager,
        )
        for c in cands
    }
    dp_loss = next(losses[c].loss for c in cands if c.method == "dp")
    rows: dict[float, list[Evaluated]] = {float(b): [] for b in bws}
    for c in cands:
        exchange = c.exchange_override or setup.exchange
        if M == 1:  # one worker: nothing crosses the link
            cu = np.ones(bws.size + read_grid.size)
        else:
            cu = utilization_curve(
                model,
                c.spec(model.num_params),
                np.concatenate([bws, read_grid]),
                latency_s=setup.latency_s,
                num_workers=M,
                overlap_backward=setup.overlap_backward,
                exchange=exchange,
            )
        hit = np.flatnonzero(cu[bws.size :] >= 0.9 - 1e-12)
        bw90 = float(READ_GRID_GBPS[hit[0]]) if hit.size else None
        syncs = setup.steps / c.sync_every
        sent = 0.0 if M == 1 else _payload_bytes(model.num_params, bits[c], setup, exchange) * syncs
        peak = 0.0 if M == 1 else 8 * _payload_bytes(_peak_params(model, c), bits[c], setup, exchange) / T / GBIT
        for i, bw in enumerate(bws):
            u = float(cu[i])
            rows[float(bw)].append(
                Evaluated(
                    c,
                    float(bw),
                    u,
                    setup.steps * T / u,
                    sent,
                    peak,
                    bw90,
                    losses[c],
                    losses[c].loss / dp_loss - 1,
                    bits[c],
                )
            )
    recommended = {}
    for bw, evs in rows.items():
        evs.sort(key=lambda e: (e.wall_clock_s, e.loss.loss, e.bytes_sent))
        # a setting with fewer outer steps than the outer-steps rule is shown but never recommended
        ok = [e for e in evs if e.loss_vs_dp <= tolerance + 1e-12 and e.candidate.enough_outer_steps(setup.steps)]
        # ties within 0.1 % of wall-clock go to the lower loss, then a setting whose cost is published (not only
        # measured at laptop scale), then fewer bytes, then the simpler method
        best = min(e.wall_clock_s for e in ok)
        near = [e for e in ok if e.wall_clock_s <= best * 1.001]
        recommended[bw] = min(
            near,
            key=lambda e: (
                e.loss.loss,
                e.candidate.measured,
                e.bytes_sent,
                _SIMPLER[e.candidate.method],
                e.candidate.overlap_steps,
            ),
        )
    sources = {
        "utilization": "diloco.sim per-layer simulator (Streaming DiLoCo's model: forward, backward, one FIFO link; "
        f"exchange {setup.exchange}, release {'per-layer' if setup.overlap_backward else 'after-step'}, "
        f"latency {setup.latency_s:g} s per hop, pipelined)",
        "step_time": setup.step_time_source,
        "wall_clock": f"steps x step time / utilization, steps = {setup.tokens:.4g} tokens / "
        f"{setup.tokens_per_step:.4g} tokens per step = {setup.steps:.4g}",
        "bits": "each codec's exact payload for the model's N values x 8 / N (diloco.wire.sizes, the "
        "function the codecs' num_bytes use)",
        "bytes": "diloco.traffic.exchange_bytes per exchange x exchanges over the run (per worker, sent; top-k "
        "payloads all-gathered at every M, as the communicator does)",
        "peak": "the largest single exchange (whole model, or the largest fragment) sent within one step",
        "bandwidth_for_90": f"smallest of {READ_GRID_GBPS.size} log-spaced bandwidths "
        f"{READ_GRID_GBPS[0]:g}..{READ_GRID_GBPS[-1]:g} Gbit/s where the simulator gives >= 90 %",
        "outer_steps": f"recommended only with >= {MIN_OUTER_STEPS} outer steps over the run, and with outer "
        f"momentum {OUTER_MOMENTUM} per method: {OUTER_STEPS_SOURCE}",
        "loss_law": loss_model.source,
        "ablations": loss_model.ablations,
    }
    measured = loss_model.measured() if any(c.measured for c in cands) else {}
    if measured:
        m = measured
        sources["measured"] = (
            f"{MEASURED_MARK}: the loss costs of eager updates (tau = H) and of stat4 / stat2 / "
            f"topk with error feedback come from {m['source']} ({m['setting']})"
        )
    return Plan(setup, tolerance, rows, recommended, sources, measured)


__all__ = [
    "DEFAULT_CODECS",
    "Candidate",
    "DEFAULT_OVERLAP",
    "DEFAULT_SYNC_EVERY",
    "DEFAULT_TOLERANCE",
    "Evaluated",
    "Plan",
    "Setup",
    "candidates",
    "codec_bits",
    "evaluate",
]
