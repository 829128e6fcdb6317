"""The status page's plots, drawn by matplotlib as inline SVG from a board's snapshot: the loss of the global
parameters against the run's tokens, and each learner's step rate over time."""

from __future__ import annotations

import io
from typing import Any

#: Seconds each point of the step-rate plot spans at least (rates over shorter spans are mostly jitter).
RATE_SPAN_S = 5.0


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


def _svg(fig: Any) -> str:
    buffer = io.StringIO()
    fig.savefig(buffer, format="svg", bbox_inches="tight")
    text = buffer.getvalue()
    return text[text.index("<svg") :]


def _figure() -> tuple[Any, Any]:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(5.6, 3.0), dpi=100)
    return fig, fig.add_subplot(1, 1, 1)


def loss_svg(snapshot: dict[str, Any]) -> str:
    """The global parameters' loss against the tokens the learners had trained when it was evaluated."""
    import matplotlib

    with matplotlib.rc_context({"svg.fonttype": "none", "font.size": 9}):
        fig, ax = _figure()
        points = snapshot["loss"]
        if points:
            ax.plot([p["tokens"] for p in points], [p["loss"] for p in points], marker="o", markersize=3)
        else:
            ax.text(0.5, 0.5, "no evaluation yet", ha="center", va="center", transform=ax.transAxes)
        ax.set_xlabel("tokens (all learners)")
        ax.set_ylabel("validation loss of the global parameters")
        ax.grid(alpha=0.3)
        return _svg(fig)


def rate_svg(snapshot: dict[str, Any]) -> str:
    """Each learner's steps per second over the run's time (a gap: no reports, e.g. a killed site)."""
    import matplotlib

    with matplotlib.rc_context({"svg.fonttype": "none", "font.size": 9}):
        fig, ax = _figure()
        t0 = min((s[0][0] for s in snapshot["series"].values() if s), default=None)
        for m, series in sorted(snapshot["series"].items(), key=lambda kv: int(kv[0])):
            rates = step_rates(series)
            if rates and t0 is not None:
                xs, ys = [], []
                for (t, r), prev in zip(rates, [None, *rates[:-1]], strict=True):
                    if prev is not None and t - prev[0] > 4 * RATE_SPAN_S:  # a gap: break the line
                        xs.append(float("nan"))
                        ys.append(float("nan"))
                    xs.append(t - t0)
                    ys.append(r)
                ax.plot(xs, ys, label=f"learner {m}", marker=".", markersize=3)
        if ax.lines:
            ax.legend(loc="best")
        else:
            ax.text(0.5, 0.5, "no reports yet", ha="center", va="center", transform=ax.transAxes)
        ax.set_xlabel("seconds since the first report")
        ax.set_ylabel("steps per second")
        top = max((y for line in ax.lines for y in line.get_ydata() if y == y), default=1.0)
        ax.set_ylim(0, 1.15 * top if top > 0 else 1.0)
        ax.grid(alpha=0.3)
        return _svg(fig)


__all__ = ["RATE_SPAN_S", "loss_svg", "rate_svg", "step_rates"]
