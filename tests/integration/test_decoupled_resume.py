"""A decoupled run (``method='decoupled'``, learners as threads) checkpoints during the run and resumes.

At a checkpoint step every learner applies its replies in flight, saves its state as the other methods' replicas
do, and the lead saves the syncer's state into the step's folder (``syncer.pt``, in the step's record). A resume
rebuilds the syncer from it before the learners join again. With K = M the resumed run is the uninterrupted one,
bit for bit: a real SIGKILL of ``python -m diloco train`` and a damaged newest checkpoint both end where the
uninterrupted run ends.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from _hooks import CrashAfter, SimulatedCrash

from diloco.cli import main as cli_main
from diloco.train import checkpoint as ckpt
from diloco.train.config import TrainConfig, load_preset
from diloco.train.lr import lr_at
from diloco.train.metrics import read_jsonl
from diloco.train.trainer import Trainer

#: K = M (quorum 0), the mean merge, two fragments with tau = 1: replies are in flight between steps, so a
#: checkpoint step's flush matters; a checkpoint every sync (8 steps).
SETS = dict(
    method="decoupled",
    replicas=2,
    quorum=0,
    merge="mean",
    num_fragments=2,
    overlap_steps=1,
    steps=64,
    checkpoint_every=8,
    eval_every=32,
    threads=1,
)


def config(**kw) -> TrainConfig:
    return TrainConfig.from_dict({**load_preset("tiny")["base"], **SETS, **kw})


def cli_args(out: Path, cache: Path, *extra: str) -> list[str]:
    sets = [x for k, v in SETS.items() if k != "method" for x in ("--set", f"{k}={v}")]
    return [
        "train",
        "--preset",
        "tiny",
        "--method",
        "decoupled",
        "--out",
        str(out),
        "--cache-dir",
        str(cache),
        "--no-progress",
        *sets,
        *extra,
    ]


def merges(run: Path) -> list[dict]:
    return read_jsonl(run / "merges.jsonl")


def learner_rows(run: Path, m: int) -> list[dict]:
    """Learner m's step rows as the run ended: the last execution of each step (a resumed learner's log keeps
    the rows of its earlier life, after a ``joined`` row; diloco.decoupled.chaos_logs.final_steps)."""
    from diloco.decoupled.chaos_logs import final_steps

    return final_steps(read_jsonl(run / f"learner-{m}.jsonl"))[0]


def learner_steps(run: Path, m: int) -> list[int]:
    return [r["step"] for r in learner_rows(run, m)]


def syncer_state(run: Path) -> dict:
    step = ckpt.latest_meta(run)["step"]
    return torch.load(ckpt.step_dir(run, step) / "syncer.pt", map_location="cpu", weights_only=True)


def assert_same_run(a: Path, b: Path) -> None:
    """``b`` (resumed) ended exactly where the uninterrupted ``a`` did."""
    for m in range(SETS["replicas"]):
        assert learner_steps(b, m) == learner_steps(a, m) == list(range(1, SETS["steps"] + 1))
    assert len(merges(b)) == len(merges(a)) > 0
    assert [(r["fragment"], r["version"], r["learners"]) for r in merges(b)] == [
        (r["fragment"], r["version"], r["learners"]) for r in merges(a)
    ]
    for ga, gb in zip(syncer_state(a)["global"], syncer_state(b)["global"], strict=True):
        assert torch.equal(ga, gb)
    la, lb = ckpt.load_latest(a), ckpt.load_latest(b)
    for ra, rb in zip(la["replicas"], lb["replicas"], strict=True):
        for k in ra["model"]:
            assert torch.equal(ra["model"][k], rb["model"][k]), k
    loss = [r["loss"] for r in read_jsonl(a / "metrics.jsonl") if "loss" in r]
    assert [r["loss"] for r in read_jsonl(b / "metrics.jsonl") if "loss" in r] == loss
    final = json.loads((a / "summary.json").read_text())["final_eval_loss"]
    assert math.isfinite(final) and json.loads((b / "summary.json").read_text())["final_eval_loss"] == final


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, token_cache) -> Path:
    out = tmp_path_factory.mktemp("decoupled") / "full"
    assert cli_main(cli_args(out, token_cache)) == 0
    return out


def test_killed_with_sigkill_and_resumed_it_ends_bit_identical(request, tmp_path, token_cache):
    from _hooks import SigkillBeside

    killed = tmp_path / "killed"
    kill = SigkillBeside(cli_args(killed, token_cache), killed, step=8, log=tmp_path / "killed.log")
    uninterrupted = request.getfixturevalue("uninterrupted")  # (trained meanwhile, in this process, if not yet)
    stopped_at = kill.stopped_at()
    assert 8 <= stopped_at < SETS["steps"] and not (killed / "summary.json").exists(), "the run was not interrupted"
    assert "syncer.pt" in ckpt.latest_meta(killed)["files"]
    assert cli_main(cli_args(killed, token_cache, "--resume")) == 0
    assert_same_run(uninterrupted, killed)


def test_keep_k_holds_the_syncer_state_and_a_damaged_one_falls_back(uninterrupted, tmp_path, token_cache, capsys):
    cfg, cut = config(), tmp_path / "cut"
    with pytest.raises(SimulatedCrash):
        Trainer(cfg, cut, cache_dir=token_cache, progress=False, callbacks=[CrashAfter(44, replicas=2)]).run()
    # keep_checkpoints = 2: the last two steps, each with its syncer state, recorded with its digest
    assert ckpt.saved_steps(cut) == [32, 40]
    for step in (32, 40):
        record = json.loads((cut / "checkpoints" / f"step-{step:08d}.json").read_text())
        assert sorted(record["files"]) == ["replica-0.pt", "replica-1.pt", "syncer.pt"]
        assert (ckpt.step_dir(cut, step) / "syncer.pt").stat().st_size == record["files"]["syncer.pt"]["bytes"]
    damaged = ckpt.step_dir(cut, 40) / "syncer.pt"
    data = bytearray(damaged.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte: the learners' files of step 40 are sound, the syncer's not
    damaged.write_bytes(bytes(data))
    capsys.readouterr()
    Trainer(cfg, cut, cache_dir=token_cache, progress=False).run(resume=True)
    err = capsys.readouterr().err
    assert "skipped a damaged checkpoint, step 40" in err and "syncer.pt" in err and "resuming from step 32" in err
    assert_same_run(uninterrupted, cut)


def test_k_below_m_resumes_with_the_schedules_lr_and_sane_merges(tmp_path, token_cache):
    """3 learners, K = 2 (merges of whoever is in: the timing of threads decides them, so not bit for bit)."""
    cfg = config(replicas=3, global_batch=9, quorum=2, merge="rda", steps=32, checkpoint_every=8, eval_every=16)
    run = tmp_path / "k2"
    with pytest.raises(SimulatedCrash):
        Trainer(cfg, run, cache_dir=token_cache, progress=False, callbacks=[CrashAfter(20, replicas=3)]).run()
    assert ckpt.latest_meta(run)["step"] == 16
    result = Trainer(cfg, run, cache_dir=token_cache, progress=False).run(resume=True)
    assert math.isfinite(result.final_eval_loss)
    rows = [r for r in read_jsonl(run / "metrics.jsonl") if "loss" in r]
    assert [r["step"] for r in rows] == list(range(1, 33))
    # the lr of every step is the schedule's at that step: the resumed steps 17.. do not warm up again
    assert all(r["lr"] == lr_at(r["step"], cfg) for r in rows)
    assert lr_at(17, cfg) != lr_at(1, cfg)  # (a schedule started afresh would be told apart)
    # every learner's steps once; its rows' replies are the merges it took part in (those before the crash's
    # checkpoint from the first run, the rest from the resumed one: what the crash threw away is in neither)
    found = merges(run)
    P, M = cfg.num_fragments, cfg.replicas
    reports = P * cfg.total_steps // cfg.sync_every  # each learner's, one per fragment every H steps
    assert reports <= len(found) <= reports * M  # a merge takes 1..M reports
    for m in range(M):
        own = learner_rows(run, m)
        assert [r["step"] for r in own] == list(range(1, 33))
        # a reply for each report (the flushes at checkpoints included): every merge it was kept in, at least
        assert sum(m in r["learners"] for r in found) <= sum(len(r["synced"]) for r in own) == reports
    for p in range(P):  # each fragment's versions count up by one a merge, across the resume
        versions = [r["version"] for r in found if r["fragment"] == p]
        assert versions == list(range(1, len(versions) + 1))
