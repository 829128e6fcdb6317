"""An elastic restart with another number of workers, in one process (replicas as threads).

``Trainer.run_replica(comm, elastic=True)`` is what each torchrun process calls under
``diloco train --elastic``; here the M' replicas are threads of the in-process communicator, so
the resize path (``_restore_resized``) and the sampler re-cut run in seconds. The torchrun test
with killed and joining agents is tests/distributed/test_elastic.py.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from _hooks import CrashAfter, SimulatedCrash

from diloco.comm.local import run_replicas
from diloco.data import ShardSampler
from diloco.train import checkpoint as ckpt
from diloco.train.config import TrainConfig, load_preset
from diloco.train.trainer import Trainer


def _cfg(replicas: int) -> TrainConfig:
    return TrainConfig.from_dict(
        {
            **load_preset("tiny")["base"],
            **load_preset("tiny")["methods"]["streaming"],
            "replicas": replicas,
            "global_batch": 12,
            "steps": 24,
            "checkpoint_every": 8,
            "threads": 1,
        }
    )


def _elastic(out: Path, cache: Path, replicas: int):
    def one(comm):
        return Trainer(_cfg(replicas), out, cache_dir=cache, progress=False).run_replica(comm, elastic=True)

    return run_replicas(one, replicas)


@pytest.mark.parametrize("old, new", [(2, 3), (2, 1)])
def test_a_run_resumes_with_another_number_of_workers(tmp_path: Path, token_cache: Path, old: int, new: int):
    out = tmp_path / "run"
    with pytest.raises(SimulatedCrash):  # M = old workers, stopped after step 11: step 8 is the newest checkpoint
        Trainer(_cfg(old), out, cache_dir=token_cache, progress=False, callbacks=[CrashAfter(11, replicas=old)]).run()
    saved = ckpt.load_latest(out)
    assert (saved["step"], saved["num_replicas"]) == (8, old)
    assert any(r["algorithm"]["pending"] for r in saved["replicas"])  # tau = 1: something was in flight

    # Restore only (no training): the state each of the `new` workers starts from.
    starts = {}

    class Capture(Trainer):
        def _restore_resized(self, rep, step, saved_replicas):
            super()._restore_resized(rep, step, saved_replicas)
            starts[rep.rank] = {
                "model": {k: v.clone() for k, v in rep.model.state_dict().items()},
                "global": rep.algo.global_state_dict(),
                "opt": rep.opt.state_dict(),
                "sampler": rep.sampler,
                "dropped_in_flight": dict(rep.algo._dropped_in_flight),
            }
            raise SimulatedCrash("restored")

    with pytest.raises(SimulatedCrash):
        run_replicas(
            lambda comm: Capture(_cfg(new), out, cache_dir=token_cache, progress=False).run_replica(comm, elastic=True),
            new,
        )
    assert sorted(starts) == list(range(new))
    for r, got in starts.items():
        mine = saved["replicas"][r if r < old else 0]
        if r < old:  # a surviving worker keeps its local parameters
            for k, v in mine["model"].items():
                assert torch.equal(got["model"][k], v), k
        else:  # a new worker: the global parameters, worker 0's AdamW state (moments and step count)
            for k, v in got["global"].items():
                assert torch.equal(got["model"][k], v), k
            assert not torch.equal(got["model"]["embed.weight"], saved["replicas"][0]["model"]["embed.weight"])
        for k, s in mine["optimizer"]["state"].items():
            assert torch.equal(got["opt"]["state"][k]["exp_avg"], s["exp_avg"])
            assert float(got["opt"]["state"][k]["step"]) == float(s["step"]) == 8
        # the in-flight exchanges of the checkpoint are dropped, the same on every worker
        pending = mine["algorithm"]["pending"]
        assert got["dropped_in_flight"] == {int(p): int(e["started_at"]) for p, e in pending.items()}
    # the rest of the epoch is dealt anew: disjoint shards, none of the windows read before the checkpoint
    read = set()
    for state in (r["sampler"] for r in saved["replicas"]):
        s = ShardSampler(
            np.zeros(state["num_tokens"], np.int64),
            rank=state["rank"],
            world_size=old,
            batch_size=state["batch_size"],
            seq_len=state["seq_len"],
            seed=state["seed"],
        )
        read |= set(s.window_starts[s._epoch_order()[: state["index"]]].tolist())
    shards = [set(starts[r]["sampler"].window_starts.tolist()) for r in range(new)]
    assert all(not (a & b) for i, a in enumerate(shards) for b in shards[i + 1 :])
    assert not any(sh & read for sh in shards) and read

    # And the run goes on to its end with `new` workers.
    results = _elastic(out, token_cache, new)
    assert results[0] is not None and math.isfinite(results[0].final_eval_loss)
    meta = ckpt.latest_meta(out)
    assert (meta["step"], meta["num_replicas"]) == (24, new)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "loss" in r] == list(range(1, 25))
    assert json.loads((out / "config.json").read_text())["replicas"] == new


def test_elastic_refuses_resume_and_overwrite(tmp_path: Path):
    from diloco.train.rundir import plan_run_dir

    with pytest.raises(ValueError, match="elastic launch resumes by itself"):
        plan_run_dir(tmp_path, _cfg(2), resume=True, elastic=True)


def test_a_kill_during_the_first_checkpoint_starts_the_run_again(tmp_path: Path):
    """Only step folders (a kill before the first checkpoint was committed): an elastic restart starts the run
    again; once a step is committed it resumes (here from a damaged one, which it refuses)."""
    from diloco.files import write_json
    from diloco.train.rundir import plan_run_dir

    write_json(tmp_path / "config.json", _cfg(2).to_dict())
    folder = ckpt.step_dir(tmp_path, 8)
    folder.mkdir(parents=True)
    (folder / "replica-0.pt").write_bytes(b"written by one worker; the other was killed")
    plan = plan_run_dir(tmp_path, _cfg(1), elastic=True)
    assert plan.action == "overwrite" and "before its first checkpoint was committed" in plan.notices[0]
    (ckpt.checkpoint_dir(tmp_path) / "latest.json").write_text(json.dumps({"step": 8, "num_replicas": 2}))
    with pytest.raises(ckpt.CheckpointError, match="no readable checkpoint"):
        plan_run_dir(tmp_path, _cfg(1), elastic=True)


def test_elastic_outside_torchrun_is_refused_before_anything_is_written(tmp_path: Path, capsys, monkeypatch):
    from diloco.cli import main as cli_main

    for var in ("TORCHELASTIC_RUN_ID", "RANK", "WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    assert cli_main(["train", "--preset", "tiny", "--elastic", "--out", str(tmp_path / "run")]) == 2
    assert "--elastic needs a torchrun launch" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
