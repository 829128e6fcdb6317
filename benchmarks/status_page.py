"""What the live status page costs the syncer: a real service (``diloco syncer``) with 3 site jobs reporting, its page,
metrics and JSON loaded every 0.5 s (four times what a browser's reload asks), against the syncer's own merge time.

The page is served by the service's monitor from the board its last poll left (:mod:`diloco.decoupled.status`):
a request calls nothing on the syncer. What the syncer pays is the monitor's poll, one ``status_feed`` call
every 2 s, which the actor times itself: its seconds in those calls (``status_busy_s``, wall clock) and its thread's
CPU seconds in them (``status_cpu_s``), against the seconds it spent merging (the merge records' ``sync_time``,
wall clock, summed) over the same run: the target is under 1 %. Those timers start inside the call: Ray's own work
in the actor's process for a call (receiving it, scheduling it, sending the answer back, on its C++ threads too) is
measured apart, on an actor of its own after the run: the process's CPU time (``/proc``) over 500 ``status_feed``
calls, less that over 500 calls of a method that does nothing, gives the feed's whole cost per call in the syncer's
process (``feed_call_cpu_s``) and the bare cost of any call (``noop_call_cpu_s``); x the run's calls, over its
merge seconds: ``whole_call_share_of_merge_time``. The monitor's wall time in its polls (round trips, queueing
behind merges on a loaded machine included) is printed too, and, separately, what the loss plot's evaluation
costs (fetching the global parameters every ``--status-eval`` seconds). A tiny model merges in about 2 ms, so this
is the page's worst case: a larger model's merges take longer, its poll no longer.

    python benchmarks/status_page.py            # about 2 minutes on 2 cores
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

from diloco.bench import add_out, add_quick, machine, print_table, write_result
from diloco.decoupled.site_faults import DEFAULT_SETS
from diloco.decoupled.status.drive import WatchedRun
from diloco.files import default_cache_dir


def _process_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def call_costs(calls: int = 500) -> tuple[float, float]:
    """CPU seconds of the syncer actor's process per ``status_feed`` call and per call of a method that does nothing
    (``pid``), each Ray's whole work for the call included: a tiny syncer on an actor of its own, on a local Ray."""
    import ray
    import torch

    from diloco.decoupled.ray_transport import start_syncer
    from diloco.decoupled.syncer import Syncer

    model = torch.nn.Sequential(torch.nn.Linear(16, 16))
    with tempfile.TemporaryDirectory() as tmp:
        ray.init(include_dashboard=False, log_to_driver=False, num_cpus=1)
        try:
            actor = start_syncer(Syncer(model, num_learners=3), name="status-cost", checkpoint_dir=tmp)
            pid = ray.get(actor.pid.remote())
            feed = ray.get(actor.status_feed.remote("", 0, 0))
            costs = []
            for call in (
                lambda: actor.status_feed.remote(feed["feed"], feed["next"], feed["merges"]),
                actor.pid.remote,
            ):
                ray.get([call() for _ in range(20)])  # warm
                before = _process_cpu_s(pid)
                for _ in range(calls):
                    ray.get(call())  # one at a time, as the monitor calls
                costs.append((_process_cpu_s(pid) - before) / calls)
        finally:
            ray.shutdown()
    return costs[0], costs[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cache-dir", type=Path, default=None, help="token cache (default: the CLI's)")
    add_quick(ap, "120 steps instead of 300")
    add_out(ap, "status_page")
    args = ap.parse_args()
    steps = 120 if args.quick else 300
    sets = {**DEFAULT_SETS, "replicas": 3, "global_batch": 12, "steps": steps, "eval_every": steps, "step_time": 0.1}
    loads = {"/": 0, "/metrics": 0, "/status.json": 0}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        cache = args.cache_dir or default_cache_dir()
        with WatchedRun(out=out, preset="tiny", sets=sets, cache_dir=cache, sites=3, status_eval_s=10) as run:
            run.wait_status()
            stop = threading.Event()

            def load() -> None:  # a browser (and a Prometheus) that never stops asking
                while not stop.wait(0.5):
                    for path in loads:
                        try:
                            if run.get(path)[0] == 200:
                                loads[path] += 1
                        except OSError:  # the service ended
                            return

            began = time.monotonic()
            client = threading.Thread(target=load, daemon=True)
            client.start()
            run.wait()
            stop.set()
            client.join(timeout=30)
            wall = time.monotonic() - began
        svc = out / "syncer"
        status = json.loads((svc / "status.json").read_text())
        merges = [json.loads(line) for line in (svc / "merges.jsonl").read_text().splitlines()]
    merge_s = sum(r["sync_time"] for r in merges)
    feed_call, noop_call = call_costs()
    syncer, monitor = status["syncer"], status["monitor"]
    row = {
        "learners": 3,
        "steps": steps,
        "merges": len(merges),
        "merge_s": merge_s,
        "status_calls": syncer["status_calls"],
        "status_busy_s": syncer["status_busy_s"],
        "page_share_of_merge_time": syncer["status_busy_s"] / merge_s,
        "status_cpu_s": syncer["status_cpu_s"],
        "page_cpu_share_of_merge_time": syncer["status_cpu_s"] / merge_s,
        "feed_call_cpu_s": feed_call,
        "noop_call_cpu_s": noop_call,
        "whole_call_share_of_merge_time": feed_call * syncer["status_calls"] / merge_s,
        "poll_wall_s": monitor["poll_s"],
        "poll_wall_share_of_merge_time": monitor["poll_s"] / merge_s,
        "eval_fetch_s": monitor["eval_fetch_s"],
        "eval_share_of_merge_time": monitor["eval_fetch_s"] / merge_s,
        "page_loads": loads["/"],
        "metrics_scrapes": loads["/metrics"],
        "json_loads": loads["/status.json"],
        "wall_s": wall,
    }
    row["call_us"] = f"{feed_call * 1e6:.0f} / {noop_call * 1e6:.0f}"
    print_table(
        [row],
        [
            ("merges", "merges", "d"),
            ("merge s", "merge_s", ".3f"),
            ("feed calls", "status_calls", "d"),
            ("feed s (syncer)", "status_busy_s", ".4f"),
            ("feed / merge", "page_share_of_merge_time", ".2%"),
            ("feed CPU / merge", "page_cpu_share_of_merge_time", ".2%"),
            ("call us (feed / no-op)", "call_us", ""),
            ("whole calls / merge", "whole_call_share_of_merge_time", ".2%"),
            ("poll wall / merge", "poll_wall_share_of_merge_time", ".2%"),
            ("eval fetch / merge", "eval_share_of_merge_time", ".2%"),
            ("pages", "page_loads", "d"),
            ("scrapes", "metrics_scrapes", "d"),
            ("wall s", "wall_s", ".1f"),
        ],
        title=f"status page of a service with 3 site jobs (K = 1, {steps} steps padded to 0.1 s), loaded every 0.5 s",
    )
    write_result("status_page", {"machine": machine(), "settings": sets, "rows": [row]}, out=args.out)


if __name__ == "__main__":
    main()
