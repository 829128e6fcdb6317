"""From sweep records to scaling laws: best point per (method, N), the fits, held-out validation, predictions.

The steps follow the DiLoCo scaling-laws paper (arXiv 2503.09799, Section 3):

1. For every method and model size, the best run over the hyperparameters (optionally refined by
   a quadratic fit of the loss in the log of one hyperparameter, as the paper does for batch size).
2. Power laws of those best losses: one per method (A * N^alpha; Table 7), the joint law over the
   DiLoCo replica counts (A * N^alpha * M^beta; Table 10) and Table 13's forms with an offset C.
3. The same power laws for the optimal inner learning rate and global batch size (Tables 8-9).
4. Leave-largest-out: refit without the largest N and report |log y - log yhat| there.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from diloco.scaling.laws import ALTERNATIVE_FORMS, FittedLaw, fit_law, get_form, log_residual
from diloco.scaling.sweep import read_results

# Huber thresholds, in log units. Losses: 2e-2, so residuals under 2 % count quadratically and
# larger ones (a diverged or unlucky run) linearly. On the paper's Table 4 every residual is under
# 2 %, so the fit there is least squares and recovers Tables 7 and 10 to < 0.25 %; Chinchilla's
# 1e-3 treats nearly every point as an outlier (close to a median fit) and moves A by 1-2 %.
# Hyperparameter optima sit on a grid of factor sqrt 2 or 2 (log steps 0.35-0.69): wider threshold.
LOSS_HUBER_DELTA = 2e-2
HPARAM_HUBER_DELTA = 0.1
HPARAMS = ("inner_lr", "global_batch")


def method_key(method: str, replicas: int) -> str:
    """How results are grouped and labelled: "dp", or e.g. "diloco-m4"."""
    return "dp" if method == "dp" else f"{method}-m{int(replicas)}"


def split_key(key: str) -> tuple[str, int]:
    """The inverse of :func:`method_key`: "diloco-m4" -> ("diloco", 4), "dp" -> ("dp", 1)."""
    if key == "dp":
        return "dp", 1
    method, sep, m = key.rpartition("-m")
    if not sep or not m.isdigit():
        raise ValueError(f"method key {key!r}: expected 'dp' or '<method>-m<M>', e.g. 'diloco-m4'")
    return method, int(m)


def key_order(key: str) -> tuple[int, str, int]:
    """Sort key for method keys: "dp" first, then each method by M."""
    method, m = split_key(key)
    return (0 if method == "dp" else 1, method, m)


# -- inputs ---------------------------------------------------------------------------------------
def load_records(path: Path) -> list[dict[str, Any]]:
    """The finished ("ok") runs of a sweep results file, the last record of each run_id."""
    latest: dict[str, dict[str, Any]] = {}
    for i, rec in enumerate(read_results(path)):
        latest[rec.get("run_id") or f"line-{i}"] = rec
    ok = [r for r in latest.values() if r.get("status", "ok") == "ok" and r.get("eval_loss") is not None]
    if not ok:
        raise ValueError(f"{path} holds no finished runs (status 'ok'); run `diloco sweep` first")
    return ok


def paper_table4() -> dict[str, Any]:
    """The scaling-laws paper's Table 4 (best eval loss per size and method), with its source."""
    text = (resources.files("diloco.scaling.data") / "paper_table4.json").read_text()
    return json.loads(text)


def paper_table4_records() -> list[dict[str, Any]]:
    """Table 4 as sweep records (one per size and method, without hyperparameters)."""
    table = paper_table4()
    records = []
    for row in table["rows"]:
        size, n, *losses = row
        for col, loss in zip(table["columns"][2:], losses):
            method, replicas = ("dp", 1) if col == "dp" else ("diloco", int(col.split("-m")[1]))
            records.append({"run_id": f"paper-{size}-{col}", "size": size, "num_params": n, "method": method,
                            "replicas": replicas, "eval_loss": loss, "status": "ok", "source": "paper"})
    return records


# -- step 1: the best point per (method, M, N) ----------------------------------------------------
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


def quadratic_optimum(values: Iterable[float], losses: Iterable[float]) -> tuple[float, float] | None:
    """Vertex of the parabola through (log value, loss), if it opens upward and lies inside the range."""
    x, y = np.log(np.asarray(list(values), float)), np.asarray(list(losses), float)
    if len(np.unique(x)) < 3:
        return None
    a, b, c = np.polyfit(x, y, 2)
    if not a > 0:
        return None
    u = -b / (2 * a)
    if not x.min() <= u <= x.max():
        return None
    return float(math.exp(u)), float(np.polyval([a, b, c], u))


def best_points(records: Iterable[Mapping[str, Any]], *, smooth_by: str | None = None,
                window: int = 2) -> list[BestPoint]:
    """The best run of every (method, M, N); with ``smooth_by`` ("global_batch" or "inner_lr"), the
    minimum of a parabola in log(hyperparameter) through the best loss at each of its values,
    using the best value and up to ``window`` neighbours on each side."""
    if smooth_by is not None and smooth_by not in HPARAMS:
        raise ValueError(f"smooth_by={smooth_by!r}: choose one of {', '.join(HPARAMS)} or None")
    groups: dict[tuple[str, int, int], list[Mapping[str, Any]]] = defaultdict(list)
    for r in records:
        groups[(r["method"], int(r.get("replicas") or 1), int(r["num_params"]))].append(r)
    points = []
    for (method, replicas, n), runs in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2])):
        best = min(runs, key=lambda r: r["eval_loss"])
        hp = {k: best.get(k) for k in ("inner_lr", "global_batch", "outer_lr", "sync_every")}
        loss, smoothed = float(best["eval_loss"]), None
        if smooth_by is not None and best.get(smooth_by) is not None:
            per_value: dict[float, float] = {}
            for r in runs:
                v = r.get(smooth_by)
                if v is not None:
                    per_value[v] = min(per_value.get(v, math.inf), r["eval_loss"])
            xs = sorted(per_value)
            i = xs.index(best[smooth_by])
            near = xs[max(0, i - window): i + window + 1]
            opt = quadratic_optimum(near, [per_value[v] for v in near])
            if opt is not None:
                hp[smooth_by], loss, smoothed = opt[0], opt[1], smooth_by
        points.append(BestPoint(method, replicas, n, str(best.get("size", n)), loss, hp["inner_lr"],
                                hp["global_batch"], hp["outer_lr"], hp["sync_every"], len(runs), smoothed))
    return points


# -- steps 2-4: the fits ---------------------------------------------------------------------------
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
    joint: dict[str, FittedLaw]  # over the joint method's M: "joint" and Table 13's alternatives
    lr_laws: dict[str, FittedLaw]
    lr_joint: FittedLaw | None
    batch_laws: dict[str, FittedLaw]
    batch_joint: FittedLaw | None
    outer_lr_by_replicas: dict[int, float]
    sync_every_by_replicas: dict[int, int]
    holdout: list[HoldoutRow]
    settings: dict[str, Any] = field(default_factory=dict)

    def predict(self, num_params: float, *, method: str = "diloco", replicas: int = 1,
                law: str = "auto") -> Prediction:
        """Loss and recommended hyperparameters at N (and M). ``law``: "auto" (the method's own
        power law if fitted, else the joint law), "power", or a joint form name."""
        key = method_key(method, replicas)
        m = 1 if method == "dp" else int(replicas)
        joint_ok = method == self.settings.get("joint_method")
        if law == "auto":
            law = "power" if key in self.loss_laws else "joint"
        if law == "power":
            if key not in self.loss_laws:
                raise ValueError(f"no fitted law for {key}; fitted: {', '.join(self.loss_laws)} (or use a joint law)")
            fitted = self.loss_laws[key]
        else:
            if not joint_ok or law not in self.joint:
                raise ValueError(f"law {law!r} is not fitted for method {method!r}; joint laws "
                                 f"({', '.join(self.joint)}) cover method {self.settings.get('joint_method')!r}")
            fitted = self.joint[law]

        def hparam(laws: dict[str, FittedLaw], joint: FittedLaw | None) -> float | None:
            chosen = laws.get(key) or (joint if joint_ok else None)
            return None if chosen is None else float(chosen.predict(num_params, m))

        lr, batch = hparam(self.lr_laws, self.lr_joint), hparam(self.batch_laws, self.batch_joint)
        rounded = None
        if batch is not None:
            rounded = max(m, 2 ** round(math.log2(batch)))
            rounded = int(math.ceil(rounded / m) * m)
        outer = sync = None
        if method != "dp" and self.outer_lr_by_replicas:
            nearest = min(self.outer_lr_by_replicas, key=lambda r: abs(math.log2(r) - math.log2(m)))
            outer, sync = self.outer_lr_by_replicas[nearest], self.sync_every_by_replicas.get(nearest)
        return Prediction(float(num_params), method, m, float(fitted.predict(num_params, m)), fitted.form,
                          lr, batch, rounded, outer, sync)

    def to_dict(self) -> dict[str, Any]:
        laws = lambda d: {k: v.to_dict() for k, v in d.items()}  # noqa: E731
        return {
            "settings": self.settings,
            "points": [{**asdict(p), "key": p.key} for p in self.points],
            "loss_laws": laws(self.loss_laws), "joint": laws(self.joint),
            "lr_laws": laws(self.lr_laws), "lr_joint": self.lr_joint and self.lr_joint.to_dict(),
            "batch_laws": laws(self.batch_laws), "batch_joint": self.batch_joint and self.batch_joint.to_dict(),
            "outer_lr_by_replicas": self.outer_lr_by_replicas, "sync_every_by_replicas": self.sync_every_by_replicas,
            "holdout": [{**asdict(h), "residual": h.residual} for h in self.holdout],
        }

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
        for f in self.joint.values():
            add("loss", joint_group, f)
        for target, laws, joint in (("inner_lr", self.lr_laws, self.lr_joint),
                                    ("global_batch", self.batch_laws, self.batch_joint)):
            for key, f in laws.items():
                add(target, key, f)
            add(target, joint_group, joint)
        return "\n".join(rows)

    def holdout_table(self) -> str:
        """Leave-largest-out residuals |log y - log yhat| as a Markdown table, with the mean per law."""
        rows = ["| target | law | group | N | actual | predicted | residual |", "|---|---|---|---|---|---|---|"]
        for h in self.holdout:
            rows.append(f"| {h.target} | {h.law} | {h.group} | {h.num_params:.3g} | {h.actual:.5g} | "
                        f"{h.predicted:.5g} | {h.residual:.4f} |")
        return "\n".join(rows)

    def mean_holdout(self) -> dict[tuple[str, str], float]:
        """Mean held-out residual per (target, law)."""
        acc: dict[tuple[str, str], list[float]] = defaultdict(list)
        for h in self.holdout:
            acc[(h.target, h.law)].append(h.residual)
        return {k: float(np.mean(v)) for k, v in acc.items()}


def _fit_or_none(form: str, pts: list[BestPoint], y: list[float | None], delta: float,
                 max_inits: int) -> FittedLaw | None:
    """A fit if the points allow it (enough distinct sizes, every value present), else None."""
    if not pts or any(v is None or not v > 0 for v in y):
        return None
    if len({p.num_params for p in pts}) < 2 or len(pts) < len(get_form(form).params) + 1:
        return None
    return fit_law(form, [p.num_params for p in pts], [p.replicas for p in pts], y,
                   huber_delta=delta, max_inits=max_inits)


def _targets(pts: list[BestPoint]) -> dict[str, list[float | None]]:
    return {"loss": [p.loss for p in pts], "inner_lr": [p.inner_lr for p in pts],
            "global_batch": [p.global_batch for p in pts]}


def fit_scaling(records: Iterable[Mapping[str, Any]], *, smooth_by: str | None = None,
                joint_method: str = "diloco", loss_huber_delta: float = LOSS_HUBER_DELTA,
                hparam_huber_delta: float = HPARAM_HUBER_DELTA, max_inits: int = 64,
                alternatives: Iterable[str] = ALTERNATIVE_FORMS) -> ScalingFit:
    """Every fit of the module docstring, from finished sweep records (see :func:`load_records`)."""
    points = best_points(records, smooth_by=smooth_by)
    if not points:
        raise ValueError("no records to fit: run `diloco sweep` first, or use the paper's table (--paper-table4)")
    alternatives = tuple(alternatives)
    for name in alternatives:
        get_form(name)
    deltas = {"loss": loss_huber_delta, "inner_lr": hparam_huber_delta, "global_batch": hparam_huber_delta}
    by_key: dict[str, list[BestPoint]] = defaultdict(list)
    for p in sorted(points, key=lambda p: (key_order(p.key), p.num_params)):
        by_key[p.key].append(p)
    joint_pts = [p for p in points if p.method == joint_method]
    largest = max(p.num_params for p in points)

    def fit_all(pts_by_key: dict[str, list[BestPoint]], jpts: list[BestPoint]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for target, delta in deltas.items():
            out[target] = {key: _fit_or_none("power", pts, _targets(pts)[target], delta, max_inits)
                           for key, pts in pts_by_key.items()}
            forms = ("joint",) + (alternatives if target == "loss" else ())
            out[target + "_joint"] = {f: _fit_or_none(f, jpts, _targets(jpts)[target], delta, max_inits)
                                      for f in forms}
        return out

    full = fit_all(by_key, joint_pts)
    # Leave-largest-out: the same fits without the largest size, evaluated at it.
    held = fit_all({k: [p for p in v if p.num_params < largest] for k, v in by_key.items()},
                   [p for p in joint_pts if p.num_params < largest])
    holdout = []
    for target in deltas:
        candidates = [("power", key, law, by_key[key]) for key, law in held[target].items()]
        candidates += [(form, None, law, joint_pts) for form, law in held[target + "_joint"].items()]
        for law_name, key, law, pts in candidates:
            if law is None:
                continue
            for p in pts:
                actual = _targets([p])[target][0]
                if p.num_params == largest and actual is not None:
                    holdout.append(HoldoutRow(target, law_name, key or p.key, p.num_params, float(actual),
                                              float(law.predict(p.num_params, p.replicas))))

    # Outer lr and H: the paper finds the best outer lr independent of N, so take the median of
    # the best values over sizes for each M (and the most common H).
    outer: dict[int, list[float]] = defaultdict(list)
    sync: dict[int, list[int]] = defaultdict(list)
    for p in joint_pts:
        if p.outer_lr is not None:
            outer[p.replicas].append(p.outer_lr)
        if p.sync_every is not None:
            sync[p.replicas].append(p.sync_every)
    drop_none = lambda d: {k: v for k, v in d.items() if v is not None}  # noqa: E731
    return ScalingFit(
        points=points,
        loss_laws=drop_none(full["loss"]),
        joint=drop_none(full["loss_joint"]),
        lr_laws=drop_none(full["inner_lr"]),
        lr_joint=full["inner_lr_joint"]["joint"],
        batch_laws=drop_none(full["global_batch"]),
        batch_joint=full["global_batch_joint"]["joint"],
        outer_lr_by_replicas={m: float(np.median(v)) for m, v in sorted(outer.items())},
        sync_every_by_replicas={m: max(set(v), key=v.count) for m, v in sorted(sync.items())},
        holdout=holdout,
        settings={"smooth_by": smooth_by, "joint_method": joint_method, "loss_huber_delta": loss_huber_delta,
                  "hparam_huber_delta": hparam_huber_delta, "max_inits": max_inits,
                  "held_out_num_params": largest},
    )
