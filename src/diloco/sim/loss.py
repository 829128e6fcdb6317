"""Predicted eval loss of a training setting, and where each part of the prediction comes from.

    loss = law(N, M, D) x (1 + cost of H) x (1 + cost of fragments) x (1 + cost of tau) x (1 + cost of bits)

* **The law** is a fitted scaling law: by default the Scaling Laws for DiLoCo paper's Table 4 put
  through ``diloco fit`` (per-method laws with an offset C; the packaged ``data/paper_fit.json``),
  or a user's own ``diloco fit`` output. DP uses the "dp" law; DiLoCo and Streaming DiLoCo use
  DiLoCo's law for M replicas at H = 30 (the paper's setting). Its 90 % bootstrap interval is
  carried along. Another token budget than the fit's tokens per parameter, an N outside the fitted
  sizes, or an M without its own law are said in the notes (extrapolations).
* **The costs** (relative loss increases) come from the papers' ablations or this project's own
  measured runs (``data/ablations.json``, each with its raw numbers and source):

  - H: the log-slope of loss in H from Streaming DiLoCo's Table 5 (H = 30 vs 100) up to 100, and
    DiLoCo's H = 50 vs 1000 beyond; outside 30..1000 an extrapolation.
  - fragments: Streaming DiLoCo Table 5's DiLoCo H = 30 vs Streaming H = 30 (3-block fragments);
    another fragment size is an extrapolation.
  - tau: < 0.2 % up to tau = 10 (Streaming DiLoCo), charged as 0.02 % per step; beyond 10 extrapolated.
  - bits: FP4 / FP8 / BF16 outer gradients cost nothing (Streaming DiLoCo); below 4 bits extrapolated.

  ``ablations="project"`` takes the H slope and the streaming-vs-DiLoCo cost from this project's
  quality runs (laptop scale), and tau / bits from the paper.
* **The newer bandwidth settings** have no published ablation at these sizes: the statistical
  quantizers with error feedback (``stat4``, ``stat2``), SparseLoCo's top-k (``topk``) and eager
  updates (tau = H) are charged what this project measured at laptop scale
  (``studies/frontier/frontier-summary.json``, copied into ``data/ablations.json``): each one's eval
  loss against Streaming FP4 tau = 1 run in the same study, never less than 0 (a one-seed gain is not
  credited). These terms are always marked extrapolated: laptop scale is far from the planned model.

Pure numpy: no torch, no scipy.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from diloco.errors import ConfigError
from diloco.methods import SYNCHRONOUS_METHODS
from diloco.scaling.fitted import ScalingFit

#: The reference H of the DiLoCo laws (the paper sweeps at H = 30).
LAW_SYNC_EVERY = 30
ABLATION_SETS = ("paper", "project")
#: Codecs whose loss cost is this project's laptop-scale measurement, and the frontier study's run of each
#: (they are sent with error feedback).
MEASURED_CODECS: dict[str, str] = {"stat4": "stat4-ef0.9", "stat2": "stat2-ef0.9", "topk": "topk-sparseloco"}
#: The frontier study's run of eager updates (tau = H) the planner charges.
MEASURED_EAGER = "eager-fp4-mom0.5"
#: How every such cost is marked.
MEASURED_MARK = "measured at laptop scale"


@dataclass(frozen=True)
class Term:
    """One factor of a predicted loss: ``1 + relative`` from ``source``; ``extrapolated`` if outside its data."""

    name: str
    relative: float
    source: str
    extrapolated: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "relative": self.relative, "source": self.source, "extrapolated": self.extrapolated}


@dataclass(frozen=True)
class LossEstimate:
    loss: float
    interval: tuple[float, float] | None  # 90 % bootstrap interval of the law, scaled by the same factors
    law: str  # which law: e.g. "power+C:diloco-m2"
    law_source: str
    notes: tuple[str, ...]  # the law's own notes (extrapolations in N, M, tokens)
    terms: tuple[Term, ...] = field(default=())

    @property
    def extrapolated(self) -> bool:
        return any(t.extrapolated for t in self.terms) or any("extrapolation" in n for n in self.notes)

    def to_dict(self) -> dict[str, Any]:
        return {
            "loss": self.loss,
            "interval": None if self.interval is None else list(self.interval),
            "law": self.law,
            "law_source": self.law_source,
            "notes": list(self.notes),
            "terms": [t.to_dict() for t in self.terms],
            "extrapolated": self.extrapolated,
        }


def _data(name: str) -> Any:
    return json.loads((resources.files("diloco.sim.data") / name).read_text(encoding="utf-8"))


class LossModel:
    """Scaling law plus ablation costs. ``LossModel.paper()`` or ``LossModel.from_fit_file(path)``."""

    def __init__(self, fit: ScalingFit, *, source: str, ablations: str = "paper") -> None:
        if ablations not in ABLATION_SETS:
            raise ConfigError(f"ablations={ablations!r}: choose one of {', '.join(ABLATION_SETS)}")
        if "dp" not in fit.loss_laws and "dp" not in fit.loss_laws_c:
            raise ConfigError(
                f"the fit ({source}) has no data-parallel law: the planner compares every setting "
                f"with DP, so fit records that include method 'dp'"
            )
        self.fit, self.source, self.ablations = fit, source, ablations
        table = _data("ablations.json")
        self._paper, self._project, self._frontier = table["paper"], table["project"], table["frontier"]

    @classmethod
    def paper(cls, *, ablations: str = "paper") -> LossModel:
        data = _data("paper_fit.json")
        src = f"{data['source']}, fitted by diloco fit (data/paper_fit.json)"
        return cls(ScalingFit.from_dict(data, where="data/paper_fit.json"), source=src, ablations=ablations)

    @classmethod
    def from_fit_file(cls, path: Path | str, *, ablations: str = "paper") -> LossModel:
        from diloco.files import read_json

        path = Path(path)
        if not path.exists():
            raise ConfigError(f"fit file {path} does not exist; write one with `diloco fit ... --json {path}`")
        data = read_json(path)
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: expected the JSON object `diloco fit` writes")
        src = f"{path} (diloco fit of {data.get('source', 'unknown records')})"
        return cls(ScalingFit.from_dict(data, where=str(path)), source=src, ablations=ablations)

    # -- the costs --------------------------------------------------------------------------------
    def sync_every_term(self, H: int) -> Term:
        if self.ablations == "project":
            d = self._project["sync_every"]
            k = math.log(d["streaming_h100"] / d["streaming_h30"]) / math.log(100 / 30)
            rel = math.exp(k * math.log(H / LAW_SYNC_EVERY)) - 1
            return Term("H", rel, f"{self._project['source']}: {d['what']}", not 30 <= H <= 100)
        t5, long = self._paper["sync_every"], self._paper["sync_every_long"]
        k1 = sum(math.log(b / a) for _, a, b in t5["rows"]) / len(t5["rows"]) / math.log(100 / 30)
        # DiLoCo's +2.9 % is perplexity: loss + ln(1.029) nats on a loss of ln(15.02)
        long_rel = math.log(long["perplexity_ratio"]) / math.log(long["perplexity"])
        k2 = math.log1p(long_rel) / math.log(1000 / 50)
        if H <= 100:
            log_factor, src = k1 * math.log(H / LAW_SYNC_EVERY), t5["source"]
        else:
            log_factor = k1 * math.log(100 / LAW_SYNC_EVERY) + k2 * math.log(H / 100)
            src = f"{t5['source']} to H = 100; beyond, {long['source']}"
        return Term("H", math.expm1(log_factor), src, not 30 <= H <= 1000)

    def fragments_term(self, fragment_layers: int) -> Term:
        if self.ablations == "project":
            d = self._project["streaming_vs_diloco"]
            rel = d["streaming"] / d["diloco"] - 1
            return Term("fragments", rel, f"{self._project['source']}: {d['what']}", True)
        d = self._paper["fragments"]
        diff = sum(b - a for _, a, b in d["rows"]) / len(d["rows"])
        k = sum(math.log(b / a) for _, a, b in d["rows"]) / len(d["rows"])
        if abs(diff) <= d["resolution"] / 2 + 1e-9:  # within the table's rounding: no measurable cost either way
            return Term(
                "fragments",
                0.0,
                f"{d['source']}: mean difference {diff:+.4f} ({math.expm1(k):+.2%}), "
                f"within the table's {d['resolution']} rounding: taken as 0",
                fragment_layers != d["fragment_layers"],
            )
        return Term("fragments", math.expm1(k), d["source"], fragment_layers != d["fragment_layers"])

    def overlap_term(self, tau: int) -> Term:
        d = self._paper["overlap"]
        rel = d["max_relative_increase"] * tau / d["max_tau"]
        source = d["source"]
        if self.ablations == "project":
            source += " (the project's runs measure tau together with fragments and FP4)"
            rel = 0.0 if tau <= 1 else d["max_relative_increase"] * (tau - 1) / d["max_tau"]
        return Term("tau", rel, source, tau > d["max_tau"])

    def codec_term(self, bits: float) -> Term:
        d = self._paper["codec"]
        return Term("bits", d["relative_increase"], d["source"], bits < d["min_bits"])

    def measured_term(self, key: str, name: str) -> Term:
        """The cost of the frontier study's run ``key`` against its Streaming FP4 tau = 1 run, at least 0."""
        f = self._frontier
        row, ref = f["rows"][key], f["rows"][f["reference"]]
        rel = row["eval_loss"] / ref["eval_loss"] - 1
        charged = max(rel, 0.0)
        source = (
            f"{MEASURED_MARK}: {f['source']}: {row['what']} {row['gap_pct']:+.2f} % vs data-parallel, "
            f"{ref['what']} {ref['gap_pct']:+.2f} % ({f['setting']}); charged {charged:+.2%} on top of the "
            f"latter's terms" + ("" if rel >= 0 else f" (the measured {rel:+.2%}, one seed, is not credited)")
        )
        return Term(name, charged, source, True)

    def measured(self) -> dict[str, dict[str, Any]]:
        """The frontier study's rows as copied (key -> what, eval_loss, gap_pct, tolerated_steps), with its source."""
        f = self._frontier
        return {"source": f["source"], "setting": f["setting"], "rows": dict(f["rows"])}

    # -- the estimate -----------------------------------------------------------------------------
    def estimate(
        self,
        *,
        method: str,
        num_params: float,
        replicas: int,
        tokens: float | None = None,
        sync_every: int = 1,
        num_fragments: int = 1,
        fragment_layers: int | None = None,
        overlap_steps: int = 0,
        bits: float = 16.0,
        codec: str | None = None,
        eager: bool = False,
    ) -> LossEstimate:
        """Predicted eval loss of one setting. ``method``: "dp", "diloco" or "streaming".

        ``codec`` in :data:`MEASURED_CODECS` (sent with error feedback) and ``eager`` (tau = H, whatever
        ``overlap_steps`` says) are charged the laptop-scale measurements (:meth:`measured_term`).
        """
        if method not in SYNCHRONOUS_METHODS:
            raise ConfigError(f"method={method!r}: choose one of {', '.join(SYNCHRONOUS_METHODS)}")
        law_method = "dp" if method == "dp" else "diloco"
        m = 1 if method == "dp" else replicas
        pr = self.fit.predict(num_params, method=law_method, replicas=m, tokens=tokens)
        terms: list[Term] = []
        if method != "dp":
            terms.append(self.sync_every_term(sync_every))
            if method == "streaming" and num_fragments > 1:
                terms.append(self.fragments_term(fragment_layers or 3))
            tau = 1 if eager else overlap_steps  # eager's cost is measured against tau = 1
            if method == "streaming" and tau > 0 or self.ablations == "project" and method == "streaming":
                terms.append(self.overlap_term(tau))
            if eager:
                terms.append(self.measured_term(MEASURED_EAGER, "eager tau=H"))
            if codec in MEASURED_CODECS:
                terms.append(self.measured_term(MEASURED_CODECS[codec], f"{codec}+EF"))
            else:
                terms.append(self.codec_term(bits))
        factor = math.prod(1 + t.relative for t in terms)
        span = None if pr.loss_interval is None else (pr.loss_interval[0] * factor, pr.loss_interval[1] * factor)
        notes = tuple(n for n in pr.notes if not n.startswith("no inner-lr"))
        return LossEstimate(pr.loss * factor, span, pr.loss_law, self.source, notes, tuple(terms))


__all__ = [
    "ABLATION_SETS",
    "LAW_SYNC_EVERY",
    "MEASURED_CODECS",
    "MEASURED_EAGER",
    "MEASURED_MARK",
    "LossEstimate",
    "LossModel",
    "Term",
]
