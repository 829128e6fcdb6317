"""The papers' bandwidth tables and the simulator's reproduction of them.

Streaming DiLoCo Table 4 and Scaling Laws for DiLoCo Table 6 give, per
method, the cross-datacenter bandwidth (Gbit/s) needed for 50/80/90/95/99 %
compute utilization. Every value lies on ``numpy.logspace(-1, 3, 50)`` Gbit/s,
so a simulated cell is compared by its index on that grid.

The 1.2 constant, and the reading that needs none
------------------------------------------------
With the stated step times (0.1 / 0.8 / 4.9 s) and the natural reading (the
smallest grid bandwidth reaching each target, ``"first_reaching"``), the
simulator lands one grid step too high in most cells: 7/75 exact, 73/75
within one. Two ways to close the gap:

* :data:`PAPER_STEP_TIME_SCALE` = 1.2 on every step time: 70/75 exact, 75/75
  within one. It is **fitted**, not derived: all 30 data-parallel and DiLoCo
  cells match only for factors in about [1.19, 1.2025]; the MFUs the paper
  quotes (40 % in its section 3.1, 60 % in Table 4's caption) give 1.5, not 1.2.
* Reading **the largest grid bandwidth still below the target**
  (``"last_below"``) at the stated step times: 66/75 exact, 75/75 within one,
  no constant at all. Utilization depends on bandwidth x step time only, so
  this reading is exactly the natural one at a step-time factor equal to the
  grid's ratio, 10^(4/49) = 1.2068 (a test checks the identity): the "1.2"
  is one grid step, nudged by the fit to win four more cells.

The reproduction keeps both (``benchmarks/simulate_tables.py`` prints both);
what users get from ``diloco simulate`` and ``diloco plan`` is neither: their
own (stated or measured) step time, read the natural way, which asks for at
most one grid step (x1.21) more bandwidth than the paper's tables.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from diloco.errors import ConfigError
from diloco.sim.hardware import GBIT, PRESETS, ModelSpec
from diloco.sim.utilization import TARGETS, MethodSpec, data_parallel, diloco, paper_methods, utilization_curve

#: The fitted step-time factor of the Table 4 reproduction (see the module docstring); never applied silently.
PAPER_STEP_TIME_SCALE = 1.2

#: The grid the papers' values lie on, in Gbit/s.
PAPER_GRID_GBPS = np.logspace(-1, 3, 50)

#: Streaming DiLoCo Table 4: Gbit/s for 50/80/90/95/99 % utilization; H = 100, fragments of 3 layers.
TABLE4: dict[str, dict[str, tuple[float, ...]]] = {
    "Data-Parallel": {
        "1B": (86.8, 152.6, 184.2, 222.3, 569.0),
        "10B": (104.8, 222.3, 222.3, 268.3, 471.5),
        "100B": (184.2, 323.8, 390.7, 390.7, 471.5),
    },
    "DiLoCo": {
        "1B": (1.4, 6.2, 13.3, 23.3, 86.8),
        "10B": (1.7, 7.5, 16.0, 33.9, 104.8),
        "100B": (3.0, 11.0, 23.3, 49.4, 184.2),
    },
    "Streaming DiLoCo": {
        "1B": (1.4, 5.2, 9.1, 16.0, 28.1),
        "10B": (1.7, 5.2, 9.1, 13.3, 19.3),
        "100B": (2.4, 6.2, 9.1, 11.0, 19.3),
    },
    "+ overlap": {
        "1B": (1.4, 4.3, 6.2, 9.1, 11.0),
        "10B": (1.7, 3.6, 5.2, 6.2, 7.5),
        "100B": (1.7, 3.6, 4.3, 5.2, 5.2),
    },
    "+ overlap + 4-bit": {
        "1B": (0.4, 0.9, 1.7, 2.0, 3.0),
        "10B": (0.4, 0.9, 1.4, 1.4, 1.7),
        "100B": (0.5, 0.9, 1.1, 1.1, 1.4),
    },
}

#: Scaling Laws for DiLoCo Table 6: 10B (48 layers, 0.8 s), data-parallel and DiLoCo (M = 2) at several H.
TABLE6: dict[str, tuple[float, ...]] = {
    "Data-Parallel": (104.8, 184.2, 222.3, 222.3, 390.7),
    "DiLoCo H=10": (16.0, 49.4, 86.8, 152.6, 222.3),
    "DiLoCo H=50": (3.0, 11.0, 23.3, 41.0, 126.5),
    "DiLoCo H=100": (1.4, 6.2, 13.3, 23.3, 86.8),
    "DiLoCo H=300": (0.5, 2.0, 4.3, 9.1, 41.0),
}
TABLE6_SYNC_EVERY = {"Data-Parallel": 1, "DiLoCo H=10": 10, "DiLoCo H=50": 50, "DiLoCo H=100": 100, "DiLoCo H=300": 300}


def grid_index(gbps: float) -> int:
    """Index of the paper grid point a printed table value stands for: the nearest on a log scale.

    The papers print one decimal and not always by one rule: 0.9 and 1.1 are
    not the rounding of any grid point (0.954 and 1.151 round to 1.0 and 1.2),
    and 0.4 is the rounding of two (0.373 and 0.450). The nearest point in
    log space (0.954, 1.151, 0.373) is the one reading that works for all.
    """
    ratio = np.log(PAPER_GRID_GBPS) - np.log(gbps)
    i = int(np.argmin(np.abs(ratio)))
    assert abs(ratio[i]) < np.log(1.1), f"{gbps} Gbit/s is not a value of the paper grid"
    return i


@dataclass(frozen=True)
class Cell:
    """One table cell: the paper's value and the simulator's, as Gbit/s and grid indices."""

    table: str
    method: str
    size: str
    target: float
    paper_gbps: float
    sim_gbps: float | None
    paper_index: int
    sim_index: int | None  # None: the target is not reached on the grid

    @property
    def offset(self) -> int | None:
        """Grid steps the simulator is above (+) or below (-) the paper."""
        return None if self.sim_index is None else self.sim_index - self.paper_index

    @property
    def exact(self) -> bool:
        return self.offset == 0

    @property
    def within_one(self) -> bool:
        return self.offset is not None and abs(self.offset) <= 1

    def to_dict(self) -> dict:
        return {**asdict(self), "offset": self.offset}


#: How a simulated curve is read off the grid: the smallest grid bandwidth that reaches the target
#: (the natural reading, :func:`bandwidth_needed`), or the largest grid bandwidth still below it.
CONVENTIONS = ("first_reaching", "last_below")


def read_grid(cu: np.ndarray, target: float, convention: str = "first_reaching") -> int | None:
    """Grid index a curve gives for ``target`` under ``convention`` (None: not on the grid)."""
    if convention not in CONVENTIONS:
        raise ConfigError(f"convention must be one of {', '.join(CONVENTIONS)}, got {convention!r}")
    hit = np.flatnonzero(np.asarray(cu) >= target - 1e-12)
    if not hit.size:
        return None
    i = int(hit[0])
    if convention == "first_reaching":
        return i
    return i - 1 if i > 0 else None


def _cells(
    table: str, method: str, size: str, paper: Sequence[float], cu: np.ndarray, convention: str = "first_reaching"
) -> list[Cell]:
    grid_bps = PAPER_GRID_GBPS * GBIT
    out = []
    for q, v in zip(TARGETS, paper):
        sim_i = read_grid(cu, q, convention)
        n = np.nan if sim_i is None else grid_bps[sim_i]
        out.append(Cell(table, method, size, q, v, None if np.isnan(n) else float(n / GBIT), grid_index(v), sim_i))
    return out


def reproduce_table4(
    *,
    step_time_scale: float = PAPER_STEP_TIME_SCALE,
    sizes: Sequence[str] = ("1B", "10B", "100B"),
    convention: str = "first_reaching",
) -> list[Cell]:
    """All cells of Streaming DiLoCo Table 4 (H = 100, 3-layer strided fragments, 16 / 4 bits, M = 2)."""
    cells: list[Cell] = []
    grid_bps = PAPER_GRID_GBPS * GBIT
    for size in sizes:
        model = PRESETS[size].scaled(step_time_scale)
        for method in paper_methods(model.num_layers, sync_every=100, fragment_layers=3):
            cu = utilization_curve(model, method, grid_bps)
            cells += _cells("Table 4", method.label, size, TABLE4[method.label][size], cu, convention)
    return cells


def table6_methods() -> dict[str, MethodSpec]:
    return {
        row: (data_parallel() if H == 1 else diloco(sync_every=H, label=row)) for row, H in TABLE6_SYNC_EVERY.items()
    }


def reproduce_table6(
    *, step_time_scale: float | dict[str, float] = PAPER_STEP_TIME_SCALE, rows: Sequence[str] | None = None
) -> list[Cell]:
    """Cells of Scaling Laws Table 6 (10B) with one step-time scale, or one per row to show what each needs."""
    cells: list[Cell] = []
    grid_bps = PAPER_GRID_GBPS * GBIT
    methods = table6_methods()
    for row in rows or TABLE6:
        scale = step_time_scale[row] if isinstance(step_time_scale, dict) else step_time_scale
        model: ModelSpec = PRESETS["10B"].scaled(scale)
        cu = utilization_curve(model, methods[row], grid_bps)
        cells += _cells("Table 6", row, "10B", TABLE6[row], cu)
    return cells


def matching_scales(scales: Sequence[float], rows: Sequence[str] | None = None) -> dict[str, list[float]]:
    """For each Table 6 row, those of ``scales`` at which all five of its cells match exactly."""
    return {
        row: [float(s) for s in scales if all(c.exact for c in reproduce_table6(step_time_scale=float(s), rows=[row]))]
        for row in rows or TABLE6
    }


def summarize(cells: Sequence[Cell]) -> dict:
    """Counts and the list of cells that miss."""
    return {
        "cells": len(cells),
        "exact": sum(c.exact for c in cells),
        "within_one": sum(c.within_one for c in cells),
        "misses": [c.to_dict() for c in cells if not c.exact],
    }


def format_table(cells: Sequence[Cell]) -> str:
    """Paper vs simulator, Gbit/s per target; a simulated value off the paper's grid point is marked."""
    lines = []
    groups: dict[tuple[str, str], list[Cell]] = {}
    for c in cells:
        groups.setdefault((c.method, c.size), []).append(c)
    head = "  ".join(f"{f'{q:.0%}: paper / sim':>17} " for q in TARGETS)
    lines.append(f"{'method':<20} {'size':>5}  {head}")
    for (method, size), row in groups.items():
        parts = []
        for c in row:
            sim = "    -   " if c.sim_gbps is None else f"{c.sim_gbps:8.2f}"
            mark = " " if c.exact else ("+" if (c.offset or 0) > 0 else "-")
            parts.append(f"{c.paper_gbps:6.1f} /{sim}{mark}")
        lines.append(f"{method:<20} {size:>5}  " + "  ".join(parts))
    return "\n".join(lines)


__all__ = [
    "PAPER_STEP_TIME_SCALE",
    "PAPER_GRID_GBPS",
    "CONVENTIONS",
    "read_grid",
    "TABLE4",
    "TABLE6",
    "TABLE6_SYNC_EVERY",
    "grid_index",
    "Cell",
    "reproduce_table4",
    "reproduce_table6",
    "table6_methods",
    "matching_scales",
    "summarize",
    "format_table",
]
