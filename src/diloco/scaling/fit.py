"""From sweep records to scaling laws: best point per (method, N), the fits, held-out validation; the
:class:`~diloco.scaling.fitted.ScalingFit` they make (its predictions, JSON and tables) is :mod:`diloco.scaling.fitted`.

The steps follow the DiLoCo scaling-laws paper (arXiv 2503.09799, Section 3):

1. For every method and model size, the best run over the hyperparameters (optionally refined by
   a quadratic fit of the loss in the log of one hyperparameter, as the paper does for batch size).
2. Power laws of those best losses: one per method (A * N^alpha; Table 7), the joint law over the
   DiLoCo replica counts (A * N^alpha * M^beta; Table 10) and Table 13's forms with an offset C.
3. The same power laws for the optimal inner learning rate and global batch size (Tables 8-9).
4. Leave-largest-out: refit without the largest N and report |log y - log yhat| there.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from diloco.errors import ConfigError

# what a fit is, once made (its own module): re-exported where it was defined before
from diloco.scaling.fitted import BestPoint, HoldoutRow, Prediction, ScalingFit
from diloco.scaling.laws import (
    ALTERNATIVE_FORMS,
    FittedLaw,
    bootstrap_coefs,
    fit_law,
    get_form,
)
from diloco.scaling.records import is_number, key_order

# Huber thresholds, in log units. Losses: 2e-2, so residuals under 2 % count quadratically and
# larger ones (a diverged or unlucky run) linearly. On the paper's Table 4 every residual is under
# 2 %, so the fit there is least squares and recovers Tables 7 and 10 to < 0.25 %; Chinchilla's
# 1e-3 treats nearly every point as an outlier (close to a median fit) and moves A by 1-2 %.
# Hyperparameter optima sit on a grid of factor sqrt 2 or 2 (log steps 0.35-0.69): wider threshold.
LOSS_HUBER_DELTA = 2e-2
HPARAM_HUBER_DELTA = 0.1
HPARAMS = ("inner_lr", "global_batch")


# -- step 1: the best point per (method, M, N) ----------------------------------------------------
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


def best_points(
    records: Iterable[Mapping[str, Any]], *, smooth_by: str | None = None, window: int = 2
) -> list[BestPoint]:
    """The best run of every (method, M, N); with ``smooth_by`` ("global_batch" or "inner_lr"), the
    minimum of a parabola in log(hyperparameter) through the best loss at each of its values,
    using the best value and up to ``window`` neighbours on each side."""
    if smooth_by is not None and smooth_by not in HPARAMS:
        raise ConfigError(f"smooth_by={smooth_by!r}: choose one of {', '.join(HPARAMS)} or None")
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
            near = xs[max(0, i - window) : i + window + 1]
            opt = quadratic_optimum(near, [per_value[v] for v in near])
            if opt is not None:
                hp[smooth_by], loss, smoothed = opt[0], opt[1], smooth_by
        points.append(
            BestPoint(
                method,
                replicas,
                n,
                str(best.get("size", n)),
                loss,
                hp["inner_lr"],
                hp["global_batch"],
                hp["outer_lr"],
                hp["sync_every"],
                len(runs),
                smoothed,
            )
        )
    return points


# -- steps 2-4: the fits ---------------------------------------------------------------------------
def _n_params_of_form(form: str) -> int:
    """Parameters of a form that describe the dependence on N (all but the M terms B and beta)."""
    return sum(1 for p in get_form(form).params if p not in ("beta", "B"))


def _fit_or_none(
    form: str,
    pts: list[BestPoint],
    y: list[float | None],
    delta: float,
    max_inits: int,
    group: str,
    warn: list[str] | None,
) -> FittedLaw | None:
    """A fit if the points allow it, else None (with the reason added to ``warn`` when it is not obvious).

    The points allow it when every value is present and there are more distinct sizes than the form
    has parameters in N (so at least one size checks the curve), and more points than parameters.
    """
    if not pts or any(v is None or not v > 0 for v in y):
        return None
    sizes = len({p.num_params for p in pts})
    need = _n_params_of_form(form) + 1
    if sizes < 2 or sizes < need or len(pts) < len(get_form(form).params) + 1:
        if warn is not None and sizes >= 2:
            warn.append(
                f"{form} law for {group} not fitted: it has {_n_params_of_form(form)} parameters in N but "
                f"the data has {sizes} model sizes (needs {need}); add sizes to fit it"
            )
        return None
    try:
        return fit_law(
            form, [p.num_params for p in pts], [p.replicas for p in pts], y, huber_delta=delta, max_inits=max_inits
        )
    except ValueError as exc:
        if warn is not None:
            warn.append(f"{form} law for {group} not fitted: {exc}")
        return None


def _targets(pts: list[BestPoint]) -> dict[str, list[float | None]]:
    return {
        "loss": [p.loss for p in pts],
        "inner_lr": [p.inner_lr for p in pts],
        "global_batch": [p.global_batch for p in pts],
    }


def fit_scaling(
    records: Iterable[Mapping[str, Any]],
    *,
    smooth_by: str | None = None,
    joint_method: str = "diloco",
    loss_huber_delta: float = LOSS_HUBER_DELTA,
    hparam_huber_delta: float = HPARAM_HUBER_DELTA,
    max_inits: int = 64,
    alternatives: Iterable[str] = ALTERNATIVE_FORMS,
    bootstrap: int = 0,
    seed: int = 0,
) -> ScalingFit:
    """Every fit of the module docstring, from finished sweep records (:func:`~diloco.scaling.records.load_records`).

    ``bootstrap`` > 0 refits every loss law that many times on resampled residuals, so that
    :meth:`ScalingFit.predict` can give an interval.
    """
    records = list(records)
    points = best_points(records, smooth_by=smooth_by)
    if not points:
        raise ConfigError("no records to fit: run `diloco sweep` first, or use the paper's table (--paper-table4)")
    if bootstrap < 0:
        raise ConfigError(f"bootstrap={bootstrap}: give a number of resamples >= 0")
    alternatives = tuple(alternatives)
    for name in alternatives:
        get_form(name)
    deltas = {"loss": loss_huber_delta, "inner_lr": hparam_huber_delta, "global_batch": hparam_huber_delta}
    by_key: dict[str, list[BestPoint]] = defaultdict(list)
    for p in sorted(points, key=lambda p: (key_order(p.key), p.num_params)):
        by_key[p.key].append(p)
    joint_pts = [p for p in points if p.method == joint_method]
    largest = max(p.num_params for p in points)
    warn: list[str] = []

    def fit_all(pts_by_key: dict[str, list[BestPoint]], jpts: list[BestPoint], w: list[str] | None) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for target, delta in deltas.items():
            out[target] = {
                key: _fit_or_none("power", pts, _targets(pts)[target], delta, max_inits, key, w)
                for key, pts in pts_by_key.items()
            }
            if target == "loss":
                out["loss_c"] = {
                    key: _fit_or_none("power+C", pts, _targets(pts)[target], delta, max_inits, key, w)
                    for key, pts in pts_by_key.items()
                }
            forms = ("joint",) + (alternatives if target == "loss" else ())
            out[target + "_joint"] = {
                f: _fit_or_none(
                    f,
                    jpts,
                    _targets(jpts)[target],
                    delta,
                    max_inits,
                    f"{joint_method} (all M)",
                    w if target == "loss" else None,
                )
                for f in forms
            }
        return out

    full = fit_all(by_key, joint_pts, warn)
    # Leave-largest-out: the same fits without the largest size, evaluated at it.
    held = fit_all(
        {k: [p for p in v if p.num_params < largest] for k, v in by_key.items()},
        [p for p in joint_pts if p.num_params < largest],
        None,
    )
    holdout = []
    for target in deltas:
        candidates = [("power", key, law, by_key[key]) for key, law in held[target].items()]
        if target == "loss":
            candidates += [("power+C", key, law, by_key[key]) for key, law in held["loss_c"].items()]
        candidates += [(form, None, law, joint_pts) for form, law in held[target + "_joint"].items()]
        for law_name, key, law, pts in candidates:
            if law is None:
                continue
            for p in pts:
                actual = _targets([p])[target][0]
                if p.num_params == largest and actual is not None:
                    holdout.append(
                        HoldoutRow(
                            target,
                            law_name,
                            key or p.key,
                            p.num_params,
                            float(actual),
                            float(law.predict(p.num_params, p.replicas)),
                        )
                    )

    # Outer lr and H: the paper finds the best outer lr independent of N, so take the median of
    # the best values over sizes for each M (and the most common H).
    outer: dict[int, list[float]] = defaultdict(list)
    sync: dict[int, list[int]] = defaultdict(list)
    for p in joint_pts:
        if p.outer_lr is not None:
            outer[p.replicas].append(p.outer_lr)
        if p.sync_every is not None:
            sync[p.replicas].append(p.sync_every)
    drop_none = lambda d: {k: v for k, v in d.items() if v is not None}

    # Bootstrap every loss law: ids "power:<key>", "power+C:<key>" and the joint form names.
    samples: dict[str, list[dict[str, float]]] = {}
    if bootstrap:
        laws = [(f"power:{k}", f, by_key[k]) for k, f in drop_none(full["loss"]).items()]
        laws += [(f"power+C:{k}", f, by_key[k]) for k, f in drop_none(full["loss_c"]).items()]
        laws += [(name, f, joint_pts) for name, f in drop_none(full["loss_joint"]).items()]
        for i, (law_id, law, pts) in enumerate(laws):
            samples[law_id] = bootstrap_coefs(
                law,
                [p.num_params for p in pts],
                [p.replicas for p in pts],
                [p.loss for p in pts],
                num_samples=bootstrap,
                huber_delta=loss_huber_delta,
                seed=seed + i,
            )
            if len(samples[law_id]) < bootstrap:
                warn.append(
                    f"bootstrap of {law_id}: {bootstrap - len(samples[law_id])} of {bootstrap} refits "
                    f"did not converge and were left out"
                )

    ratios = [
        r["tokens"] / r["num_params"]
        for r in records
        if is_number(r.get("tokens")) and is_number(r.get("num_params")) and r["num_params"] > 0
    ]
    tokens_per_param = float(np.median(ratios)) if ratios else None
    if ratios and max(ratios) > 1.01 * min(ratios):
        warn.append(
            f"the runs use {min(ratios):.3g}..{max(ratios):.3g} tokens per parameter; the laws take "
            f"the median, {tokens_per_param:.3g}"
        )
    return ScalingFit(
        points=points,
        loss_laws=drop_none(full["loss"]),
        loss_laws_c=drop_none(full["loss_c"]),
        joint=drop_none(full["loss_joint"]),
        lr_laws=drop_none(full["inner_lr"]),
        lr_joint=full["inner_lr_joint"]["joint"],
        batch_laws=drop_none(full["global_batch"]),
        batch_joint=full["global_batch_joint"]["joint"],
        outer_lr_by_replicas={m: float(np.median(v)) for m, v in sorted(outer.items())},
        sync_every_by_replicas={m: max(set(v), key=v.count) for m, v in sorted(sync.items())},
        holdout=holdout,
        settings={
            "smooth_by": smooth_by,
            "joint_method": joint_method,
            "loss_huber_delta": loss_huber_delta,
            "hparam_huber_delta": hparam_huber_delta,
            "max_inits": max_inits,
            "held_out_num_params": largest,
            "tokens_per_param": tokens_per_param,
            "bootstrap": bootstrap,
            "seed": seed,
        },
        bootstrap=samples,
        warnings=warn,
    )


__all__ = [
    "HPARAMS",
    "HPARAM_HUBER_DELTA",
    "LOSS_HUBER_DELTA",
    "BestPoint",
    "HoldoutRow",
    "Prediction",
    "ScalingFit",
    "best_points",
    "fit_scaling",
    "quadratic_optimum",
]
