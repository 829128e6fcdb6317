"""Decoupled DiLoCo's Table 1 (goodput under failures) and its reproduction by :mod:`diloco.sim.goodput`.

The paper simulates chips failing as a Poisson process (MTBI per chip 1 year), heavy-tailed
recovery times and elastic re-scale times; it does not publish the recovery distribution, the
re-scale times or the checkpointing. We fit the two constants Table 1 constrains:

* the **mean recovery time** E[R], on the five cells of the non-elastic DP row (its only
  failure cost when checkpoints are taken every step);
* the **re-scale stall** t_down + t_up, on the twenty cells of the elastic DP and decoupled rows
  (decoupled M on N chips is elastic DP on N / M chips in our model, so one curve serves all).

Each is the minimax fit (smallest largest deviation, grid of 0.5 s), rounded; the defaults of
:class:`~diloco.sim.goodput.FailureModel` are these values (a test checks it).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from diloco.sim.goodput import FailureModel, goodput_table

TABLE1_CHIPS = (150_000, 300_000, 600_000, 1_200_000, 2_400_000)
TABLE1_LEARNERS = (2, 4, 8, 16)
#: Goodput in % (Decoupled DiLoCo, Table 1), keyed like :func:`~diloco.sim.goodput.goodput_table`'s rows.
TABLE1_PAPER: dict[str, tuple[int, ...]] = {
    "dp": (72, 57, 38, 27, 18),
    "dp_elastic": (88, 80, 69, 58, 40),
    "decoupled_M2": (94, 88, 80, 70, 54),
    "decoupled_M4": (96, 93, 89, 82, 73),
    "decoupled_M8": (98, 96, 94, 88, 80),
    "decoupled_M16": (99, 98, 96, 93, 86),
}
ROW_LABELS = {
    "dp": "data-parallel, no elasticity",
    "dp_elastic": "data-parallel, elastic",
    "decoupled_M2": "Decoupled M = 2",
    "decoupled_M4": "Decoupled M = 4",
    "decoupled_M8": "Decoupled M = 8",
    "decoupled_M16": "Decoupled M = 16",
}
#: Every cell is within this many goodput points of the paper (the largest is 4.3: elastic DP at 1.2M
#: and M = 16 at 2.4M, see :func:`reproduce_table1`).
TABLE1_TOLERANCE_POINTS = 5.0


def reproduce_table1(model: FailureModel = FailureModel()) -> dict[str, Any]:
    """Our Table 1 (in %) beside the paper's, with the difference of every cell."""
    ours = {k: [100 * g for g in v] for k, v in goodput_table(TABLE1_CHIPS, TABLE1_LEARNERS, model).items()}
    rows = []
    for key, paper in TABLE1_PAPER.items():
        diff = [o - p for o, p in zip(ours[key], paper)]
        rows.append({"row": key, "label": ROW_LABELS[key], "paper": list(paper), "ours": ours[key], "diff": diff})
    worst = max(abs(d) for r in rows for d in r["diff"])
    within = sum(abs(d) <= TABLE1_TOLERANCE_POINTS for r in rows for d in r["diff"])
    return {
        "chips": list(TABLE1_CHIPS),
        "rows": rows,
        "max_abs_diff": worst,
        "mean_abs_diff": float(np.mean([abs(d) for r in rows for d in r["diff"]])),
        "cells_within_tolerance": within,
        "cells": sum(len(r["diff"]) for r in rows),
        "tolerance_points": TABLE1_TOLERANCE_POINTS,
        "model": model.to_dict(),
    }


def _minimax(grid: np.ndarray, error) -> tuple[float, float]:
    errs = np.array([error(x) for x in grid])
    i = int(np.argmin(errs))
    return float(grid[i]), float(errs[i])


def fit_table1(*, base: FailureModel = FailureModel(), step_s: float = 0.5) -> dict[str, Any]:
    """Refit E[R] (DP row) and t_down + t_up (elastic and decoupled rows) to Table 1, minimax on a grid.

    ``base`` supplies everything else (sigma, checkpoint interval, slice size, MTBI). The fitted
    median follows from the fitted mean: median = mean / exp(sigma^2 / 2).
    """
    grid = np.arange(step_s, 300.0 + step_s, step_s)
    shrink = math.exp(base.recovery_sigma**2 / 2)

    def dp_error(mean_r: float) -> float:
        m = base.with_(recovery_median_s=mean_r / shrink)
        ours = goodput_table(TABLE1_CHIPS, (), m)["dp"]
        return max(abs(100 * o - p) for o, p in zip(ours, TABLE1_PAPER["dp"]))

    mean_r, dp_worst = _minimax(grid, dp_error)
    rows = [k for k in TABLE1_PAPER if k != "dp"]

    def elastic_error(stall: float) -> float:
        m = base.with_(recovery_median_s=mean_r / shrink, downscale_s=stall / 2, upscale_s=stall / 2)
        ours = goodput_table(TABLE1_CHIPS, TABLE1_LEARNERS, m)
        return max(abs(100 * o - p) for k in rows for o, p in zip(ours[k], TABLE1_PAPER[k]))

    stall, el_worst = _minimax(grid[grid <= 120], elastic_error)
    return {
        "recovery_mean_s": mean_r,
        "recovery_median_s": mean_r / shrink,
        "rescale_s": stall,
        "dp_row_max_abs_diff": dp_worst,
        "elastic_rows_max_abs_diff": el_worst,
    }


def rule_of_thumb_gap(table: dict[str, tuple[float, ...] | list[float]]) -> list[dict[str, float]]:
    """Decoupled M on N chips against elastic DP on N / M chips, wherever both are in the table."""
    out = []
    for m in TABLE1_LEARNERS:
        for j, n in enumerate(TABLE1_CHIPS):
            if n // m in TABLE1_CHIPS:
                k = TABLE1_CHIPS.index(n // m)
                out.append(
                    {
                        "learners": m,
                        "chips": n,
                        "decoupled": float(table[f"decoupled_M{m}"][j]),
                        "elastic_dp_on_n_over_m": float(table["dp_elastic"][k]),
                    }
                )
    return out


__all__ = [
    "ROW_LABELS",
    "TABLE1_CHIPS",
    "TABLE1_LEARNERS",
    "TABLE1_PAPER",
    "TABLE1_TOLERANCE_POINTS",
    "fit_table1",
    "reproduce_table1",
    "rule_of_thumb_gap",
]
