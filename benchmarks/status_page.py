"""What the live status page costs against the syncer's merge time: a real service (``diloco syncer``) with 3 site
jobs reporting (K = 1, tiny model, steps padded to 0.1 s), its page viewed and not viewed in turns, in one run.

Viewed: the page asked every ``REFRESH_S`` (what a browser showing it asks: its own reload; 5 s, 2 s when the
guide's figures were measured) and ``/metrics`` scraped every 15 s of viewing (a Prometheus). Not viewed: nothing
asked. The run alternates the two in phases of ``PHASE_S`` seconds, in rounds (a round: one phase of each, the order swapped every round, so a machine that gets
busier during the run hits both alike).

Three figures, each measured where it can be resolved on a noisy 2-core machine:

(a) The page's CPU per second viewed: CPU time counted on the threads that spend it
    (:mod:`diloco.decoupled.status.cpu`; a loaded machine delays it but does not inflate it): each route's requests
    (the plots drawn for the page included) and the server's own thread, over the seconds viewed. *Before / after*
    the plot cache: the run's own page loads replayed in this process from the run's files (the board folded up to
    each load's time, every 2 s), each load served by the drawing before the cache (both plots drawn again on
    a new figure with a tight bounding box whenever the series grew, at most every 15 s: the code as it was, kept
    below) and by today's (:class:`~diloco.decoupled.status.plots.Plots`), the two alternating, on the same
    snapshots.
(b) The page's effect on the syncer: the merge time (the merge records' ``sync_time``: merge, outer step, encoding
    the replies) of the merges in viewed phases against those in the round's phase not viewed (the medians of
    each phase), the ratio per round, and the median of the rounds' ratios.
(c) The model size at which the page's CPU is 1 % of the merge time at this run's merge rate: the merge time grows
    with the values merged (``ns_per_learner_value``: seconds per value per learner, measured here, with the tiny
    model's fixed costs in it, and by ``benchmarks/syncer_merge.py`` for the run's codec at its largest size).

    python benchmarks/status_page.py            # 720 steps, about 3 minutes on 2 cores
    python benchmarks/status_page.py --quick    # 160 steps (a smoke run)
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from diloco.bench import RESULTS_DIR, add_out, add_quick, machine, print_table, round_ratios, write_result
from diloco.decoupled.chaos_logs import read_learner_log
from diloco.decoupled.site_faults import DEFAULT_SETS
from diloco.decoupled.status.board import Board
from diloco.decoupled.status.cpu import process_cpu_s
from diloco.decoupled.status.drive import WatchedRun
from diloco.decoupled.status.monitor import PLOT_EVERY_S, REFRESH_S
from diloco.decoupled.status.page import render
from diloco.decoupled.status.plots import Plots, step_rates
from diloco.files import default_cache_dir, read_json

#: Seconds between the scrapes of ``/metrics`` while viewed (a common Prometheus ``scrape_interval``).
SCRAPE_S = 15.0
#: ``--status-eval``: the service's default.
STATUS_EVAL_S = 30.0
#: Seconds of each phase (viewed, not viewed).
PHASE_S = 6.0


def one_run(out: Path, *, sets: dict[str, Any], cache: Path) -> dict[str, Any]:
    """The run (module docstring): what the page spent, the phases (viewed or not, their wall times), the merges."""
    asked = {"/": 0, "/metrics": 0}
    loads, phases = [os.getloadavg()[0]], []
    with WatchedRun(out=out, preset="tiny", sets=sets, cache_dir=cache, sites=3, status_eval_s=STATUS_EVAL_S) as run:
        events = out / "syncer" / "syncer" / "events.jsonl"
        started = run.wait_for(
            "the syncer", lambda: [r for r in read_learner_log(events) if r["event"] == "started"], timeout=300
        )
        pid, cpu = int(started[-1]["pid"]), {"s": 0.0}
        stop = threading.Event()

        def watch() -> None:  # the actor's CPU until it stops (the service kills it at the end)
            while not stop.wait(0.2):
                got = process_cpu_s(pid)
                if got is None:
                    return
                cpu["s"] = got

        def browse() -> None:  # phases: a browser showing the page and a Prometheus scraping, or nobody
            viewed_s, next_scrape, r = 0.0, 0.0, 0
            while not stop.is_set():
                for viewed in (True, False) if r % 2 == 0 else (False, True):
                    began = time.time()
                    while time.time() - began < PHASE_S and not stop.is_set():
                        if viewed:
                            due = ["/"] + (["/metrics"] if viewed_s + time.time() - began >= next_scrape else [])
                            next_scrape += SCRAPE_S if len(due) > 1 else 0.0
                            for path in due:
                                try:
                                    asked[path] += run.get(path)[0] == 200
                                except OSError:  # the service ended
                                    stop.set()
                        stop.wait(max(0.0, min(REFRESH_S, PHASE_S - (time.time() - began))))
                    if viewed:
                        viewed_s += time.time() - began
                    phases.append({"round": r, "viewed": viewed, "start": began, "end": time.time()})
                    loads.append(os.getloadavg()[0])
                r += 1

        run.wait_status()
        # the rounds begin once the syncer merges (before, the sites are still starting: nothing to compare)
        run.wait_for("the first merge", lambda: run.snapshot()["merges"]["total"] > 0, timeout=300)
        for path in ("/", "/metrics"):  # opened once before the rounds: the one-time costs (imports, first plots)
            assert run.get(path)[0] == 200
        first = run.snapshot()["monitor"]  # the monitor's CPU so far, per kind of work
        threads = [threading.Thread(target=f, daemon=True) for f in (watch, browse)]
        for t in threads:
            t.start()
        began = time.monotonic()
        run.wait()
        wall = time.monotonic() - began
        stop.set()
        for t in threads:
            t.join(timeout=30)
    merges = read_learner_log(out / "syncer" / "merges.jsonl")
    end = json.loads((out / "syncer" / "status.json").read_text())["monitor"]

    def since(kind: str, what: str = "cpu_s") -> Any:  # the rounds' share: at the end less after the opening
        return end[what].get(kind, 0) - first[what].get(kind, 0)

    server_first = first.get("server_thread_cpu_s") or 0.0
    server = (end.get("server_thread_cpu_s") or 0.0) - server_first
    return {
        "wall_s": wall,
        "load_1min": sum(loads) / len(loads),
        "viewed_s": sum(p["end"] - p["start"] for p in phases if p["viewed"]),
        "merges": len(merges),
        "merge_s": sum(r["sync_time"] for r in merges),
        "syncer_cpu_s": cpu["s"],
        "opening": {
            "page_cpu_s": first["cpu_s"].get("/", 0.0),
            "first_plots_cpu_s": first["cpu_s"].get("plots (first)", 0.0),
            "first_plots": first["calls"].get("plots (first)", 0),
            "metrics_cpu_s": first["cpu_s"].get("/metrics", 0.0),
            "status_json_cpu_s": first["cpu_s"].get("/status.json", 0.0),
            "server_thread_cpu_s": server_first,
        },
        "page_loads": asked["/"],
        "scrapes": asked["/metrics"],
        "page_cpu_s": since("/"),
        "plots_cpu_s": since("plots"),
        "plots": since("plots", "calls"),
        "metrics_cpu_s": since("/metrics"),
        "server_thread_cpu_s": server,
        "read_cpu_s": end["cpu_s"].get("read", 0.0),
        "reads": end["calls"].get("read", 0),
        "eval_cpu_s": end["cpu_s"].get("eval", 0.0),
        "evals": end["calls"].get("eval", 0),
        "serving_cpu_s": since("/") + since("/metrics") + server,
        "upkeep_cpu_s": end["cpu_s"].get("read", 0.0) + end["cpu_s"].get("eval", 0.0),
        "served": {k: since(k, "calls") for k in ("/", "/metrics")},
        "phases": phases,
        "merge_rows": [
            {"at": r["at"], "sync_time": r["sync_time"], "learners": len(r["learners"]), "fragment": r["fragment"]}
            for r in merges
        ],
    }


def rounds(r: dict[str, Any]) -> list[dict[str, Any]]:
    """Per round: the median merge time of the merges in its viewed phase and in its phase not viewed (a round
    whose phases hold fewer than 3 merges each is left out: the run's end)."""
    out = []
    for k in sorted({p["round"] for p in r["phases"]}):
        med = {}
        for p in (p for p in r["phases"] if p["round"] == k):
            times = [m["sync_time"] for m in r["merge_rows"] if p["start"] <= m["at"] < p["end"]]
            med["viewed" if p["viewed"] else "idle"] = (
                (statistics.median(times), len(times)) if len(times) >= 3 else None
            )
        if med.get("viewed") and med.get("idle"):
            row = {"round": k, "viewed_ms": 1e3 * med["viewed"][0], "idle_ms": 1e3 * med["idle"][0]}
            out.append({**row, "merges": med["viewed"][1] + med["idle"][1], "ratio": row["viewed_ms"] / row["idle_ms"]})
    return out


# -- before / after: the run's page loads replayed on the same snapshots ---------------------------------------------


def _old_svg(snapshot: dict[str, Any], which: str) -> str:
    """One plot as the page drew it before the plot cache: a new figure each time, saved with a tight bounding box
    (which draws it twice), matplotlib's default ticks, markers on every point, the legend placed "best"."""
    import matplotlib
    from matplotlib.figure import Figure

    with matplotlib.rc_context({"svg.fonttype": "none", "font.size": 9}):
        fig = Figure(figsize=(5.6, 3.0), dpi=100)
        ax = fig.add_subplot(1, 1, 1)
        if which == "loss":
            points = snapshot["loss"]
            if points:
                ax.plot([p["tokens"] for p in points], [p["loss"] for p in points], marker="o", markersize=3)
            else:
                ax.text(0.5, 0.5, "no evaluation yet", ha="center", va="center", transform=ax.transAxes)
            ax.set_xlabel("tokens (all learners)")
            ax.set_ylabel("validation loss of the global parameters")
        else:
            t0 = min((s[0][0] for s in snapshot["series"].values() if s), default=None)
            for m, series in sorted(snapshot["series"].items(), key=lambda kv: int(kv[0])):
                rates = step_rates(series)
                if rates and t0 is not None:
                    xs, ys = [], []
                    for (t, rate), prev in zip(rates, [None, *rates[:-1]], strict=True):
                        if prev is not None and t - prev[0] > 20.0:
                            xs.append(float("nan"))
                            ys.append(float("nan"))
                        xs.append(t - t0)
                        ys.append(rate)
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
        buffer = io.StringIO()
        fig.savefig(buffer, format="svg", bbox_inches="tight")
        text = buffer.getvalue()
        return text[text.index("<svg") :]


class _OldPage:
    """The page route before the plot cache: both plots drawn again when the series or the losses grew, at most
    every PLOT_EVERY_S."""

    def __init__(self) -> None:
        self.last: tuple[float, Any, tuple[str, str]] | None = None
        self.draws = 0

    def __call__(self, snap: dict[str, Any], now: float) -> str:
        grown = (len(snap["loss"]), sum(len(s) for s in snap["series"].values()))
        if self.last is None or (now - self.last[0] >= PLOT_EVERY_S and grown != self.last[1]):
            self.last = (now, grown, (_old_svg(snap, "loss"), _old_svg(snap, "rate")))
            self.draws += 2
        return render(snap, refresh_s=REFRESH_S, plots=self.last[2])


def replay(folder: Path, num_learners: int) -> dict[str, Any]:
    """The run's page loads (one every REFRESH_S of the run's time) served before and after the plot cache, on the
    board folded from the run's files up to each load, alternating which goes first: CPU seconds of each."""
    rows = sorted(read_learner_log(folder / "syncer" / "events.jsonl"), key=lambda row: row.get("t", 0.0))
    merges = sorted(read_learner_log(folder / "merges.jsonl"), key=lambda row: row.get("at", 0.0))
    losses = read_learner_log(folder / "status-loss.jsonl")
    feed = sorted(
        [(row.get("t", 0.0), 0, row) for row in rows]
        + [(row["at"], 1, row) for row in merges]
        + [(row["t"], 2, row) for row in losses],
        key=lambda x: (x[0], x[1]),
    )
    board = Board(num_learners=num_learners, name="replay")
    old, new = _OldPage(), Plots(min_interval_s=PLOT_EVERY_S)
    now, i, cpu, loads = feed[0][0], 0, {"before": 0.0, "after": 0.0}, 0
    clock = {"t": now - PLOT_EVERY_S}
    new.clock = lambda: clock["t"]
    _old_svg(board.snapshot(), "loss"), _old_svg(board.snapshot(), "rate"), new.svgs(board.snapshot())
    new.draws = {k: 0 for k in new.draws}  # (above: matplotlib's imports, its fonts, the figures; not timed)
    while i < len(feed):
        now += REFRESH_S
        while i < len(feed) and feed[i][0] <= now:
            _, kind, row = feed[i]
            if kind == 0:
                board.observe(row)
            elif kind == 1:
                board.merged(row)
            else:
                board.losses.append((float(row["t"]), float(row["tokens"]), float(row["loss"])))
            i += 1
        board.now, clock["t"] = max(board.now, now), now
        began = time.thread_time()
        snap = board.snapshot()  # (taken once: the same in both)
        took = time.thread_time() - began
        served = {
            "before": lambda: old(snap, now),
            "after": lambda: render(snap, refresh_s=REFRESH_S, plots=new.svgs(snap)),
        }
        for name in ("before", "after") if loads % 2 == 0 else ("after", "before"):
            began = time.thread_time()
            served[name]()
            cpu[name] += time.thread_time() - began + took
        loads += 1
    return {
        "seconds": now - feed[0][0],
        "loads": loads,
        "before_cpu_s": cpu["before"],
        "after_cpu_s": cpu["after"],
        "before_draws": old.draws,
        "after_draws": sum(new.draws.values()),
    }


# -- the model: how the merge time grows with it ---------------------------------------------------------------------


def model_values(folder: Path, cache: Path) -> tuple[int, list[int]]:
    """The run's model: its trainable values and each fragment's (built as the service builds it)."""
    from diloco.algorithm.fragments import split_fragments
    from diloco.train.config import TrainConfig
    from diloco.train.inputs import prepare_inputs, run_fragments

    cfg = TrainConfig.from_dict(read_json(folder / "config.json"))
    model = prepare_inputs(cfg, cache).model
    fragments = split_fragments(
        model, cfg.num_fragments, pattern=cfg.fragment_pattern, fragments=run_fragments(cfg, model)
    )
    return sum(f.numel for f in fragments), [f.numel for f in fragments]


def merge_ns_reference(codec: str, merge: str) -> dict[str, Any] | None:
    """``benchmarks/syncer_merge.py``'s row for ``codec`` and ``merge`` (else any merge rule) at its largest size
    (most learners): ns per value per learner, where the fixed costs no longer count."""
    path = RESULTS_DIR / "syncer_merge.json"
    if not path.is_file():
        return None
    rows = [r for r in read_json(path)["rows"] if r.get("codec") == codec and r.get("ns_per_learner_value")]
    rows = [r for r in rows if r.get("merge") == merge] or rows
    if not rows:
        return None
    best = max(rows, key=lambda r: (r["values"], r["learners"]))
    keys = ("values", "learners", "codec", "merge", "ns_per_learner_value")
    return {k: best[k] for k in keys}


# -- the figures -----------------------------------------------------------------------------------------------------


def figures(
    r: dict[str, Any], before_after: dict[str, Any], values: int, fragment_values: list[int]
) -> tuple[Any, Any]:
    """(a) the page's CPU per second viewed, (b) the rounds' merge-time ratio, (c) the break-even model size."""
    per_viewed_s = r["serving_cpu_s"] / r["viewed_s"]
    merge_s_per_s = r["merge_s"] / r["wall_s"]
    merges_per_s = r["merges"] / r["wall_s"]
    learner_values = sum(
        m["learners"] * v for m, v in zip(r["merge_rows"], _fragment_of(r, fragment_values), strict=True)
    )
    ns_here = 1e9 * r["merge_s"] / learner_values
    learners = statistics.mean(m["learners"] for m in r["merge_rows"])
    values_per_merge = statistics.mean(fragment_values)

    def break_even(ns: float) -> float:  # values at which per_viewed_s = 1 % of merges_per_s * merge time
        return per_viewed_s / 0.01 / (merges_per_s * learners * (values_per_merge / values) * ns * 1e-9)

    rr = rounds(r)
    ratios, median = round_ratios([x["viewed_ms"] for x in rr], [x["idle_ms"] for x in rr]) if rr else ([], None)
    return {  # (and the function, for other ns per value)
        "page_cpu_ms_per_viewed_s": 1e3 * per_viewed_s,
        "merge_ms_per_s": 1e3 * merge_s_per_s,
        "of_merge_time": per_viewed_s / merge_s_per_s,
        "times_1pct": per_viewed_s / merge_s_per_s / 0.01,
        "of_syncer_cpu": r["serving_cpu_s"] / r["syncer_cpu_s"] if r["syncer_cpu_s"] else None,
        "before_ms_per_viewed_s": 1e3 * before_after["before_cpu_s"] / before_after["seconds"],
        "after_ms_per_viewed_s": 1e3 * before_after["after_cpu_s"] / before_after["seconds"],
        "rounds": rr,
        "round_ratios": ratios,
        "median_round_ratio": median,
        "ratio_quartiles": statistics.quantiles(ratios, n=4) if len(ratios) >= 2 else None,
        "model_values": values,
        "merges_per_s": merges_per_s,
        "learners_per_merge": learners,
        "ns_per_learner_value_here": ns_here,
        "break_even_values_here": break_even(ns_here),
    }, break_even


def _fragment_of(r: dict[str, Any], fragment_values: list[int]) -> list[int]:
    return [fragment_values[m["fragment"] % len(fragment_values)] for m in r["merge_rows"]]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cache-dir", type=Path, default=None, help="token cache (default: the CLI's)")
    add_quick(ap, "160 steps instead of 720")
    add_out(ap, "status_page")
    args = ap.parse_args()
    steps = 160 if args.quick else 720
    sets = {**DEFAULT_SETS, "replicas": 3, "global_batch": 12, "steps": steps, "eval_every": steps, "step_time": 0.1}
    cache = args.cache_dir or default_cache_dir()
    with tempfile.TemporaryDirectory() as tmp:
        r = one_run(Path(tmp) / "run", sets=sets, cache=cache)
        folder = Path(tmp) / "run" / "syncer"
        before_after = replay(folder, num_learners=3)
        values, fragment_values = model_values(folder, cache)
        config = read_json(folder / "config.json")
    f, break_even = figures(r, before_after, values, fragment_values)
    o = r["opening"]
    per = [
        {"work": "opening: the first page (/)", "calls": 1, "cpu_s": o["page_cpu_s"]},
        {"work": "  of which: the first 2 plots", "calls": o["first_plots"], "cpu_s": o["first_plots_cpu_s"]},
        {"work": "opening: the first scrape (/metrics)", "calls": 1, "cpu_s": o["metrics_cpu_s"]},
        {"work": "viewed: page (/), plots included", "calls": r["served"]["/"], "cpu_s": r["page_cpu_s"]},
        {"work": "  of which: drawing a plot again", "calls": r["plots"], "cpu_s": r["plots_cpu_s"]},
        {"work": "viewed: metrics (/metrics)", "calls": r["served"]["/metrics"], "cpu_s": r["metrics_cpu_s"]},
        {"work": "viewed: server thread (aiohttp)", "calls": r["page_loads"] + r["scrapes"],
         "cpu_s": r["server_thread_cpu_s"]},
        {"work": "upkeep: reads of the syncer's files", "calls": r["reads"], "cpu_s": r["read_cpu_s"]},
        {"work": f"upkeep: evaluations (every {STATUS_EVAL_S:g} s)", "calls": r["evals"], "cpu_s": r["eval_cpu_s"]},
    ]  # fmt: skip
    for row in per:
        row["ms_each"] = 1e3 * row["cpu_s"] / row["calls"] if row["calls"] else None
    print_table(
        per,
        [("work", "work", ""), ("calls", "calls", "d"), ("CPU s", "cpu_s", ".3f"), ("CPU ms each", "ms_each", ".2f")],
        title=(
            f"(a) the status page's CPU over one run: 3 site jobs, K = 1, {steps} steps padded to 0.1 s, "
            f"{r['wall_s']:.0f} s, viewed {r['viewed_s']:.0f} s of it (page every {REFRESH_S} s, metrics every "
            f"{SCRAPE_S:g} s viewed); load (1 min) {r['load_1min']:.1f} on {os.cpu_count()} cores"
        ),
    )
    ba = [
        {"page": "before the plot cache (replayed)", "loads": before_after["loads"], "draws": before_after["before_draws"],
         "ms_per_s": f["before_ms_per_viewed_s"]},
        {"page": "after (replayed)", "loads": before_after["loads"], "draws": before_after["after_draws"],
         "ms_per_s": f["after_ms_per_viewed_s"]},
        {"page": "after, live (page + metrics + aiohttp, viewed)", "loads": r["page_loads"], "draws": r["plots"],
         "ms_per_s": f["page_cpu_ms_per_viewed_s"]},
    ]  # fmt: skip
    print_table(
        ba,
        [
            ("page", "page", ""),
            ("loads", "loads", "d"),
            ("plots drawn", "draws", "d"),
            ("CPU ms per s viewed", "ms_per_s", ".2f"),
        ],  # fmt: skip
        title=f"the page before / after, the run's {before_after['seconds']:.0f} s of loads replayed on the same snapshots",
    )
    print_table(
        f["rounds"],
        [
            ("round", "round", "d"),
            ("merges", "merges", "d"),
            ("viewed ms", "viewed_ms", ".3f"),
            ("not viewed ms", "idle_ms", ".3f"),
            ("ratio", "ratio", ".3f"),
        ],  # fmt: skip
        title="(b) the syncer's merge time (median of each phase's merges), page viewed / not viewed, per round",
    )
    q = f["ratio_quartiles"]
    print(
        f"median of the rounds' ratios: {f['median_round_ratio']:.3f}"
        + (f" (quartiles {q[0]:.3f} .. {q[2]:.3f}, {len(f['rounds'])} rounds)" if q else "")
        if f["median_round_ratio"] is not None
        else "no round with 3 merges in each phase"
    )
    ref = merge_ns_reference(str(config.get("codec")), str(config.get("merge")))
    sizes = [{"ns from": "this run (tiny: fixed costs included)", "ns": f["ns_per_learner_value_here"]}]
    if ref is not None:
        sizes.append({"ns from": f"syncer_merge.json ({ref['codec']} {ref['merge']}, {ref['values'] / 1e6:.1f} M values)",
                      "ns": ref["ns_per_learner_value"]})  # fmt: skip
    for row in sizes:
        row["values"] = break_even(row["ns"])
    print(
        f"(c) the page viewed: {f['page_cpu_ms_per_viewed_s']:.2f} ms of CPU per second; the syncer merges "
        f"{f['merge_ms_per_s']:.2f} ms per second ({f['merges_per_s']:.2f} merges/s of {f['learners_per_merge']:.2f} "
        f"learners, model {values} values in {len(fragment_values)} fragments): the page is "
        f"{f['of_merge_time']:.1%} of the merge time ({f['times_1pct']:.0f}x the 1 %)"
    )
    print_table(
        sizes,
        [("ns per value per learner from", "ns from", ""), ("ns", "ns", ".2f"), ("values for 1 %", "values", ".3g")],
        title="model size above which the page viewed is under 1 % of the merge time, at this run's merge rate",
    )
    verdict = f["of_merge_time"] < 0.01
    print(f"claim 'under 1 % of the syncer's merge time' (tiny model): {'holds' if verdict else 'not shown'}")
    payload = {
        "machine": machine(),
        "settings": {**sets, "phase_s": PHASE_S, "refresh_s": REFRESH_S, "scrape_s": SCRAPE_S},
        "run": {k: v for k, v in r.items() if k != "merge_rows"},  # (each merge: in the rounds' medians)
        "per_work": per,
        "before_after": {**before_after, "rows": ba},
        "figures": f,
        "break_even": {"merge_ns_reference": ref, "rows": sizes},
        "under_1pct": verdict,
    }
    write_result("status_page", payload, out=args.out)


if __name__ == "__main__":
    main()
