"""The status page's plots, drawn by matplotlib as inline SVG from a board's snapshot: the loss of the global
parameters against the run's tokens, and each learner's step rate over time.

The live page keeps one :class:`Plots`: each plot is drawn again only when the points it shows changed (a new
evaluation, a new step-rate point), else the SVG drawn last is served again; a redraw reuses its figure, axes and
lines (new data on the same artists). Drawing is kept cheap: fixed margins (no ``bbox_inches="tight"``, which draws
the figure twice), at most 5 ticks an axis, text as SVG text (``svg.fonttype = "none"``: no glyph paths), and
markers only where points are few (a step-rate line of more than :data:`MARKERS_UP_TO` points is a plain line).
"""

from __future__ import annotations

import io
import math
import threading
import time
from collections.abc import Callable
from typing import Any

#: Seconds each point of the step-rate plot spans at least (rates over shorter spans are mostly jitter).
RATE_SPAN_S = 5.0
#: A line with more points than this is drawn without markers (a marker is one SVG element per point).
MARKERS_UP_TO = 60
_RC = {"svg.fonttype": "none", "svg.hashsalt": "diloco"}  # text as text; stable ids: the same data, the same SVG
_FONT = 9


def step_rates(series: list[list[float]], *, span_s: float = RATE_SPAN_S) -> list[tuple[float, float]]:
    """``(t, steps per second)`` of a learner's ``[[t, step], ...]`` (each rate over at least ``span_s``; a step
    that goes back, a resume from an older checkpoint, starts a new span)."""
    out: list[tuple[float, float]] = []
    if not series:
        return out
    t0, s0 = series[0]
    for t, s in series[1:]:
        if s < s0:
            t0, s0 = t, s
            continue
        if t - t0 >= span_s:
            out.append((t, (s - s0) / (t - t0)))
            t0, s0 = t, s
    return out


def loss_points(snapshot: dict[str, Any]) -> tuple[tuple[float, float], ...]:
    """What the loss plot shows: ``(tokens, loss)`` of each evaluation."""
    return tuple((float(p["tokens"]), float(p["loss"])) for p in snapshot["loss"])


def rate_points(snapshot: dict[str, Any]) -> tuple[tuple[str, tuple[float, ...], tuple[float, ...]], ...]:
    """What the step-rate plot shows: per learner ``(m, xs, ys)``, x in seconds since the first report (a NaN
    between two points more than 4 spans apart: a gap in the line, e.g. a killed site)."""
    series = snapshot["series"]
    t0 = min((s[0][0] for s in series.values() if s), default=None)
    out = []
    for m, points in sorted(series.items(), key=lambda kv: int(kv[0])):
        rates = step_rates(points)
        if not rates or t0 is None:
            continue
        xs: list[float] = []
        ys: list[float] = []
        for (t, r), prev in zip(rates, [None, *rates[:-1]], strict=True):
            if prev is not None and t - prev[0] > 4 * RATE_SPAN_S:  # a gap: break the line
                xs.append(math.nan)
                ys.append(math.nan)
            xs.append(t - t0)
            ys.append(r)
        out.append((m, tuple(xs), tuple(ys)))
    return tuple(out)


def loss_key(snapshot: dict[str, Any]) -> Any:
    """A cheap key of the loss plot's data: its points changed only if this did."""
    loss = snapshot["loss"]
    return len(loss), (loss[-1]["tokens"], loss[-1]["loss"]) if loss else None


def rate_key(snapshot: dict[str, Any]) -> Any:
    """A cheap key of the step-rate plot's data (each learner's count of reports, first and last)."""
    return tuple((m, len(s), tuple(s[0]), tuple(s[-1])) if s else (m, 0) for m, s in snapshot["series"].items())


class _Figure:
    """One reused matplotlib figure with one axes (fixed margins, at most 5 ticks an axis, a light grid)."""

    def __init__(self, xlabel: str, ylabel: str, empty: str) -> None:
        from matplotlib.figure import Figure
        from matplotlib.ticker import MaxNLocator

        self.fig = Figure(figsize=(5.6, 3.0), dpi=100)
        self.fig.subplots_adjust(left=0.12, right=0.98, bottom=0.15, top=0.9)
        ax = self.ax = self.fig.add_subplot(1, 1, 1)
        for axis in (ax.xaxis, ax.yaxis):
            axis.set_major_locator(MaxNLocator(5))
        ax.tick_params(labelsize=_FONT)
        ax.set_xlabel(xlabel, fontsize=_FONT)
        ax.set_ylabel(ylabel, fontsize=_FONT)
        ax.xaxis.set_label_coords(0.5, -0.12)  # fixed: no measuring of the tick labels to place the axis labels
        ax.yaxis.set_label_coords(-0.09, 0.5)
        ax.grid(alpha=0.3)
        self.empty = ax.text(0.5, 0.5, empty, ha="center", va="center", transform=ax.transAxes, fontsize=_FONT)

    def svg(self) -> str:
        import matplotlib

        buffer = io.StringIO()
        with matplotlib.rc_context(_RC):
            self.fig.savefig(buffer, format="svg", metadata={"Date": None})  # no date: the same data, the same SVG
        text = buffer.getvalue()
        return text[text.index("<svg") :]


class _LossPlot:
    """The global parameters' loss against the tokens the learners had trained when it was evaluated."""

    points, key = staticmethod(loss_points), staticmethod(loss_key)

    def __init__(self) -> None:
        self.f = _Figure("tokens (all learners)", "validation loss of the global parameters", "no evaluation yet")
        (self.line,) = self.f.ax.plot([], [], marker="o", markersize=3)

    def draw(self, points: tuple[tuple[float, float], ...]) -> str:
        self.line.set_data([p[0] for p in points], [p[1] for p in points])
        self.f.empty.set_visible(not points)
        ax = self.f.ax
        if points:
            ax.relim()
            ax.autoscale_view()
        return self.f.svg()


class _RatePlot:
    """Each learner's steps per second over the run's time (a gap: no reports, e.g. a killed site)."""

    points, key = staticmethod(rate_points), staticmethod(rate_key)

    def __init__(self) -> None:
        self.f = _Figure("seconds since the first report", "steps per second", "no reports yet")
        self.lines: dict[str, Any] = {}

    def draw(self, points: tuple[tuple[str, tuple[float, ...], tuple[float, ...]], ...]) -> str:
        ax, shown = self.f.ax, {m for m, _, _ in points}
        changed = False  # the learners shown (the legend's entries)
        for m in list(self.lines):
            if m not in shown:
                self.lines.pop(m).remove()
                changed = True
        for m, xs, ys in points:
            if m not in self.lines:
                # learner m's colour is its own, whichever learners were shown before
                (self.lines[m],) = ax.plot([], [], label=f"learner {m}", markersize=3, color=f"C{int(m) % 10}")
                changed = True
            line = self.lines[m]
            line.set_data(xs, ys)
            line.set_marker("." if len(xs) <= MARKERS_UP_TO else "None")
        if changed:
            if ax.get_legend() is not None:
                ax.get_legend().remove()
            if self.lines:
                # above the axes, in a row: it never hides a line, and "best" would search the lines' points
                ax.legend(
                    handles=[self.lines[m] for m in sorted(self.lines, key=int)], loc="lower left", bbox_to_anchor=(0.0, 1.0), ncol=len(self.lines), fontsize=_FONT, frameon=False,
                    borderaxespad=0.2, handlelength=1.5,
                )  # fmt: skip
        self.f.empty.set_visible(not points)
        if points:
            ax.relim()
            ax.autoscale_view()
        top = max((y for _, _, ys in points for y in ys if y == y), default=1.0)
        ax.set_ylim(0, 1.15 * top if top > 0 else 1.0)
        return self.f.svg()


class Plots:
    """The page's two SVGs, each drawn again only when its points changed and at least ``min_interval_s`` after
    its last drawing (else the last SVG again); ``draws`` counts the drawings per plot. Thread-safe."""

    def __init__(self, *, min_interval_s: float = 0.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.min_interval_s, self.clock = min_interval_s, clock
        self._lock = threading.Lock()
        self._plots: dict[str, Any] = {}
        self._last: dict[str, tuple[Any, Any, float, str]] = {}  # plot -> (its key, its points, drawn at, svg)
        self.draws = {"loss": 0, "rate": 0}

    def _svg(self, name: str, kind: type, snapshot: dict[str, Any], measure: Any) -> str:
        key, last = kind.key(snapshot), self._last.get(name)
        if last is not None and (key == last[0] or self.clock() - last[2] < self.min_interval_s):
            return last[3]  # the same data (by its key), or drawn too recently
        points = kind.points(snapshot)
        if last is not None and points == last[1]:  # new reports, but no new point (a rate spans 5 s)
            self._last[name] = (key, *last[1:])
            return last[3]
        with measure():
            if name not in self._plots:
                self._plots[name] = kind()
            svg = self._plots[name].draw(points)
        self._last[name] = (key, points, self.clock(), svg)
        self.draws[name] += 1
        return svg

    def svgs(self, snapshot: dict[str, Any], *, measure: Callable[[], Any] | None = None) -> tuple[str, str]:
        """``(loss plot, step-rate plot)`` of ``snapshot``; ``measure()``: a context manager around each drawing
        (e.g. :meth:`CpuMeter.measure`)."""
        import contextlib

        around = measure or contextlib.nullcontext
        with self._lock:
            return self._svg("loss", _LossPlot, snapshot, around), self._svg("rate", _RatePlot, snapshot, around)


def loss_svg(snapshot: dict[str, Any]) -> str:
    """The loss plot of ``snapshot``, drawn now (a page rendered once: a finished run's)."""
    return _LossPlot().draw(loss_points(snapshot))


def rate_svg(snapshot: dict[str, Any]) -> str:
    """The step-rate plot of ``snapshot``, drawn now."""
    return _RatePlot().draw(rate_points(snapshot))


__all__ = [
    "MARKERS_UP_TO", "RATE_SPAN_S", "Plots", "loss_key", "loss_points", "loss_svg", "rate_key", "rate_points",
    "rate_svg", "step_rates",
]  # fmt: skip
