"""How the workers of a torchrun job find which of them share ``--out``, and settle on one plan
(:mod:`diloco.train.run_folders`), with the in-process communicator: each thread stands in for a machine, and
"a folder of its own" is a path of its own (on real machines it is the same path on another disk:
``tests/hosts/test_sync_across_hosts.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from diloco.comm.local import run_replicas
from diloco.errors import ConfigError
from diloco.train.run_folders import Folder, agree_plan, exchange, find_folders
from diloco.train.rundir import RunDirPlan


def test_exchange_gives_every_worker_every_value_in_rank_order():
    got = run_replicas(lambda c: exchange(c, None, {"me": c.rank, "text": "é" * c.rank}), 3)
    assert got == [[{"me": r, "text": "é" * r} for r in range(3)]] * 3


def test_one_folder_is_shared_and_its_markers_are_gone(tmp_path: Path):
    found = run_replicas(lambda c: find_folders(c, None, tmp_path / "out", c.barrier), 3)
    assert found == [Folder(shared=True, lead=r == 0, workers=(0, 1, 2)) for r in range(3)]
    assert list((tmp_path / "out").iterdir()) == []


def test_a_folder_per_machine_and_two_machines_sharing_one(tmp_path: Path):
    dirs = [tmp_path / "a", tmp_path / "b", tmp_path / "b"]  # worker 0 alone; workers 1 and 2 share
    found = run_replicas(lambda c: find_folders(c, None, dirs[c.rank], c.barrier), 3)
    assert found == [
        Folder(shared=False, lead=True, workers=(0,)),
        Folder(shared=False, lead=True, workers=(1, 2)),
        Folder(shared=False, lead=False, workers=(1, 2)),
    ]


def _plans(tmp_path: Path, per_worker):
    """Every worker's plan_at: per_worker[w](upto) -> (action, step) or an exception; returns run_replicas' result."""

    def one(comm):
        def plan_at(upto):
            action, step = per_worker[comm.rank](upto)
            return RunDirPlan(tmp_path, action, start_step=step)

        return agree_plan(plan_at, comm, None, tmp_path)

    return run_replicas(one, len(per_worker))


def _resumable(*steps):
    """A folder holding these committed steps: resume from the newest no later than upto."""

    def plan_at(upto):
        ok = [s for s in steps if upto is None or s <= upto]
        if not ok:
            raise ConfigError(f"no readable checkpoint up to step {upto}")
        return "resume", max(ok)

    return plan_at


def test_the_workers_resume_the_newest_step_every_folder_holds(tmp_path: Path):
    # machine 1 was lost before it recorded step 16; machine 0 kept step 8 (pruned only after every folder recorded 16)
    plans = _plans(tmp_path, [_resumable(8, 16), _resumable(8)])
    assert [(p.action, p.start_step) for p in plans] == [("resume", 8), ("resume", 8)]


def test_a_folder_without_the_run_stops_every_worker_naming_it(tmp_path: Path):
    with pytest.raises(ConfigError, match=r"worker 1's --out \(.*\) holds no checkpoint of this run.*--overwrite"):
        _plans(tmp_path, [_resumable(8), lambda upto: ("new", 0)])


def test_an_error_in_one_folder_is_every_worker_s_error(tmp_path: Path):
    def broken(upto):
        raise ConfigError("checkpoint step-8/replica-1.pt is damaged")

    with pytest.raises(ConfigError, match=r"(worker 1's --out .* cannot be used: )?checkpoint .* is damaged"):
        _plans(tmp_path, [_resumable(8), broken])


def test_the_lead_s_finished_run_is_finished_for_all_and_fresh_starts_agree(tmp_path: Path):
    plans = _plans(tmp_path, [lambda upto: ("finished", 16), _resumable(16)])
    assert [p.action for p in plans] == ["finished", "finished"]
    plans = _plans(tmp_path, [lambda upto: ("new", 0), lambda upto: ("overwrite", 0)])
    assert [p.action for p in plans] == ["new", "overwrite"]
