"""torchft 0.2.0 machinery shared by ``torchft_healing.py`` and ``chaos_torchft.py``: a lighthouse with replica
processes, and a replica's instrumented ``Manager``.

* :class:`Cluster`: the lighthouse (``torchft._torchft.LighthouseServer``, in the driver process) and the
  replica processes of one run (a script re-run with ``--replica R --incarnation I``), SIGKILL, teardown;
* :func:`instrumented_manager`: a replica group of one process's ``Manager`` (gloo, synchronous quorum,
  ``init_sync``) whose quorums and commits are logged as event rows: ``quorum`` (its wait, participants,
  quorum id, whether it changed), ``healed`` (the manager applied a state dict received from a peer: torchft
  calls ``load_state_dict`` only to heal) and ``sync`` (each ``should_commit`` result and participants).

The settings object ``s`` (a dataclass) must have ``min_replicas``, ``join_timeout_s``, ``quorum_tick_s``,
``heartbeat_timeout_s``, ``heartbeat_interval_s``, ``timeout_s`` and ``quorum_timeout_s``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def read_rows(path: Path) -> list[dict]:
    """A log's JSON rows; a line cut by a SIGKILL is skipped."""
    rows = []
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                pass
    return rows


class Cluster:
    """The lighthouse and the replica processes of one run (``script --replica R --incarnation I --lighthouse
    ADDR --run-dir DIR --settings JSON``, logging to ``DIR/replica<R>.inc<I>.jsonl``); ``close`` tears it down."""

    def __init__(self, s: Any, run_dir: Path, *, script: Path) -> None:
        os.environ.setdefault("RUST_LOG", "warn")  # torchft's Rust side logs every quorum at INFO otherwise
        from torchft._torchft import LighthouseServer

        self.s, self.run_dir, self.script = s, run_dir, script
        self.lighthouse = LighthouseServer(
            bind="127.0.0.1:0",
            min_replicas=s.min_replicas,
            join_timeout_ms=int(s.join_timeout_s * 1000),
            quorum_tick_ms=int(s.quorum_tick_s * 1000),
            heartbeat_timeout_ms=int(s.heartbeat_timeout_s * 1000),
        )
        self.procs: dict[tuple[int, int], subprocess.Popen] = {}
        self.spawned: dict[tuple[int, int], float] = {}

    def spawn(self, replica: int, incarnation: int) -> float:
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]),
            "OMP_NUM_THREADS": "1",
        }
        cmd = [
            sys.executable,
            str(self.script),
            "--replica",
            str(replica),
            "--incarnation",
            str(incarnation),
            "--lighthouse",
            self.lighthouse.address(),
            "--run-dir",
            str(self.run_dir),
            "--settings",
            json.dumps(dataclasses.asdict(self.s)),
        ]
        out = open(self.run_dir / f"replica{replica}.inc{incarnation}.out", "w")
        t = time.time()
        self.procs[replica, incarnation] = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
        out.close()
        self.spawned[replica, incarnation] = t
        return t

    def kill(self, replica: int, incarnation: int) -> float:
        proc = self.procs[replica, incarnation]
        t = time.time()
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        return t

    def rows(self, replica: int, incarnation: int) -> list[dict]:
        return read_rows(self.run_dir / f"replica{replica}.inc{incarnation}.jsonl")

    def check_alive(self, *keys: tuple[int, int]) -> None:
        for key in keys:
            rc = self.procs[key].poll()
            if rc is not None:
                tail = (self.run_dir / f"replica{key[0]}.inc{key[1]}.out").read_text()[-2000:]
                raise RuntimeError(f"replica {key[0]} (incarnation {key[1]}) exited with {rc}:\n{tail}")

    def close(self) -> None:
        (self.run_dir / "stop").touch()
        deadline = time.time() + 15
        for proc in self.procs.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.lighthouse.shutdown()


def instrumented_manager(
    *,
    replica: int,
    lighthouse: str,
    s: Any,
    state_dict: Callable[[], dict],
    load_state_dict: Callable[[dict], None],
    event: Callable[..., None],
) -> Any:
    """A torchft ``Manager`` for a replica group of one process, its quorums and commits logged by ``event``
    (see the module docstring); ``load_state_dict`` is called only when the manager heals from a peer."""
    from datetime import timedelta

    import torch
    from torchft.manager import Manager
    from torchft.process_group import ProcessGroupGloo

    healed = [False]

    def load(sd: dict) -> None:
        load_state_dict(sd)
        healed[0] = True

    store = torch.distributed.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    timeout = timedelta(seconds=s.timeout_s)
    manager = Manager(
        pg=ProcessGroupGloo(timeout=timeout),
        min_replica_size=1,
        use_async_quorum=False,
        init_sync=True,
        load_state_dict=load,
        state_dict=state_dict,
        replica_id=str(replica),
        store_addr="127.0.0.1",
        store_port=store.port,
        rank=0,
        world_size=1,
        lighthouse_addr=lighthouse,
        hostname="localhost",
        timeout=timeout,
        quorum_timeout=timedelta(seconds=s.quorum_timeout_s),
        connect_timeout=timeout,
        heartbeat_interval=timedelta(seconds=s.heartbeat_interval_s),
    )
    manager._diloco_store = store  # kept alive with the manager

    last_quorum: list[Any] = [None]
    start_quorum, should_commit = manager.start_quorum, manager.should_commit

    def timed_start_quorum(*args: Any, **kwargs: Any) -> None:
        t = time.time()
        healed[0] = False
        start_quorum(*args, **kwargs)
        wait_s = time.time() - t
        n, qid = manager.num_participants(), manager._quorum_id
        if healed[0]:
            event("healed", wait_s=wait_s, outer_step=manager.current_step(), participants=n)
        event(
            "quorum",
            wait_s=wait_s,
            participants=n,
            quorum_id=qid,
            outer_step=manager.current_step(),
            changed=(qid, n) != last_quorum[0],
        )
        last_quorum[0] = (qid, n)

    def timed_should_commit(*args: Any, **kwargs: Any) -> bool:
        ok = should_commit(*args, **kwargs)
        err = manager.errored()
        event(
            "sync",
            committed=bool(ok),
            participants=manager.num_participants(),
            outer_step=manager.current_step(),
            error=None if err is None else repr(err.original_exception)[:200],
        )
        return ok

    manager.start_quorum, manager.should_commit = timed_start_quorum, timed_should_commit
    return manager


def versions() -> dict:
    from importlib.metadata import version

    import torch

    return {"python": sys.version.split()[0], "torch": torch.__version__, "torchft": version("torchft")}
