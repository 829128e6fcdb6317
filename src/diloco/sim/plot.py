"""Utilization vs bandwidth, one curve per method (log x axis), like the Streaming DiLoCo figures."""

from __future__ import annotations

from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from diloco.files import atomic_write_with
from diloco.sim.hardware import GBIT
from diloco.sim.utilization import SweepResult


def plot_sweep(result: SweepResult, path: str | Path, *, title: str | None = None) -> Path:
    """Write a PNG of ``result``'s curves to ``path`` and return it.

    Uses the Agg canvas directly (no pyplot), so it never touches a global
    backend and works on machines without a display.
    """
    fig = Figure(figsize=(7.0, 4.5), dpi=120)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    x = result.bandwidth_bps / GBIT
    for label, cu in result.curves.items():
        ax.plot(x, 100 * cu, marker="o", markersize=2.5, linewidth=1.5, label=label)
    for q in result.targets:
        ax.axhline(100 * q, color="0.85", linewidth=0.8, zorder=0)
    ax.set_xscale("log")
    ax.set_xlabel("cross-datacenter bandwidth per worker (Gbit/s)")
    ax.set_ylabel("compute utilization (%)")
    ax.set_ylim(0, 101)
    m = result.model
    ax.set_title(title or f"{m.name}: {m.num_layers} layers, {m.num_params:.3g} params, step {m.step_time_s:.3g} s")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_with(path, lambda fh: fig.savefig(fh, format="png"))
    return path


__all__ = ["plot_sweep"]
