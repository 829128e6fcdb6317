"""torchft 0.2.0's fault tolerance under a SIGKILL and a restart: the peer implementation's healing.

    PYTHONPATH=src .venv/bin/python benchmarks/torchft_healing.py              # one repeat, ~40 s
    PYTHONPATH=src .venv/bin/python benchmarks/torchft_healing.py --repeats 2
    PYTHONPATH=src .venv/bin/python benchmarks/torchft_healing.py --quick      # shorter schedule, ~30 s

The same fault schedule as our Decoupled DiLoCo benchmark, run on ``torchft.local_sgd.DiLoCo``:

* a lighthouse (``torchft._torchft.LighthouseServer``, in the driver process) with ``min_replicas=1``
  and ``heartbeat_timeout_ms=2000`` (a replica whose heartbeats stop for 2 s is dead to it);
* 2 replica groups, each ONE process (this script re-run with ``--replica``), each training the
  project's tiny transformer (vocab 4096, batch 4 x 32 random tokens) with AdamW (lr 3e-3) inside
  torchft's ``DiLoCo`` (H = 8, one fragment; outer SGD lr 0.7, momentum 0.9, Nesterov), a real
  ``Manager(min_replica_size=1, use_async_quorum=False, init_sync=True)`` and ``ProcessGroupGloo``;
  the inner step's compute (forward, backward, AdamW) is padded with a sleep to 0.2 s, emulating an
  accelerator (2 CPU cores are then not the bottleneck); DiLoCo's sync (quorum, all-reduce, outer
  step) comes on top, as on an accelerator, where torchft's blocking sync does not overlap compute;
* schedule: t0 = when both replicas have completed an outer sync with 2 participants; at t0 + 6 s
  replica 1's process is SIGKILLed; 3 s later it is restarted (same replica id, a new process that
  starts from scratch: imports, builds the model, trains, and heals from its live peer at its first
  quorum, as torchft does); everything stops at t0 + 20 s (later if the restarted process has not
  contributed yet, at most t0 + 35 s) and is torn down even on error.

Each process appends one JSON row per inner step to its own log (replica, incarnation, step, t, dt,
and sync_s: the time spent in DiLoCo's sync after the padded compute) and event rows: ``start``
(after imports), ``ready`` (manager up), ``quorum`` (each quorum: its wait, participants, quorum
id, whether it changed), ``healed`` (the manager applied a state dict received from the peer: seen in the manager's call to
our ``load_state_dict``, which torchft makes only when healing) and ``sync`` (each outer sync's
``should_commit`` result and participant count).

Measured, per repeat:

* survivor (replica 0): its typical step (median inner step before the kill) and its stall at its
  next sync after the kill (the step holding its first quorum after the kill: that step's duration
  minus the typical step, and as a ratio). The stall is the lighthouse's heartbeat timeout: the
  survivor's quorum waits until the dead replica's heartbeats are 2 s old, so it is about 2 s minus
  the time from the kill to the survivor's next quorum request: between ~0.35 s and 2 s with H = 8
  steps of 0.2 s, depending on where in the round the kill lands. The schedule fixes that phase
  (t0 is a sync; the kill comes 6 s later), so repeats agree. Also its stall when the restarted
  replica rejoins (sending it a checkpoint, reconfiguring the process group);
* steps it kept in the 10 s after the kill, against its steady rate before the kill, in %: 10 s
  over its steady step (the median time between its quorums of 2 before the kill, divided by the
  H / fragments steps between quorums: robust to one round slowed by other load on the cores). A
  kill that lands inside a sync costs a failed sync (``should_commit`` False: the round's inner
  steps are discarded) rather than a stall; the table shows whether that sync committed;
* restarted replica: seconds from its restart (the driver's spawn) to its ``start`` (imports), to
  ``healed`` (state received from the peer and applied), to its first quorum of 2, and to its first
  committed outer sync with 2 participants (it contributes again). torchft asks for a quorum only at
  a sync, so the restarted replica first trains H inner steps from its fresh model, then waits in
  the quorum for the survivor's next sync, heals (its own H steps are discarded) and joins it.

Prints a table per repeat and writes strict JSON to benchmarks/results/torchft_healing.json
(settings, torch/torchft versions, each repeat, the median over repeats).

Importable: ``sys.path.insert(0, "benchmarks"); from torchft_healing import measure`` runs one
repeat and returns its dict (``measure(quick=True)``, or any setting of :class:`Settings`). The lighthouse,
the replica processes and the instrumented manager are ``torchft_cluster.py``'s (shared with
``chaos_torchft.py``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torchft_cluster import ROOT, Cluster, instrumented_manager, versions

from diloco.bench import write_result

RESULTS = ROOT / "benchmarks" / "results"


@dataclass(frozen=True)
class Settings:
    steady_s: float = 6.0  # from t0 (both replicas in a committed quorum of 2) to the kill
    restart_after_s: float = 3.0  # from the kill to the restart
    window_s: float = 10.0  # steps kept are counted in this window after the kill
    duration_s: float = 20.0  # from t0 to the stop (later if the restarted replica has not contributed)
    step_time_s: float = 0.2  # inner step's compute, padded with a sleep
    sync_every: int = 8  # H
    fragments: int = 1  # 2: (embedding, final norm, head) and the blocks, synced alternately
    fragment_sync_delay: int = 0
    heartbeat_timeout_s: float = 2.0  # lighthouse: dead after this long without a heartbeat
    heartbeat_interval_s: float = 0.1  # manager -> lighthouse (torchft's default)
    join_timeout_s: float = 60.0  # lighthouse: wait for heartbeating stragglers (torchft's default)
    quorum_tick_s: float = 0.1  # lighthouse (torchft's default)
    min_replicas: int = 1
    timeout_s: float = 10.0  # manager (should_commit, checkpoint transfer) and gloo collectives
    quorum_timeout_s: float = 60.0
    model_size: str = "tiny"
    vocab_size: int = 4096
    seq_len: int = 32
    batch_size: int = 4
    inner_lr: float = 3e-3
    outer_lr: float = 0.7
    outer_momentum: float = 0.9
    seed: int = 0
    startup_timeout_s: float = 90.0  # for t0

    @classmethod
    def quick(cls, **overrides: Any) -> Settings:
        return cls(**{"steady_s": 4.0, "restart_after_s": 3.0, "window_s": 8.0, "duration_s": 14.0, **overrides})


# ------------------------------------------------------------------------------------------ replica


def _replica_main(replica: int, incarnation: int, lighthouse: str, run_dir: Path, s: Settings) -> None:
    """One replica group of one process: torchft DiLoCo until ``run_dir/stop`` exists."""
    import torch
    from torchft.local_sgd import DiLoCo

    from diloco.models.factory import build_model

    torch.set_num_threads(1)
    log = open(run_dir / f"replica{replica}.inc{incarnation}.jsonl", "a", buffering=1)

    def write(row: dict) -> None:
        log.write(json.dumps({"replica": replica, "incarnation": incarnation, **row}) + "\n")

    def event(name: str, **fields: Any) -> None:
        write({"event": name, "t": time.time(), **fields})

    event("start", pid=os.getpid())
    model = build_model("", size=s.model_size, vocab_size=s.vocab_size, seq_len=s.seq_len, seed=s.seed)
    inner = torch.optim.AdamW(model.parameters(), lr=s.inner_lr)
    if s.fragments == 1:
        frags = [model]
    elif s.fragments == 2:
        frags = [torch.nn.ModuleList([model.embed, model.norm, model.head]), model.blocks]
    else:
        raise ValueError(f"fragments must be 1 or 2, got {s.fragments}")
    outers = [torch.optim.SGD(f.parameters(), lr=s.outer_lr, momentum=s.outer_momentum, nesterov=True) for f in frags]

    def load_state_dict(sd: dict) -> None:  # torchft calls it only to apply a peer's state (healing)
        model.load_state_dict(sd["model"])
        inner.load_state_dict(sd["inner"])

    manager = instrumented_manager(
        replica=replica,
        lighthouse=lighthouse,
        s=s,
        load_state_dict=load_state_dict,
        state_dict=lambda: {"model": model.state_dict(), "inner": inner.state_dict()},
        event=event,
    )
    event("ready")

    gen = torch.Generator().manual_seed(1000 * s.seed + 10 * replica + incarnation)
    stop = run_dir / "stop"
    clock: dict[str, float] = {}

    def pad(*_: Any) -> None:  # runs before DiLoCo's hook: the compute is padded, the sync comes on top
        left = s.step_time_s - (time.time() - clock["begin"])
        if left > 0:
            time.sleep(left)
        clock["padded"] = time.time()

    pad_hook = inner.register_step_post_hook(pad)
    step = 0
    try:
        with DiLoCo(
            manager,
            frags,
            inner,
            outers,
            sync_every=s.sync_every,
            backup_device=torch.device("cpu"),
            pin_memory=False,
            fragment_sync_delay=s.fragment_sync_delay,
        ):
            while not stop.exists():
                clock["begin"] = time.time()
                tokens = torch.randint(0, s.vocab_size, (s.batch_size, s.seq_len + 1), generator=gen)
                _, loss = model(tokens[:, :-1], tokens[:, 1:])
                loss.backward()
                loss = loss.detach()
                inner.step()
                inner.zero_grad()
                step += 1
                end = time.time()
                write(
                    {
                        "step": step,
                        "t": end,
                        "dt": end - clock["begin"],
                        "sync_s": end - clock["padded"],
                        "outer_step": manager.current_step(),
                        "loss": round(loss.item(), 4),
                    }
                )
        event("stop", steps=step)
    finally:
        pad_hook.remove()
        manager.shutdown(wait=False)
        log.close()


# ------------------------------------------------------------------------------------------- driver


def _contributed(rows: list[dict]) -> float | None:
    """Time of the first committed outer sync with 2 participants."""
    return next((r["t"] for r in rows if r.get("event") == "sync" and r["committed"] and r["participants"] == 2), None)


def _sleep_until(t: float) -> None:
    while (left := t - time.time()) > 0:
        time.sleep(min(left, 0.05))


def _run(s: Settings, run_dir: Path) -> dict:
    """Run the schedule; return the raw timeline (times are time.time())."""
    cluster = Cluster(s, run_dir, script=Path(__file__).resolve())
    try:
        for r in (0, 1):
            cluster.spawn(r, 0)
        deadline = time.time() + s.startup_timeout_s
        while True:
            cluster.check_alive((0, 0), (1, 0))
            joined = [_contributed(cluster.rows(r, 0)) for r in (0, 1)]
            if all(t is not None for t in joined):
                t0 = max(joined)
                break
            if time.time() > deadline:
                raise TimeoutError(f"no outer sync with 2 participants within {s.startup_timeout_s} s")
            time.sleep(0.05)
        _sleep_until(t0 + s.steady_s)
        cluster.check_alive((0, 0), (1, 0))
        t_kill = cluster.kill(1, 0)
        _sleep_until(t_kill + s.restart_after_s)
        t_restart = cluster.spawn(1, 1)
        _sleep_until(t0 + s.duration_s)
        late = t0 + s.duration_s + 15
        while _contributed(cluster.rows(1, 1)) is None and time.time() < late:
            cluster.check_alive((0, 0), (1, 1))
            time.sleep(0.1)
        cluster.check_alive((0, 0), (1, 1))
        t_stop = time.time()
    finally:
        cluster.close()
    return {
        "t0": t0,
        "t_kill": t_kill,
        "t_restart": t_restart,
        "t_stop": t_stop,
        "rows": {f"{r}.{i}": cluster.rows(r, i) for r, i in ((0, 0), (1, 0), (1, 1))},
    }


def _analyse(s: Settings, run: dict) -> dict:
    t0, t_kill, t_restart = run["t0"], run["t_kill"], run["t_restart"]
    surv = run["rows"]["0.0"]
    steps = [r for r in surv if "step" in r]
    events = [r for r in surv if "event" in r]
    before = [r for r in steps if t0 < r["t"] <= t_kill]
    typical = statistics.median(r["dt"] for r in before)
    sync_before = [r["dt"] for r in before if r["sync_s"] > 0.005]
    typical_sync = statistics.median(sync_before) if sync_before else typical
    rate_before = (len(before) - 1) / (before[-1]["t"] - before[0]["t"])  # raw: load on the 2 cores shows
    # the steady step, robust to a slow round: the median time between quorums of 2 before the kill (a
    # quorum every H / fragments steps), per step
    q2 = [r["t"] for r in events if r["event"] == "quorum" and r["participants"] == 2 and r["t"] <= t_kill]
    steady_step = statistics.median(b - a for a, b in zip(q2, q2[1:])) / (s.sync_every // s.fragments)
    after = [r for r in steps if t_kill < r["t"] <= t_kill + s.window_s]
    # the survivor's next sync after the kill: its first quorum that completes after the kill (torchft's
    # DiLoCo asks for a quorum when it prepares a sync: H - fragment_sync_delay steps into a round)
    quorums = [r for r in events if r["event"] == "quorum"]
    next_quorum = next(r for r in quorums if r["t"] > t_kill)
    next_sync = next(r for r in events if r["event"] == "sync" and r["t"] > next_quorum["t"])
    step_at_kill_sync = min((r for r in steps if r["t"] >= next_quorum["t"]), key=lambda r: r["t"])
    rejoin = next((r for r in events if r["event"] == "quorum" and r["t"] > t_restart and r["participants"] == 2), None)
    step_at_rejoin = (
        min((r for r in steps if r["t"] >= rejoin["t"]), key=lambda r: r["t"], default=None) if rejoin else None
    )

    new = run["rows"]["1.1"]
    ev = lambda name, pred=lambda r: True: next((r for r in new if r.get("event") == name and pred(r)), None)
    start, healed = ev("start"), ev("healed")
    quorum2 = ev("quorum", lambda r: r["participants"] == 2)
    contributed = _contributed(new)
    first_step = next((r for r in new if "step" in r), None)
    since = lambda r: None if r is None else round(r["t"] - t_restart, 3)
    return {
        "survivor": {
            "typical_step_s": round(typical, 4),
            "typical_sync_step_s": round(typical_sync, 4),
            "next_sync_after_kill_at_s": round(next_sync["t"] - t_kill, 3),
            "quorum_request_after_kill_s": round(next_quorum["t"] - next_quorum["wait_s"] - t_kill, 3),
            "quorum_wait_s": round(next_quorum["wait_s"], 3),
            "quorum_participants": next_quorum["participants"],
            "next_sync_committed": next_sync["committed"],
            "next_sync_participants": next_sync["participants"],
            "stall_s": round(step_at_kill_sync["dt"] - typical, 3),
            "stall_ratio": round(step_at_kill_sync["dt"] / typical, 2),
            "max_step_after_kill_s": round(max(r["dt"] for r in after), 3),
            "rejoin_stall_s": None if step_at_rejoin is None else round(step_at_rejoin["dt"] - typical, 3),
            "steps_before_per_s": round(rate_before, 3),
            "steps_in_window_after_kill": len(after),
            "steady_step_s": round(steady_step, 4),
            "kept_pct": round(100 * len(after) * steady_step / s.window_s, 1),
        },
        "restarted": {
            "start_s": since(start),  # spawn -> after imports
            "first_step_s": since(first_step),
            "first_quorum_wait_s": None if healed is None else round(healed["wait_s"], 3),
            "healed_s": since(healed),
            "healed_after_start_s": None if healed is None or start is None else round(healed["t"] - start["t"], 3),
            "healed_to_outer_step": None if healed is None else healed["outer_step"],
            "quorum_of_2_s": since(quorum2),
            "contributes_s": None if contributed is None else round(contributed - t_restart, 3),
        },
        "timeline_s": {
            "kill": round(t_kill - t0, 3),
            "restart": round(t_restart - t0, 3),
            "stop": round(run["t_stop"] - t0, 3),
        },
    }


def measure(settings: Settings | None = None, *, quick: bool = False, keep_logs: Path | None = None) -> dict:
    """One repeat of the schedule; returns the measurements (see the module docstring)."""
    s = settings or (Settings.quick() if quick else Settings())
    run_dir = Path(tempfile.mkdtemp(prefix="torchft_healing."))
    try:
        result = _analyse(s, _run(s, run_dir))
    finally:
        if keep_logs is not None:
            shutil.copytree(run_dir, keep_logs, dirs_exist_ok=True)
        shutil.rmtree(run_dir, ignore_errors=True)
    return result


def _table(results: list[dict]) -> str:
    rows = [
        ("survivor typical step (s)", lambda r: r["survivor"]["typical_step_s"]),
        ("survivor typical sync step (s)", lambda r: r["survivor"]["typical_sync_step_s"]),
        ("survivor next quorum asked, after kill (s)", lambda r: r["survivor"]["quorum_request_after_kill_s"]),
        ("survivor waited in that quorum (s)", lambda r: r["survivor"]["quorum_wait_s"]),
        ("  participants in that quorum", lambda r: r["survivor"]["quorum_participants"]),
        ("survivor sync done, after kill (s)", lambda r: r["survivor"]["next_sync_after_kill_at_s"]),
        ("  committed", lambda r: r["survivor"]["next_sync_committed"]),
        ("survivor stall at that sync (s)", lambda r: r["survivor"]["stall_s"]),
        ("  as a ratio of the typical step", lambda r: r["survivor"]["stall_ratio"]),
        ("survivor stall when the peer rejoins (s)", lambda r: r["survivor"]["rejoin_stall_s"]),
        ("survivor steps kept, window after kill (%)", lambda r: r["survivor"]["kept_pct"]),
        ("restarted: spawn -> imports done (s)", lambda r: r["restarted"]["start_s"]),
        ("restarted: spawn -> first step (s)", lambda r: r["restarted"]["first_step_s"]),
        ("restarted: waited in its first quorum (s)", lambda r: r["restarted"]["first_quorum_wait_s"]),
        ("restarted: spawn -> healed from peer (s)", lambda r: r["restarted"]["healed_s"]),
        ("restarted: imports done -> healed (s)", lambda r: r["restarted"]["healed_after_start_s"]),
        ("restarted: spawn -> quorum of 2 (s)", lambda r: r["restarted"]["quorum_of_2_s"]),
        ("restarted: spawn -> contributes (s)", lambda r: r["restarted"]["contributes_s"]),
    ]
    head = f"{'':44}" + "".join(f"{'repeat ' + str(i + 1):>10}" for i in range(len(results)))
    lines = [head]
    for name, get in rows:
        lines.append(f"{name:44}" + "".join(f"{'-' if get(r) is None else str(get(r)):>10}" for r in results))
    return "\n".join(lines)


def _median(results: list[dict]) -> dict:
    out: dict = {}
    for part in ("survivor", "restarted"):
        out[part] = {}
        for key in results[0][part]:
            vals = [r[part][key] for r in results]
            if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in vals):
                out[part][key] = round(statistics.median(vals), 4)
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--quick", action="store_true", help="shorter schedule: kill at 4 s, 8 s window, stop at 14 s")
    p.add_argument("--fragments", type=int, default=1, choices=(1, 2))
    p.add_argument("--fragment-sync-delay", type=int, default=0)
    p.add_argument("--out", type=Path, default=RESULTS / "torchft_healing.json")
    p.add_argument("--keep-logs", type=Path, default=None, help="copy each repeat's logs to DIR/repeatN")
    # internal: one replica process
    p.add_argument("--replica", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--incarnation", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--lighthouse", default="", help=argparse.SUPPRESS)
    p.add_argument("--run-dir", type=Path, default=None, help=argparse.SUPPRESS)
    p.add_argument("--settings", default="{}", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.replica is not None:
        _replica_main(a.replica, a.incarnation, a.lighthouse, a.run_dir, Settings(**json.loads(a.settings)))
        return

    over = {"fragments": a.fragments, "fragment_sync_delay": a.fragment_sync_delay}
    s = Settings.quick(**over) if a.quick else Settings(**over)
    results = []
    for i in range(a.repeats):
        t = time.time()
        keep = None if a.keep_logs is None else a.keep_logs / f"repeat{i + 1}"
        results.append(measure(s, keep_logs=keep))
        results[-1]["wall_s"] = round(time.time() - t, 1)
        print(f"repeat {i + 1}/{a.repeats}: {results[-1]['wall_s']} s", flush=True)
    print(_table(results))
    doc = {
        "benchmark": "torchft_healing",
        "description": "torchft DiLoCo, 2 one-process replica groups, SIGKILL of replica 1 and a restart; "
        "the survivor's stall and kept steps, the restarted replica's healing and rejoin",
        "settings": dataclasses.asdict(s),
        "versions": versions(),
        "repeats": results,
        "median": _median(results),
    }
    write_result("torchft_healing", doc, out=a.out)


if __name__ == "__main__":
    main()
