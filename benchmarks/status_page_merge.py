"""What the live status page costs the syncer at a realistic size: the page viewed while the syncer merges the
reports of 3 learners for a 44.6 M-value model (fp32 exchange, RDA: the service's defaults), measured directly.

``benchmarks/status_page.py`` runs the whole service with 3 real site jobs, but on the tiny model, whose merges
(~1.6 ms) are so short that the page costs a quarter of their time: it can only extrapolate the page's share to a
larger model. Here the syncer merges a model of size ``35M`` (Scaling Laws for DiLoCo's shape: 6 layers, d = 512)
on GPT-2's vocabulary (50,257 tokens, tied embedding: 44.6 M values), for real, in a process of its own as in the
service, and the page is served beside it:

* The syncer (:mod:`diloco.bench.page_merge`, a plain subprocess instead of a Ray actor): the syncer built by the
  service's own function from the run's config (3 learners, K = M, one fragment, fp32, RDA, the guard), inside the
  syncer actor's own class called on the process's event loop, writing its events and merge records to the run's
  folder as the service's actor does; its torch on one thread, as Ray runs an actor that asks for no CPU. Not as
  in the service: its state is not written after each merge (the write is timed once and reported; the service's
  merge time, ``sync_time``, leaves it out too), and the 3 learners are stood in for by synthetic reports (random
  outer gradients of the model's size, encoded with the run's codec): 3 learners training a 44.6 M model cannot
  run on 2 cores beside it. Each round of 3 reports merges at once, one every ``--every`` seconds (default 1.5 s:
  the default H = 30 steps of 50 ms, a 45 M model on one GPU; the merge time per second, and so the page's share,
  scales with the merge rate, so the interval at which the page would be 1 % is reported too).
* The page (this process): the service's monitor (:class:`~diloco.decoupled.status.monitor.StatusPage`: its aiohttp
  server, its board folded every second from the syncer's files, its plots), with the liveness the service's
  monitor asks the syncer for every 5 s (``--poll``) given as all 3 live, and a loss point every 30 s
  (``--status-eval``'s default; the value synthetic, the evaluation itself, upkeep paid page or not, left out).
  Viewed as a browser views it: ``/`` every ``REFRESH_S`` (5 s) with ``?token=``, ``/metrics`` every 15 s of viewing
  with the bearer token (the requests from a thread of this process, whose own CPU is not the page's).

Viewed and not viewed alternate in phases of ``--phase`` seconds, in rounds (one phase of each, the order swapped
every round). Two figures:

(1) the page's CPU per second viewed, counted as ``benchmarks/status_page.py`` counts it (the CPU time of its routes'
    threads, the plots drawn in them included, and of the server's thread) against the syncer's merge time per
    second (the merges' ``sync_time``, wall time) at this size and merge rate, and against the merges' CPU time per
    second (the syncer thread's CPU clock around the call that merges: on a loaded machine the wall time of a merge
    grows with the load, its CPU time hardly); beside them, the serving process's CPU per second viewed less not
    viewed (its own clock, less the browser's thread), and the syncer process's CPU.
(2) the merge times in viewed against not-viewed phases: the median of each phase, the ratio per round, the median
    of the rounds' ratios and their quartiles, for the wall time and for the CPU time.

    python benchmarks/status_page_merge.py            # 20 rounds of 2 x 12 s, about 9 minutes on 2 cores
    python benchmarks/status_page_merge.py --quick    # a 2 M model, 2 rounds of 2 x 2 s (a smoke run, ~20 s)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from diloco.bench import RESULTS_DIR, add_out, add_quick, machine, print_table, write_result
from diloco.bench.page_merge import figures
from diloco.decoupled.chaos_logs import read_learner_log
from diloco.decoupled.status.cpu import process_cpu_s
from diloco.decoupled.status.files import shard_dirs
from diloco.decoupled.status.monitor import REFRESH_S, StatusPage
from diloco.status.server import status_token
from diloco.train.config import TrainConfig

#: Seconds between the scrapes of ``/metrics`` while viewed (a common Prometheus ``scrape_interval``).
SCRAPE_S = 15.0
#: The service's ``--poll`` (the monitor's status calls) and ``--status-eval`` (a loss point) defaults.
POLL_S, LOSS_EVERY_S = 5.0, 30.0
LEARNERS = 3
FULL = {"size": "35M", "vocab_size": 50_257, "every_s": 1.5, "phase_s": 12.0, "rounds": 20}
QUICK = {"size": "cpu-1m", "vocab_size": 4096, "every_s": 0.25, "phase_s": 2.0, "rounds": 2}


def _get(url: str, *, bearer: str | None = None) -> int:
    headers = {"Authorization": f"Bearer {bearer}"} if bearer else {}
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=30) as resp:
        resp.read()
        return int(resp.status)


def one_run(folder: Path, *, size: str, vocab_size: int, every_s: float, phase_s: float, rounds: int) -> dict:
    """The run (module docstring): the page's CPU per kind of work, the phases, the merges, the syncer's summary."""
    config = {"method": "decoupled", "replicas": LEARNERS, "size": size, "global_batch": 4 * LEARNERS, "steps": 10**6}
    cfg = TrainConfig.from_dict(config)
    folder.mkdir(parents=True)
    page = StatusPage.open(host="127.0.0.1", port=0, eval_every_s=0)
    page.start(out=folder, name="status_page_merge", cfg=cfg, inputs=None, echo=lambda line: None)
    token, port = status_token(folder), page.port
    base = f"http://127.0.0.1:{port}"
    syncer_dir = shard_dirs(folder / "syncer", 1)[0]
    stop_file, summary_file = folder / "stop", folder / "syncer-summary.json"
    spec = {"folder": str(syncer_dir), "config": config, "vocab_size": vocab_size, "every_s": every_s,
            "stop": str(stop_file), "summary": str(summary_file), "max_s": 2 * rounds * phase_s + 600}  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # what Ray sets for an actor that asks for no CPU
    with open(folder / "syncer.log", "wb") as log:
        child = subprocess.Popen(
            [sys.executable, "-m", "diloco.bench.page_merge", json.dumps(spec)], stdout=log, stderr=log, env=env
        )
    stop = threading.Event()

    def monitor() -> None:  # the service's monitor: a status call every --poll, a loss point every --status-eval
        k, next_loss = 0, time.monotonic() + LOSS_EVERY_S
        while not stop.wait(POLL_S if k else 0.0):
            page.on_status({"live": list(range(LEARNERS)), "finished": [], "merges": None})
            if time.monotonic() >= next_loss:
                assert page.board is not None
                page.board.loss(t=time.time(), loss=4.0 * (1 + k) ** -0.1)  # (synthetic: the evaluation left out)
                next_loss += LOSS_EVERY_S
            k += 1

    threading.Thread(target=monitor, daemon=True).start()
    try:
        deadline = time.monotonic() + 600
        while page.snapshot()["merges"]["total"] < 2:  # the rounds begin once the syncer merges (its first: warm)
            if child.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the syncer ended or never merged: {(folder / 'syncer.log').read_text()[-2000:]}")
            time.sleep(0.5)
        assert _get(f"{base}/?token={token}") == 200 and _get(f"{base}/metrics", bearer=token) == 200  # the opening
        first, phases, viewed_s, next_scrape, asked = page.monitor_row(), [], 0.0, 0.0, {"/": 0, "/metrics": 0}
        for r in range(rounds):
            for viewed in (True, False) if r % 2 == 0 else (False, True):
                began, cpu0, main0 = time.time(), time.process_time(), time.thread_time()
                syncer0, load0 = process_cpu_s(child.pid), os.getloadavg()[0]
                while time.time() - began < phase_s:
                    if viewed:
                        asked["/"] += _get(f"{base}/?token={token}") == 200
                        if viewed_s + time.time() - began >= next_scrape:
                            asked["/metrics"] += _get(f"{base}/metrics", bearer=token) == 200
                            next_scrape += SCRAPE_S
                    time.sleep(max(0.0, min(REFRESH_S, phase_s - (time.time() - began))))
                end, syncer1 = time.time(), process_cpu_s(child.pid)
                viewed_s += (end - began) if viewed else 0.0
                phases.append({
                    "round": r, "viewed": viewed, "start": began, "end": end,
                    "page_side_cpu_s": (time.process_time() - cpu0) - (time.thread_time() - main0),
                    "syncer_cpu_s": None if syncer0 is None or syncer1 is None else syncer1 - syncer0,
                    "load_1min": (load0 + os.getloadavg()[0]) / 2,
                })  # fmt: skip
        end_row = page.monitor_row()
    finally:
        stop.set()
        stop_file.touch()
        try:
            child.wait(timeout=120)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
        page.close()
    if child.returncode != 0:
        raise RuntimeError(f"the syncer failed: {(folder / 'syncer.log').read_text()[-2000:]}")
    summary = json.loads(summary_file.read_text())
    merges = [
        {"at": m["at"], "sync_time": m["sync_time"], "learners": len(m["learners"])}
        for m in read_learner_log(syncer_dir / "records.jsonl")
    ]

    def since(kind: str, what: str = "cpu_s") -> Any:
        return end_row[what].get(kind, 0) - first[what].get(kind, 0)

    server = (end_row.get("server_thread_cpu_s") or 0.0) - (first.get("server_thread_cpu_s") or 0.0)
    per_work = [
        {"work": "viewed: page (/), plots included", "calls": since("/", "calls"), "cpu_s": since("/")},
        {"work": "  of which: drawing a plot again", "calls": since("plots", "calls"), "cpu_s": since("plots")},
        {"work": "viewed: metrics (/metrics)", "calls": since("/metrics", "calls"), "cpu_s": since("/metrics")},
        {"work": "viewed: server thread (aiohttp)", "calls": asked["/"] + asked["/metrics"], "cpu_s": server},
        {"work": "upkeep: reads of the syncer's files", "calls": since("read", "calls"), "cpu_s": since("read")},
    ]
    for row in per_work:
        row["ms_each"] = 1e3 * row["cpu_s"] / row["calls"] if row["calls"] else None
    return {
        "syncer": summary,
        "asked": asked,
        "page_cpu_s": since("/") + since("/metrics") + server,
        "opening": {"page_cpu_s": first["cpu_s"].get("/", 0.0), "first_plots_cpu_s": first["cpu_s"].get("plots (first)", 0.0)},
        "per_work": per_work,
        "phases": phases,
        "merges": merges,
    }  # fmt: skip


def _verdicts(f: dict[str, Any]) -> list[str]:
    """(1) and (2), for the merges' wall time (``sync_time``) and for their CPU time."""
    lines = []
    for p, what in (("", "merge time (sync_time, wall)"), ("cpu_", "merges' CPU time")):
        if f.get(f"{p}merge_ms_per_s") is None:
            continue
        holds = "holds" if f[f"{p}cost_under_1pct"] else "does not hold"
        lines.append(
            f"(1) the page viewed costs {f[f'page_of_{p}merge_time']:.2%} of the syncer's {what}: 'under 1 %' "
            f"{holds} at a merge every {f['merge_interval_s']:.2f} s (1 % at a merge every "
            f"{f[f'{p}interval_for_1pct_s']:.2f} s)"
        )
        q, median = f[f"{p}ratio_quartiles"], f[f"{p}median_round_ratio"]
        resolved = ": resolved to 1 %" if f[f"{p}effect_resolved_to_1pct"] else ": the spread does not resolve 1 %"
        lines.append(
            f"(2) {what}, viewed / not viewed: median of {len(f[f'{p}rounds'])} rounds' ratios {median:.3f}"
            + (f" (quartiles {q[0]:.3f} .. {q[2]:.3f})" if q else "")
            + resolved
            if median is not None
            else f"(2) {what}: no round with 3 merges in each phase"
        )
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_quick(ap, f"a {QUICK['size']} model, {QUICK['rounds']} rounds of 2 x {QUICK['phase_s']:g} s")
    add_out(ap, "status_page_merge")
    ap.add_argument("--every", type=float, default=None, help=f"seconds between merges (default {FULL['every_s']})")
    ap.add_argument("--phase", type=float, default=None, help=f"seconds a phase (default {FULL['phase_s']})")
    ap.add_argument("--rounds", type=int, default=None, help=f"rounds (default {FULL['rounds']})")
    args = ap.parse_args()
    settings = dict(QUICK if args.quick else FULL)
    for key, given in (("every_s", args.every), ("phase_s", args.phase), ("rounds", args.rounds)):
        if given is not None:
            settings[key] = given
    if not (settings["every_s"] > 0 and settings["phase_s"] >= REFRESH_S and settings["rounds"] >= 1):
        raise ValueError(f"--every > 0, --phase >= {REFRESH_S} and --rounds >= 1, got {settings}")
    if args.quick and args.out == RESULTS_DIR / "status_page_merge.json":
        args.out = RESULTS_DIR / "status_page_merge_quick.json"  # (a smoke run never replaces the figures)
    with tempfile.TemporaryDirectory() as tmp:
        r = one_run(Path(tmp) / "run", **settings)
    s, loads = r["syncer"], [p["load_1min"] for p in r["phases"]]
    merge_cpu = s.pop("timed")
    f = figures(phases=r["phases"], merges=r["merges"], page_cpu_s=r["page_cpu_s"], merge_cpu=merge_cpu)
    load = sum(loads) / len(loads)
    print_table(
        r["per_work"],
        [("work", "work", ""), ("calls", "calls", "d"), ("CPU s", "cpu_s", ".3f"), ("CPU ms each", "ms_each", ".2f")],
        title=(
            f"the status page's CPU, viewed {f['viewed_s']:.0f} s of {f['wall_s']:.0f} s (page every {REFRESH_S} s, "
            f"metrics every {SCRAPE_S:g} s viewed); load (1 min) {load:.1f} on {os.cpu_count()} cores"
        ),
    )
    side, sync = f["page_side_cpu_ms_per_s"], f["syncer_cpu_ms_per_s"]
    one = [
        ("model", f"{settings['size']}, vocab {settings['vocab_size']}: {s['values'] / 1e6:.1f} M values, "
                  f"{s['fragments']} fragment, {s['codec']}, {s['learners']} learners a merge, {s['threads']} thread"),
        ("merge rate", f"{f['merges_per_s']:.3f} merges/s (one every {f['merge_interval_s']:.2f} s; set "
                       f"{settings['every_s']:g} s; {s['late']} began late)"),
        ("a merge, wall (sync_time): median / mean", f"{f['merge_ms_median']:.1f} / {f['merge_ms_mean']:.1f} ms"),
        ("a merge, CPU: median / mean", f"{f['cpu_merge_ms_median']:.1f} / {f['cpu_merge_ms_mean']:.1f} ms"),
        ("the syncer's merge time per second: wall, CPU", f"{f['merge_ms_per_s']:.1f}, {f['cpu_merge_ms_per_s']:.1f} ms"),
        ("page viewed, CPU per second", f"{f['page_cpu_ms_per_viewed_s']:.2f} ms"),
        ("page / merge time: wall, CPU", f"{f['page_of_merge_time']:.2%}, {f['page_of_cpu_merge_time']:.2%}"),
        ("merge interval at which the page is 1 %: wall, CPU",
         f"{f['interval_for_1pct_s']:.2f}, {f['cpu_interval_for_1pct_s']:.2f} s"),
        ("serving process CPU/s viewed, not viewed", f"{side['viewed']:.2f}, {side['not_viewed']:.2f} ms "
                                                     f"(the browser's thread left out)"),
        ("syncer process CPU/s viewed, not viewed", f"{sync['viewed']:.1f}, {sync['not_viewed']:.1f} ms"),
        ("the syncer's state written once (not in merges)", f"{s['state_write_s']:.2f} s, "
                                                            f"{(s['state_bytes'] or 0) / 1e6:.0f} MB"),
    ]  # fmt: skip
    print_table([{"figure": k, "value": v} for k, v in one], [("(1) figure", "figure", ""), ("value", "value", "")])
    cpu_ratio = {x["round"]: x for x in f.get("cpu_rounds", [])}
    rows = [{**x, "cpu_viewed_ms": cpu_ratio.get(x["round"], {}).get("viewed_ms"),
             "cpu_idle_ms": cpu_ratio.get(x["round"], {}).get("idle_ms"),
             "cpu_ratio": cpu_ratio.get(x["round"], {}).get("ratio")} for x in f["rounds"]]  # fmt: skip
    print_table(
        rows,
        [("round", "round", "d"), ("merges", "merges", "d"), ("viewed ms", "viewed_ms", ".1f"),
         ("not viewed ms", "idle_ms", ".1f"), ("ratio", "ratio", ".3f"), ("CPU viewed ms", "cpu_viewed_ms", ".1f"),
         ("CPU not viewed ms", "cpu_idle_ms", ".1f"), ("CPU ratio", "cpu_ratio", ".3f")],
        title="(2) the syncer's merge time (median of each phase's merges; wall, then CPU), page viewed / not viewed",
    )  # fmt: skip
    for line in _verdicts(f):
        print(line)
    payload = {
        "machine": machine(),
        "load_1min": load,
        "settings": {
            **settings,
            "learners": LEARNERS,
            "refresh_s": REFRESH_S,
            "scrape_s": SCRAPE_S,
            "poll_s": POLL_S,
            "loss_every_s": LOSS_EVERY_S,
            "quick": args.quick,
        },
        "syncer": s,
        "asked": r["asked"],
        "opening": r["opening"],
        "per_work": r["per_work"],
        "page_cpu_s": r["page_cpu_s"],
        "phases": r["phases"],
        "figures": f,
        "verdicts": _verdicts(f),
        "merges": r["merges"],
        "merge_cpu": merge_cpu,
    }
    write_result("status_page_merge", payload, out=args.out)


if __name__ == "__main__":
    main()
