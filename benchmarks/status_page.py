"""What the live status page costs the syncer: a real service (``diloco syncer``) with 3 site jobs reporting, run once
with its page, metrics and JSON loaded every 0.5 s (four times what a browser's reload asks) and once with
``--no-status``, against the syncer's own merge time.

The page asks the syncer nothing (:mod:`diloco.decoupled.status.monitor`): it reads the files the syncer actor
writes on its host anyway (its events, merge records and checkpoints) and takes the learners' liveness from the
status the service's monitor reads every ``--poll`` seconds with or without a page. So the calls the syncer answers
are the same in both runs; what could still cost it is the monitor's own work (reading, evaluating checkpoints
every ``--status-eval`` seconds, drawing) taking the host's cores. Per run: the merges, the seconds they took
(the records' ``sync_time``, summed) and per merge, the syncer actor's process CPU seconds (``/proc``, read until
it stops) per merge, the service's process CPU seconds (the monitor: with the page, its server, its reads of the
syncer's files, its evaluations and drawing) and the machine's load when the run started. The claim: the page's run costs the syncer
under 1 % of its merge time more than the run without, within what two runs of this machine differ by (printed:
a tiny model merges in about 2 ms, and a loaded 2-core machine moves that by more than 1 %).

    python benchmarks/status_page.py            # both runs, about 4 minutes on 2 cores
    python benchmarks/status_page.py --quick    # fewer steps
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
from diloco.files import default_cache_dir


def _process_cpu_s(pid: int) -> float | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def one_run(out: Path, *, sets: dict[str, Any], cache: Path, page: bool) -> dict[str, Any]:
    loads = {"/": 0, "/metrics": 0, "/status.json": 0}
    load_avg = os.getloadavg()[0]
    extra = () if page else ("--no-status",)
    with WatchedRun(
        out=out, preset="tiny", sets=sets, cache_dir=cache, sites=3, status_eval_s=10, extra_args=extra
    ) as run:
        events = out / "syncer" / "syncer" / "events.jsonl"
        started = run.wait_for(
            "the syncer", lambda: [r for r in read_learner_log(events) if r["event"] == "started"], timeout=300
        )
        pid, cpu = int(started[-1]["pid"]), {"s": 0.0, "service": 0.0}
        service = run.procs["syncer"].pid
        stop = threading.Event()

        def watch() -> None:  # the actor's CPU until it stops (the service kills it at the end)
            while not stop.wait(0.2):
                got, mine = _process_cpu_s(pid), _process_cpu_s(service)
                if got is None:
                    return
                cpu["s"], cpu["service"] = got, mine or cpu["service"]

        def load() -> None:  # a browser (and a Prometheus) that never stops asking
            while not stop.wait(0.5):
                for path in loads:
                    try:
                        if run.get(path)[0] == 200:
                            loads[path] += 1
                    except OSError:  # the service ended
                        return

        threads = [threading.Thread(target=watch, daemon=True)]
        if page:
            run.wait_status()
            threads.append(threading.Thread(target=load, daemon=True))
        for t in threads:
            t.start()
        began = time.monotonic()
        run.wait()
        wall = time.monotonic() - began
        stop.set()
        for t in threads:
            t.join(timeout=30)
    merges = read_learner_log(out / "syncer" / "merges.jsonl")
    merge_s = sum(r["sync_time"] for r in merges)
    monitor = json.loads((out / "syncer" / "status.json").read_text())["monitor"] if page else {}
    return {
        "run": "page loaded every 0.5 s" if page else "--no-status",
        "merges": len(merges),
        "merge_s": merge_s,
        "merge_ms_each": 1e3 * merge_s / len(merges),
        "syncer_cpu_s": cpu["s"],
        "syncer_cpu_ms_per_merge": 1e3 * cpu["s"] / len(merges),
        "service_cpu_s": cpu["service"],
        "load_1min": load_avg,
        "monitor_read_s": monitor.get("read_s"),
        "monitor_eval_s": monitor.get("eval_s"),
        "page_loads": loads["/"],
        "metrics_scrapes": loads["/metrics"],
        "wall_s": wall,
    }


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
        rows = [
            one_run(Path(tmp) / name, sets=sets, cache=cache, page=page) for name, page in (("a", False), ("b", True))
        ]
    without, with_page = rows
    change = {
        "merge_ms_each": with_page["merge_ms_each"] / without["merge_ms_each"] - 1,
        "syncer_cpu_ms_per_merge": with_page["syncer_cpu_ms_per_merge"] / without["syncer_cpu_ms_per_merge"] - 1,
        "service_cpu_s": with_page["service_cpu_s"] - without["service_cpu_s"],
    }
    print_table(
        rows,
        [
            ("run", "run", ""),
            ("merges", "merges", "d"),
            ("merge ms each", "merge_ms_each", ".2f"),
            ("syncer CPU ms / merge", "syncer_cpu_ms_per_merge", ".1f"),
            ("service CPU s", "service_cpu_s", ".1f"),
            ("load", "load_1min", ".1f"),
            ("monitor read s", "monitor_read_s", ".2f"),
            ("monitor eval s", "monitor_eval_s", ".2f"),
            ("pages", "page_loads", "d"),
            ("scrapes", "metrics_scrapes", "d"),
            ("wall s", "wall_s", ".1f"),
        ],
        title=f"status page of a service with 3 site jobs (K = 1, {steps} steps padded to 0.1 s)",
    )
    print(
        f"with the page: merge time each {change['merge_ms_each']:+.1%}, the syncer's CPU per merge "
        f"{change['syncer_cpu_ms_per_merge']:+.1%}, the service's process {change['service_cpu_s']:+.1f} CPU s "
        f"(one run each; the calls the syncer answers are the same)"
    )
    write_result("status_page", {"machine": machine(), "settings": sets, "rows": rows, "change": change}, out=args.out)


if __name__ == "__main__":
    main()
