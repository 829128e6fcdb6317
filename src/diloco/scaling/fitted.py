"""A fit of the scaling laws, once made (:func:`diloco.scaling.fit.fit_scaling` makes it): the best point per
(method, M, N) it rests on, its laws and held-out residuals, what it predicts at another N and M
(:meth:`ScalingFit.predict`: loss with its bootstrap interval, inner lr, batch, outer lr, H), its JSON (``diloco
fit`` writes it, ``diloco plan`` reads it) and its Markdown tables.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from diloco.errors import ConfigError
from diloco.scaling.laws import CHINCHILLA_SOURCE, FittedLaw, get_form, interval, log_residual, token_budget_factor
from diloco.scaling.records import method_key


@dataclass(frozen=True)
class BestPoint:
    method: str
    replicas: int
    num_params: int
    size: str
    loss: float
    inner_lr: float | None
    global_batch: float | None
    outer_lr: float | None
    sync_every: int | None
    num_runs: int
    smoothed_by: str | None = None  # the hyperparameter whose quadratic fit gave loss (and its value)

    @property
    def key(self) -> str:
        return method_key(self.method, self.replicas)


@dataclass(frozen=True)
class HoldoutRow:
    target: str  # "loss", "inner_lr" or "global_batch"
    law: str  # "power" (one law per group) or a joint form
    group: str  # method key, e.g. "diloco-m2"
    num_params: int
    actual: float
    predicted: float

    @property
    def residual(self) -> float:
        return float(log_residual(self.actual, self.predicted))


@dataclass(frozen=True)
class Prediction:
    num_params: float
    method: str
    replicas: int
    loss: float
    loss_law: str
    loss_interval: tuple[float, float] | None  # 90 % bootstrap interval (None: fitted without --bootstrap)
    tokens: float | None  # the token budget asked for (None: the sweep's tokens per parameter)
    notes: tuple[str, ...]  # what the prediction rests on beyond the fitted law (fallbacks, extrapolation)
    inner_lr: float | None
    global_batch: float | None
    global_batch_rounded: int | None  # the nearest power of two that M divides
    outer_lr: float | None
    sync_every: int | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class ScalingFit:
    points: list[BestPoint]
    loss_laws: dict[str, FittedLaw]  # per method key: A * N^alpha
    loss_laws_c: dict[str, FittedLaw]  # per method key: A * N^alpha + C
    joint: dict[str, FittedLaw]  # over the joint method's M: "joint" and Table 13's alternatives
    lr_laws: dict[str, FittedLaw]
    lr_joint: FittedLaw | None
    batch_laws: dict[str, FittedLaw]
    batch_joint: FittedLaw | None
    outer_lr_by_replicas: dict[int, float]
    sync_every_by_replicas: dict[int, int]
    holdout: list[HoldoutRow]
    settings: dict[str, Any] = field(default_factory=dict)
    bootstrap: dict[str, list[dict[str, float]]] = field(default_factory=dict)  # law id -> refit coefficients
    warnings: list[str] = field(default_factory=list)  # laws not fitted, and why

    def loss_law(
        self, method: str = "diloco", replicas: int = 1, law: str = "auto"
    ) -> tuple[str, FittedLaw, list[str]]:
        """(law id, the law, notes) that predicts the loss of ``method`` with M = ``replicas``.

        ``law``: "auto" (the group's own law with an offset, "power+C", if fitted; else its pure power
        law; else the joint law over M, said in the notes), "power", "power+C", or a joint form name.
        """
        key = method_key(method, replicas)
        joint_ok = method == self.settings.get("joint_method")
        notes: list[str] = []
        if law == "auto":
            if key in self.loss_laws_c:
                law = "power+C"
            elif key in self.loss_laws:
                law = "power"
            else:
                law = "joint+C" if "joint+C" in self.joint else "joint"
                fitted_m = sorted({p.replicas for p in self.points if p.method == method})
                notes.append(
                    f"no law fitted for {key} (fitted M: {fitted_m or 'none'}): the joint law {law} "
                    f"over M is used, "
                    + (
                        "an interpolation"
                        if fitted_m and min(fitted_m) < replicas < max(fitted_m)
                        else "an extrapolation"
                    )
                    + f" to M = {replicas}"
                )
        if law in ("power", "power+C"):
            laws = self.loss_laws if law == "power" else self.loss_laws_c
            if key not in laws:
                raise ConfigError(
                    f"no fitted {law} law for {key}; fitted: {', '.join(laws) or 'none'} "
                    f"(or use a joint law: {', '.join(self.joint) or 'none fitted'})"
                )
            return f"{law}:{key}", laws[key], notes
        if not joint_ok or law not in self.joint:
            raise ConfigError(
                f"law {law!r} is not fitted for method {method!r}; joint laws "
                f"({', '.join(self.joint) or 'none'}) cover method {self.settings.get('joint_method')!r}"
            )
        return law, self.joint[law], notes

    def predict(
        self,
        num_params: float,
        *,
        method: str = "diloco",
        replicas: int = 1,
        law: str = "auto",
        tokens: float | None = None,
    ) -> Prediction:
        """Loss (with its bootstrap interval) and recommended hyperparameters at N (and M).

        ``tokens``: the token budget; the laws are fitted at the sweep's tokens per parameter
        (``settings["tokens_per_param"]``, the paper's 20), and another budget moves the loss by
        Chinchilla's data term, noted as an extrapolation.
        """
        if not (num_params > 0 and math.isfinite(num_params)):
            raise ConfigError(f"num_params={num_params!r}: give a positive parameter count, e.g. 4e9")
        if not (isinstance(replicas, int) and replicas >= 1):
            raise ConfigError(f"replicas={replicas!r}: give a whole number of replicas >= 1")
        key = method_key(method, replicas)
        m = 1 if method == "dp" else int(replicas)
        joint_ok = method == self.settings.get("joint_method")
        law_id, fitted, notes = self.loss_law(method, m, law)
        loss = float(fitted.predict(num_params, m))
        span = interval(fitted, self.bootstrap.get(law_id, []), num_params, m)
        sizes = [p.num_params for p in self.points]
        if sizes and not min(sizes) <= num_params <= max(sizes):
            notes.append(
                f"N = {num_params:.3g} is outside the fitted sizes {min(sizes):.3g}..{max(sizes):.3g}: an extrapolation"
            )
        tpp = self.settings.get("tokens_per_param")
        if tokens is not None:
            if not (tokens > 0 and math.isfinite(tokens)):
                raise ConfigError(f"tokens={tokens!r}: give a positive token budget, e.g. 2e11")
            if tpp is None:
                raise ConfigError("these records do not say their tokens per parameter; fit records with 'tokens'")
            ref = tpp * num_params
            if abs(tokens / ref - 1) > 1e-9:
                factor = token_budget_factor(num_params, tokens, ref)
                loss *= factor
                span = None if span is None else (span[0] * factor, span[1] * factor)
                notes.append(
                    f"token budget {tokens:.3g} = {tokens / num_params:.3g} tokens/param, not the fitted "
                    f"{tpp:g}: loss x {factor:.4f} by {CHINCHILLA_SOURCE} (an extrapolation)"
                )

        def hparam(laws: dict[str, FittedLaw], joint: FittedLaw | None) -> float | None:
            chosen = laws.get(key) or (joint if joint_ok else None)
            return None if chosen is None else float(chosen.predict(num_params, m))

        lr, batch = hparam(self.lr_laws, self.lr_joint), hparam(self.batch_laws, self.batch_joint)
        if lr is None or batch is None:
            notes.append(
                "no inner-lr / batch law: the records carry no inner_lr / global_batch "
                "(e.g. the paper's table of best losses)"
            )
        rounded = None
        if batch is not None:
            rounded = max(m, 2 ** round(math.log2(batch)))
            rounded = int(math.ceil(rounded / m) * m)
        outer = sync = None
        if method != "dp" and self.outer_lr_by_replicas:
            nearest = min(self.outer_lr_by_replicas, key=lambda r: abs(math.log2(r) - math.log2(m)))
            outer, sync = self.outer_lr_by_replicas[nearest], self.sync_every_by_replicas.get(nearest)
            if nearest != m:
                notes.append(f"outer lr and H from the nearest fitted M = {nearest}")
        return Prediction(
            float(num_params), method, m, loss, law_id, span, tokens, tuple(notes), lr, batch, rounded, outer, sync
        )

    def to_dict(self) -> dict[str, Any]:
        laws = lambda d: {k: v.to_dict() for k, v in d.items()}
        return {
            "settings": self.settings,
            "points": [{**asdict(p), "key": p.key} for p in self.points],
            "loss_laws": laws(self.loss_laws),
            "loss_laws_c": laws(self.loss_laws_c),
            "joint": laws(self.joint),
            "lr_laws": laws(self.lr_laws),
            "lr_joint": self.lr_joint and self.lr_joint.to_dict(),
            "batch_laws": laws(self.batch_laws),
            "batch_joint": self.batch_joint and self.batch_joint.to_dict(),
            "outer_lr_by_replicas": self.outer_lr_by_replicas,
            "sync_every_by_replicas": self.sync_every_by_replicas,
            "holdout": [{**asdict(h), "residual": h.residual} for h in self.holdout],
            "bootstrap": self.bootstrap,
            "warnings": list(self.warnings),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, where: str = "the fit") -> ScalingFit:
        """The inverse of :meth:`to_dict`: read the JSON ``diloco fit`` writes (e.g. for ``diloco plan``)."""
        try:
            laws = lambda d: {k: FittedLaw.from_dict(v) for k, v in (d or {}).items()}
            one = lambda d: None if d is None else FittedLaw.from_dict(d)
            point_fields = {f.name for f in BestPoint.__dataclass_fields__.values()}
            return cls(
                points=[BestPoint(**{k: v for k, v in p.items() if k in point_fields}) for p in data["points"]],
                loss_laws=laws(data["loss_laws"]),
                loss_laws_c=laws(data.get("loss_laws_c")),
                joint=laws(data["joint"]),
                lr_laws=laws(data["lr_laws"]),
                lr_joint=one(data.get("lr_joint")),
                batch_laws=laws(data["batch_laws"]),
                batch_joint=one(data.get("batch_joint")),
                outer_lr_by_replicas={int(k): float(v) for k, v in data["outer_lr_by_replicas"].items()},
                sync_every_by_replicas={int(k): int(v) for k, v in data["sync_every_by_replicas"].items()},
                holdout=[HoldoutRow(**{k: v for k, v in h.items() if k != "residual"}) for h in data["holdout"]],
                settings=dict(data.get("settings", {})),
                bootstrap={k: [dict(c) for c in v] for k, v in (data.get("bootstrap") or {}).items()},
                warnings=list(data.get("warnings", [])),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ConfigError(
                f"{where} is not the JSON `diloco fit` writes ({type(exc).__name__}: {exc}); "
                f"run `diloco fit --results RESULTS.jsonl --json FIT.json`"
            ) from None

    def coefficient_table(self) -> str:
        """The fitted laws as a Markdown table."""
        rows = ["| target | group | law | coefficients | points |", "|---|---|---|---|---|"]

        def add(target: str, group: str, f: FittedLaw | None) -> None:
            if f is not None:
                coefs = ", ".join(f"{k} = {v:.5g}" for k, v in f.coef.items())
                rows.append(f"| {target} | {group} | {get_form(f.form).formula} | {coefs} | {f.num_points} |")

        joint_group = f"{self.settings.get('joint_method')} (all M)"
        for key, f in self.loss_laws.items():
            add("loss", key, f)
        for key, f in self.loss_laws_c.items():
            add("loss", key, f)
        for f in self.joint.values():
            add("loss", joint_group, f)
        for target, laws, joint in (
            ("inner_lr", self.lr_laws, self.lr_joint),
            ("global_batch", self.batch_laws, self.batch_joint),
        ):
            for key, f in laws.items():
                add(target, key, f)
            add(target, joint_group, joint)
        return "\n".join(rows)

    def holdout_table(self) -> str:
        """Leave-largest-out residuals |log y - log yhat| as a Markdown table, with the mean per law."""
        rows = ["| target | law | group | N | actual | predicted | residual |", "|---|---|---|---|---|---|---|"]
        for h in self.holdout:
            rows.append(
                f"| {h.target} | {h.law} | {h.group} | {h.num_params:.3g} | {h.actual:.5g} | "
                f"{h.predicted:.5g} | {h.residual:.4f} |"
            )
        return "\n".join(rows)

    def mean_holdout(self) -> dict[tuple[str, str], float]:
        """Mean held-out residual per (target, law)."""
        acc: dict[tuple[str, str], list[float]] = defaultdict(list)
        for h in self.holdout:
            acc[(h.target, h.law)].append(h.residual)
        return {k: float(np.mean(v)) for k, v in acc.items()}


__all__ = ["BestPoint", "HoldoutRow", "Prediction", "ScalingFit"]
