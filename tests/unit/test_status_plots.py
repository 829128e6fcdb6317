"""The status page's plots (:mod:`diloco.decoupled.status.plots`): the live page draws a plot again only when the
points it shows changed (counted drawings, through the monitor's own page route), and a plot drawn on a reused
figure is the SVG a fresh figure draws of the same points."""

from __future__ import annotations

import math

from diloco.decoupled.status.board import Board
from diloco.decoupled.status.monitor import PLOT_EVERY_S, StatusPage
from diloco.decoupled.status.plots import Plots, loss_svg, rate_svg


def _report(t: float, m: int, step: int) -> dict:
    return dict(
        t=t, event="report", learner=m, fragment=0, step=step, steps=4, tokens=512.0, step_time=0.2, staleness=0,
        ignored=False,
    )  # fmt: skip


def _page() -> tuple[StatusPage, list[float]]:
    """A live page (no socket, no server: its ``/`` route called as the server's pool would) on a fake clock."""
    page = StatusPage(None, host="127.0.0.1")
    page.board = Board(num_learners=2, name="run")
    for m in (0, 1):
        page.board.observe({"t": 0.0, "event": "joined", "learner": m, "incarnation": 0})
    clock = [100.0]
    page.plots.clock = lambda: clock[0]
    return page, clock


def _feed(page: StatusPage, t0: int, t1: int) -> None:
    for t in range(t0, t1):  # one report a second from each learner, 2 and 3 steps a second
        for m in (0, 1):
            page.board.observe(_report(float(t), m, (2 + m) * t))


def test_a_page_load_draws_a_plot_again_only_when_its_points_changed():
    page, clock = _page()
    _feed(page, 0, 12)
    first = page._page({})[0]
    assert page.plots.draws == {"loss": 1, "rate": 1} and first.count("<svg") == 2
    clock[0] += 2 * PLOT_EVERY_S
    assert page._page({})[0] == first  # a second load, nothing new: the same page, nothing drawn
    assert page.plots.draws == {"loss": 1, "rate": 1}
    _feed(page, 12, 14)  # new reports, but no new step-rate point (a rate spans 5 s): nothing drawn
    page._page({})
    assert page.plots.draws == {"loss": 1, "rate": 1}
    _feed(page, 14, 20)  # new rate points: the rate plot is drawn again, not the loss plot
    page._page({})
    assert page.plots.draws == {"loss": 1, "rate": 2}
    _feed(page, 20, 26)  # more rate points, less than PLOT_EVERY_S after the last drawing: they wait
    clock[0] += PLOT_EVERY_S / 2
    page._page({})
    assert page.plots.draws == {"loss": 1, "rate": 2}
    clock[0] += PLOT_EVERY_S / 2  # and are drawn at the first load after it
    page._page({})
    assert page.plots.draws == {"loss": 1, "rate": 3}
    page.board.loss(t=26.0, loss=3.5)  # a new evaluation: the loss plot is drawn again, not the rate plot
    assert "(latest 3.5000)" in page._page({})[0]
    assert page.plots.draws == {"loss": 2, "rate": 3}
    calls = page.cpu.as_row()["calls"]  # each drawing counted in the page's CPU, the first two apart
    assert calls["plots (first)"] == 2 and calls["plots"] == 3


def _snapshot(seconds: int, learners: int) -> dict:
    series = {str(m): [[float(t), (2 + m) * t] for t in range(seconds) if not 40 < t < 80] for m in range(learners)}
    loss = [{"t": float(t), "tokens": 1e3 * t, "loss": 5 - math.log1p(t)} for t in range(0, seconds, 30)]
    return {"series": series, "loss": loss}


def test_a_reused_figure_draws_the_svg_a_fresh_figure_draws():
    plots = Plots()
    plots.svgs({"series": {}, "loss": []})  # the empty plots first ("no reports yet")
    plots.svgs(_snapshot(60, 2))  # then two learners, few points (markers)
    snap = _snapshot(500, 3)  # then a third learner, a gap, lines without markers
    reused = plots.svgs(snap)
    assert plots.draws == {"loss": 3, "rate": 3}
    assert reused == (loss_svg(snap), rate_svg(snap))
    assert "learner 2" in reused[1] and "no reports yet" not in reused[1]


def test_a_learner_shown_late_keeps_its_colour_and_its_place_in_the_legend():
    plots = Plots()
    early = _snapshot(60, 3)
    early["series"]["1"] = []  # learner 1 has no report yet
    plots.svgs(early)
    late = plots.svgs(_snapshot(60, 3))[1]
    fresh = rate_svg(_snapshot(60, 3))
    for svg in (late, fresh):
        assert svg.index("learner 0") < svg.index("learner 1") < svg.index("learner 2")
    colours = ("#1f77b4", "#ff7f0e", "#2ca02c")  # matplotlib's C0, C1, C2: learner m's is Cm
    assert [late.count(c) > 0 for c in colours] == [True] * 3
    assert [late.count(c) for c in colours] == [fresh.count(c) for c in colours]
