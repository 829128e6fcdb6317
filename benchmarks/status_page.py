"""What the live status page costs against the syncer's merge time: a real service (``diloco syncer``) with 3 site
jobs reporting (K = 1, steps padded to 0.1 s), its page asked for as a browser showing it asks (the page every
``REFRESH_S`` = 2 s, its own reload) and scraped as Prometheus would (``/metrics`` every 15 s), in one run.

The page runs in the service's process, not in the syncer actor's, and asks the syncer nothing
(:mod:`diloco.decoupled.status.monitor`): what it can take from the syncer is CPU of the host. So it is measured as
CPU time, counted where it is spent (:mod:`diloco.decoupled.status.cpu`, per thread, so a loaded machine delays it
but does not inflate it): *serving* (each route's requests on their pool thread, the plots drawn for the page
included, plus the server's own thread: accepting, parsing, the token) and *upkeep* (the monitor's reads of the
syncer's files every second and its evaluations of the newest checkpoint every ``--status-eval`` = 30 s, the
default, for the loss plot; these run whether or not anyone looks). The syncer's side, from the same run: its
merge time (the merge records' ``sync_time``, summed: merge, outer step, encoding the replies) and its actor
process's CPU seconds (``/proc``, everything it does: Ray and gRPC calls, checkpoints, merges). The ratios of the
two are the figures; they compare CPU seconds with seconds of one run, so the machine's load moves them little
(the merge time, a wall time, grows under load: that lowers the first ratio, so the run's load is printed).

The claim was "under 1 % of the syncer's merge time". The script prints each share and how far it is from 1 %.

    python benchmarks/status_page.py            # 300 steps, about 2 minutes on 2 cores
    python benchmarks/status_page.py --quick    # 120 steps
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from diloco.bench import add_out, add_quick, machine, print_table, write_result
from diloco.decoupled.chaos_logs import read_learner_log
from diloco.decoupled.site_faults import DEFAULT_SETS
from diloco.decoupled.status.drive import WatchedRun
from diloco.decoupled.status.monitor import PLOT_EVERY_S, REFRESH_S
from diloco.files import default_cache_dir

#: Seconds between the scrapes of ``/metrics`` (a common Prometheus ``scrape_interval``).
SCRAPE_S = 15.0
#: ``--status-eval``: the service's default.
STATUS_EVAL_S = 30.0


def _process_cpu_s(pid: int) -> float | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def one_run(out: Path, *, sets: dict[str, Any], cache: Path) -> dict[str, Any]:
    """The run (module docstring): what the page spent (CPU s per kind, its calls) and what the syncer did."""
    asked = {"/": 0, "/metrics": 0}
    loads = [os.getloadavg()[0]]
    with WatchedRun(out=out, preset="tiny", sets=sets, cache_dir=cache, sites=3, status_eval_s=STATUS_EVAL_S) as run:
        events = out / "syncer" / "syncer" / "events.jsonl"
        started = run.wait_for(
            "the syncer", lambda: [r for r in read_learner_log(events) if r["event"] == "started"], timeout=300
        )
        pid, cpu = int(started[-1]["pid"]), {"s": 0.0}
        stop = threading.Event()

        def watch() -> None:  # the actor's CPU until it stops (the service kills it at the end)
            while not stop.wait(0.2):
                got = _process_cpu_s(pid)
                if got is None:
                    return
                cpu["s"] = got

        def browse() -> None:  # a browser showing the page, and a Prometheus scraping the metrics
            next_scrape = time.monotonic()
            while not stop.wait(REFRESH_S):
                due = ["/"] + (["/metrics"] if time.monotonic() >= next_scrape else [])
                next_scrape += SCRAPE_S if len(due) > 1 else 0.0
                for path in due:
                    try:
                        asked[path] += run.get(path)[0] == 200
                    except OSError:  # the service ended
                        return
                loads.append(os.getloadavg()[0])

        run.wait_status()
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
    monitor = json.loads((out / "syncer" / "status.json").read_text())["monitor"]
    spent, calls = monitor["cpu_s"], monitor["calls"]
    server = monitor.get("server_thread_cpu_s") or 0.0
    serving = spent.get("/", 0.0) + spent.get("/metrics", 0.0) + spent.get("/status.json", 0.0) + server
    upkeep = spent.get("read", 0.0) + spent.get("eval", 0.0)
    return {
        "wall_s": wall,
        "load_1min": sum(loads) / len(loads),
        "merges": len(merges),
        "merge_s": sum(r["sync_time"] for r in merges),
        "syncer_cpu_s": cpu["s"],
        "page_loads": asked["/"],
        "scrapes": asked["/metrics"],
        "page_cpu_s": spent.get("/", 0.0),
        "plots_cpu_s": spent.get("plots", 0.0),
        "plots": calls.get("plots", 0),
        "metrics_cpu_s": spent.get("/metrics", 0.0),
        "server_thread_cpu_s": server,
        "read_cpu_s": spent.get("read", 0.0),
        "reads": calls.get("read", 0),
        "eval_cpu_s": spent.get("eval", 0.0),
        "evals": calls.get("eval", 0),
        "serving_cpu_s": serving,
        "upkeep_cpu_s": upkeep,
        "served": {k: calls.get(k, 0) for k in ("/", "/metrics", "/status.json")},
    }


def shares(r: dict[str, Any]) -> list[dict[str, Any]]:
    """The page's CPU (serving; serving and upkeep) as shares of the syncer's merge time and of its CPU."""
    rows = []
    for what, cpu in (
        ("serving (page + metrics)", r["serving_cpu_s"]),
        ("serving + upkeep", r["serving_cpu_s"] + r["upkeep_cpu_s"]),
    ):
        rows.append(
            {
                "page work": what,
                "cpu_s": cpu,
                "of_merge_time": cpu / r["merge_s"],
                "of_syncer_cpu": cpu / r["syncer_cpu_s"],
                "core_share": cpu / r["wall_s"],
                "times_1pct": cpu / r["merge_s"] / 0.01,
            }
        )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cache-dir", type=Path, default=None, help="token cache (default: the CLI's)")
    add_quick(ap, "120 steps instead of 300")
    add_out(ap, "status_page")
    args = ap.parse_args()
    steps = 120 if args.quick else 300
    sets = {**DEFAULT_SETS, "replicas": 3, "global_batch": 12, "steps": steps, "eval_every": steps, "step_time": 0.1}
    cache = args.cache_dir or default_cache_dir()
    with tempfile.TemporaryDirectory() as tmp:
        r = one_run(Path(tmp) / "run", sets=sets, cache=cache)
    per = [
        {"work": "page (/), plots included", "calls": r["served"]["/"], "cpu_s": r["page_cpu_s"]},
        {"work": "  of which: drawing the plots", "calls": r["plots"], "cpu_s": r["plots_cpu_s"]},
        {"work": "metrics (/metrics)", "calls": r["served"]["/metrics"], "cpu_s": r["metrics_cpu_s"]},
        {"work": "server thread (aiohttp)", "calls": r["page_loads"] + r["scrapes"], "cpu_s": r["server_thread_cpu_s"]},
        {"work": "reads of the syncer's files", "calls": r["reads"], "cpu_s": r["read_cpu_s"]},
        {"work": f"evaluations (every {STATUS_EVAL_S:g} s)", "calls": r["evals"], "cpu_s": r["eval_cpu_s"]},
    ]
    for row in per:
        row["ms_each"] = 1e3 * row["cpu_s"] / row["calls"] if row["calls"] else None
    print_table(
        per,
        [("work", "work", ""), ("calls", "calls", "d"), ("CPU s", "cpu_s", ".3f"), ("CPU ms each", "ms_each", ".2f")],
        title=(
            f"the status page's CPU over one run: 3 site jobs, K = 1, {steps} steps padded to 0.1 s, {r['wall_s']:.0f} s, "
            f"page every {REFRESH_S} s, metrics every {SCRAPE_S:g} s (plots redrawn at most every {PLOT_EVERY_S:g} s)"
        ),
    )
    print(
        f"the syncer in the same run: {r['merges']} merges, {r['merge_s']:.3f} s of merge time "
        f"({1e3 * r['merge_s'] / r['merges']:.2f} ms each), {r['syncer_cpu_s']:.2f} s of its process's CPU; "
        f"load (1 min) {r['load_1min']:.1f} on {os.cpu_count()} cores"
    )
    table = shares(r)
    print_table(
        table,
        [
            ("page work", "page work", ""),
            ("CPU s", "cpu_s", ".3f"),
            ("of merge time", "of_merge_time", ".1%"),
            ("of syncer CPU", "of_syncer_cpu", ".2%"),
            ("of one core", "core_share", ".2%"),
            ("x the 1 % claim", "times_1pct", ".0f"),
        ],
        title="the page's CPU as a share of the syncer's (same run)",
    )
    verdict = table[0]["of_merge_time"] < 0.01
    # what the merges would have to take for the serving to be 1 % of them: seconds of merging per second of run
    needed = {
        "merge_s_per_s_needed": r["serving_cpu_s"] / 0.01 / r["wall_s"],
        "merge_s_per_s_needed_without_plots": (r["serving_cpu_s"] - r["plots_cpu_s"]) / 0.01 / r["wall_s"],
        "merge_s_per_s_here": r["merge_s"] / r["wall_s"],
    }
    print(
        f"claim 'under 1 % of the syncer's merge time': {'holds' if verdict else 'not shown'} "
        f"(serving {table[0]['of_merge_time']:.1%} of the merge time, {table[0]['times_1pct']:.0f}x the 1 %). "
        f"For 1 % the syncer would have to merge {needed['merge_s_per_s_needed']:.2f} s per second of the run "
        f"({needed['merge_s_per_s_needed_without_plots']:.2f} s without the plots); here it merges "
        f"{needed['merge_s_per_s_here']:.4f} s per second"
    )
    payload = {"machine": machine(), "settings": sets, "run": r, "per_work": per, "shares": table}
    write_result("status_page", {**payload, "break_even": needed, "under_1pct": verdict}, out=args.out)


if __name__ == "__main__":
    main()
