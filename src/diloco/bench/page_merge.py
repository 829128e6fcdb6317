"""The syncer side of ``benchmarks/status_page_merge.py`` (the status page against the merge time at a realistic
size), and the figures it draws from a run.

:func:`run_syncer`, in a process of its own (``python -m diloco.bench.page_merge SPEC``, SPEC a JSON object), is the
syncer as the service runs it, less Ray: the syncer built by the service's own function
(:func:`diloco.decoupled.service.build_syncer`, from a config and the data's vocabulary), inside the syncer actor's
own class (:class:`~diloco.decoupled.ray_transport.SyncerActor`, the class Ray runs, called here on this process's
event loop), writing its events (``events.jsonl``: joins, reports, merges) and its merge records (``records.jsonl``)
to its folder, where the status page reads them. What is not the service's: the learners are synthetic (M reports
every ``every_s`` seconds, each a random outer gradient, N(0, 1e-3), encoded with the run's codec; every learner's
report of a round merges at once, as with K = M), and the actor's state is not written after each merge (its merge
records are; the state's write is timed once, after the first merge, and left out of the merge time as the service's
``sync_time`` leaves it out). The process runs its torch on one thread, as Ray gives an actor that asks for no CPU
(``OMP_NUM_THREADS=1``), unless ``threads`` says otherwise.

:func:`phase_rounds` and :func:`figures` turn the run's phases (viewed or not) and merges into the benchmark's
figures (pure functions).
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

#: The spec's keys and their defaults (``folder``, ``config`` and ``vocab_size`` have none).
SPEC_DEFAULTS: dict[str, Any] = {
    "every_s": 1.5,  # a round of reports (a merge) every this many seconds
    "threads": 1,  # torch threads: what Ray gives an actor with no num_cpus
    "max_s": 3600.0,  # the process stops after this long whatever happens
    "stop": None,  # a path: the loop stops once it exists
    "summary": None,  # a path: the summary (strict JSON) written there at the end
    "max_merges": None,  # stop after this many merges (a test)
}


def actor_class() -> type:
    """The syncer actor's class as Ray runs it, whose state is not written after each merge (its merge records are
    appended as the actor appends them)."""
    from diloco.decoupled.checkpoint import append_records
    from diloco.decoupled.ray_transport import SyncerActor

    class RecordsOnly(SyncerActor):
        def _save(self) -> None:
            append_records(self.checkpoint_dir, [r.as_row() for r in self.syncer.records[self._records_written :]])
            self._records_written = len(self.syncer.records)

        def save_state_now(self) -> float:
            """Write the state as the service's actor does after each merge; its seconds."""
            began = time.perf_counter()
            SyncerActor._save(self)
            return time.perf_counter() - began

    return RecordsOnly


async def drive(
    actor: Any,
    *,
    every_s: float,
    steps: int,
    should_stop: Callable[[], bool],
    max_merges: int | None = None,
    before: int = 0,
) -> dict[str, Any]:
    """The synthetic learners (joined already): every ``every_s`` seconds each of the syncer's learners reports
    fragment 0 (``steps`` steps of ``every_s / steps`` seconds since its last report; ``before``: the rounds it
    reported already) and takes its reply. Returns the merges and how many rounds began late (the previous merge
    overran ``every_s``), and each merge's time: the call that takes a round's last report and merges, on this
    thread's CPU clock (``cpu_s``: a loaded machine delays it but hardly inflates it) and on the wall clock, with the
    wall time it ended (``at``)."""
    import torch

    from diloco.decoupled.messages import Report

    syncer = actor.syncer
    learners = syncer.num_learners
    gen = torch.Generator().manual_seed(1)
    numel = syncer.fragment_sizes()[0]
    # two distinct payloads, taken in turn: a merge's cost does not depend on the values (benchmarks/syncer_merge.py)
    payloads = [syncer.codec.encode(torch.randn(numel, generator=gen).mul_(1e-3)) for _ in range(min(2, learners))]
    began, merges, late, timed = time.monotonic(), 0, 0, []
    while not should_stop() and (max_merges is None or merges < max_merges):
        wait = began + merges * every_s - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)
        elif merges:
            late += 1
        version, sent = syncer.versions[0], time.time()
        for m in range(learners):
            report = Report(
                learner=m,
                fragment=0,
                payload=payloads[m % len(payloads)],
                steps=steps,
                tokens=1024.0 * steps,
                step_time=every_s / steps,
                sent_after_step=steps * (before + merges + 1),
                base_version=version,
            )
            if m == learners - 1:  # (its report merges the round)
                cpu, wall = time.thread_time(), time.perf_counter()
            await actor.report(report)
        timed.append({"at": time.time(), "cpu_s": time.thread_time() - cpu, "wall_s": time.perf_counter() - wall})
        for m in range(learners):
            reply = await actor.wait_reply(m, 0, sent, version)
            assert reply is not None and reply.version == version + 1, "the round did not merge"
        merges += 1
    return {"merges": merges, "late": late, "timed": timed}


def run_syncer(spec: dict[str, Any]) -> dict[str, Any]:
    """The syncer's process (module docstring): build, join, merge once, write the state (timed), merge until told to stop;
    the summary (also written to ``spec["summary"]``). Torch's grad mode and thread count are as they were after it
    (a test calls it in its own process)."""
    import torch

    threads = torch.get_num_threads()
    try:
        with torch.no_grad():
            return _run_syncer(spec)
    finally:
        torch.set_num_threads(threads)


def _run_syncer(spec: dict[str, Any]) -> dict[str, Any]:
    import torch

    from diloco.decoupled.service import build_syncer
    from diloco.files import write_json
    from diloco.train.config import TrainConfig

    spec = {**SPEC_DEFAULTS, **spec}
    if spec["threads"]:
        torch.set_num_threads(int(spec["threads"]))
    t0 = time.perf_counter()
    syncer = build_syncer(spec["config"], int(spec["vocab_size"]))
    built_s = time.perf_counter() - t0
    actor = actor_class()(syncer, str(spec["folder"]))
    deadline = time.monotonic() + float(spec["max_s"])
    stop = Path(spec["stop"]) if spec["stop"] else None

    def should_stop() -> bool:
        return time.monotonic() > deadline or (stop is not None and stop.exists())

    async def main() -> tuple[float, dict[str, Any]]:
        for m in range(syncer.num_learners):
            await actor.join(m)
        rounds = {"every_s": float(spec["every_s"]), "steps": TrainConfig.from_dict(spec["config"]).sync_every}
        first = await drive(actor, **rounds, should_stop=lambda: False, max_merges=1)
        state_s = actor.save_state_now()  # what the service writes after each merge (its outer momentum in it), once
        left = None if spec["max_merges"] is None else spec["max_merges"] - 1
        rest = await drive(actor, **rounds, should_stop=should_stop, max_merges=left, before=1)
        return state_s, {"merges": first["merges"] + rest["merges"], "late": rest["late"], "timed": rest["timed"]}

    state_s, got = asyncio.run(main())
    from diloco.decoupled.checkpoint import saved_states

    states = saved_states(spec["folder"])
    summary = {
        "pid": os.getpid(),
        "threads": torch.get_num_threads(),
        "values": sum(syncer.fragment_sizes()),
        "fragments": len(syncer.fragment_sizes()),
        "learners": syncer.num_learners,
        "codec": syncer.codec.name,
        "built_s": built_s,
        "state_write_s": state_s,
        "state_bytes": states[-1].stat().st_size if states else None,
        **got,
    }
    if spec["summary"]:
        write_json(Path(spec["summary"]), summary)
    return summary


# -- the figures -----------------------------------------------------------------------------------------------------


def phase_rounds(
    phases: Sequence[dict[str, Any]], merges: Sequence[dict[str, Any]], *, least: int = 3, key: str = "sync_time"
) -> list[dict[str, Any]]:
    """Per round: the median merge time (``key``: ``sync_time``, or ``cpu_s``) of the merges made (``at``) in its
    viewed phase and in its phase not viewed, and their ratio; a round whose phases hold fewer than ``least`` merges
    each is left out."""
    out = []
    for k in sorted({p["round"] for p in phases}):
        med: dict[str, tuple[float, int] | None] = {}
        for p in (p for p in phases if p["round"] == k):
            times = [m[key] for m in merges if p["start"] <= m["at"] < p["end"]]
            med["viewed" if p["viewed"] else "idle"] = (
                (statistics.median(times), len(times)) if len(times) >= least else None
            )
        viewed, idle = med.get("viewed"), med.get("idle")
        if viewed and idle:
            out.append(
                {
                    "round": k,
                    "viewed_ms": 1e3 * viewed[0],
                    "idle_ms": 1e3 * idle[0],
                    "merges": viewed[1] + idle[1],
                    "ratio": viewed[0] / idle[0],
                }
            )
    return out


def figures(
    *,
    phases: Sequence[dict[str, Any]],
    merges: Sequence[dict[str, Any]],
    page_cpu_s: float,
    merge_cpu: Sequence[dict[str, Any]] = (),
) -> dict[str, Any]:
    """The benchmark's figures. ``phases``: each with ``round``, ``viewed``, ``start``, ``end`` (wall times) and the
    CPU seconds spent in it by the syncer's process (``syncer_cpu_s``) and by the page's side (``page_side_cpu_s``:
    the serving process less the thread that played the browser); ``merges``: the merge records (``at``,
    ``sync_time``); ``page_cpu_s``: the page's CPU over the viewed phases as the page counts it (its routes, the plots
    in them, the server's thread); ``merge_cpu``: each merge's CPU time (``at``, ``cpu_s``: :func:`drive`'s).

    (1) the page's CPU per second viewed against the syncer's merge time per second (the merges in the phases), and
    the merge interval above which the page would be 1 % of it or more at this mean merge time; the same against the
    merges' CPU time; (2) the merge times viewed / not viewed per round (:func:`phase_rounds`), the median of the
    ratios and their quartiles, for the wall time (``sync_time``) and for the CPU time.
    """
    start, end = min(p["start"] for p in phases), max(p["end"] for p in phases)
    wall = end - start
    viewed_s = sum(p["end"] - p["start"] for p in phases if p["viewed"])
    page_per_s = page_cpu_s / viewed_s if viewed_s else None

    def per_s(key: str, viewed: bool) -> float | None:
        rows = [p for p in phases if p["viewed"] == viewed and p.get(key) is not None]
        took = sum(p["end"] - p["start"] for p in rows)
        return sum(p[key] for p in rows) / took if took else None

    side = {v: per_s("page_side_cpu_s", v) for v in (True, False)}
    syncer_cpu = {v: per_s("syncer_cpu_s", v) for v in (True, False)}
    inside = [m for m in merges if start <= m["at"] < end]
    out: dict[str, Any] = {
        "wall_s": wall,
        "viewed_s": viewed_s,
        "idle_s": wall - viewed_s,
        "merges": len(inside),
        "merges_per_s": len(inside) / wall,
        "merge_interval_s": wall / len(inside) if inside else None,
        "page_cpu_ms_per_viewed_s": _ms(page_per_s),
        "page_side_cpu_ms_per_s": {"viewed": _ms(side[True]), "not_viewed": _ms(side[False])},
        "page_side_cpu_ms_per_viewed_s_excess": _ms(side[True] - side[False]) if None not in side.values() else None,
        "syncer_cpu_ms_per_s": {"viewed": _ms(syncer_cpu[True]), "not_viewed": _ms(syncer_cpu[False])},
        "page_of_syncer_cpu": page_per_s / syncer_cpu[False] if page_per_s and syncer_cpu[False] else None,
    }
    out.update(_against(phases, inside, "sync_time", page_per_s, wall, ""))
    cpu_inside = [m for m in merge_cpu if start <= m["at"] < end]
    if cpu_inside:
        out.update(_against(phases, cpu_inside, "cpu_s", page_per_s, wall, "cpu_"))
    return out


def _against(
    phases: Sequence[dict[str, Any]],
    merges: Sequence[dict[str, Any]],
    key: str,
    page: float | None,
    wall: float,
    p: str,
) -> dict[str, Any]:
    """The page against the merges' ``key`` time (figure 1) and that time viewed / not viewed (figure 2), each name
    prefixed with ``p``."""
    from diloco.bench import round_ratios

    times = [m[key] for m in merges]
    mean = statistics.mean(times) if times else None
    per_s = sum(times) / wall
    share = page / per_s if page is not None and per_s > 0 else None
    rr = phase_rounds(phases, merges, key=key)
    ratios, median = round_ratios([x["viewed_ms"] for x in rr], [x["idle_ms"] for x in rr]) if rr else ([], None)
    quartiles = statistics.quantiles(ratios, n=4) if len(ratios) >= 2 else None
    return {
        f"{p}merge_ms_median": _ms(statistics.median(times)) if times else None,
        f"{p}merge_ms_mean": _ms(mean),
        f"{p}merge_ms_per_s": _ms(per_s),
        f"page_of_{p}merge_time": share,
        # the merge interval at which the page (viewed all the time) is 1 % of the merges' time, at their mean
        f"{p}interval_for_1pct_s": 0.01 * mean / page if mean and page else None,
        f"{p}rounds": rr,
        f"{p}round_ratios": ratios,
        f"{p}median_round_ratio": median,
        f"{p}ratio_quartiles": quartiles,
        f"{p}cost_under_1pct": share is not None and share < 0.01,
        f"{p}effect_under_1pct": median is not None and median < 1.01,
        # the spread of the rounds' ratios can tell 1 % apart: the quartiles within 1 % of the median
        f"{p}effect_resolved_to_1pct": quartiles is not None and quartiles[2] - quartiles[0] <= 0.02,
    }


def _ms(x: float | None) -> float | None:
    return None if x is None else 1e3 * x


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m diloco.bench.page_merge SPEC (a JSON object: folder, config, vocab_size, ...)")
        return 2
    print(json.dumps(run_syncer(json.loads(args[0]))), flush=True)
    return 0


__all__ = ["SPEC_DEFAULTS", "actor_class", "drive", "figures", "phase_rounds", "run_syncer"]

if __name__ == "__main__":
    raise SystemExit(main())
