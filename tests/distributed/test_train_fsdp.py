"""`diloco train --set worker_sharding=fsdp` under torchrun: FSDP workers, sharded (DCP) checkpoints, resharding.

One FSDP run of 2 workers x 2 ranks (4 processes, tiny preset, Streaming DiLoCo P = 3,
tau = 1, fp32 on the wire, 16 steps, a checkpoint every 4) is the reference the
tests share (module fixtures, launched side by side to save start-up time):

* against the same run with replicated workers (2 replicas, one process each: the
  in-process run, which the replicated 2 x 2 torchrun run equals to 1e-5, see
  test_train_torchrun.py): equal within float tolerance, eval losses every 4 steps
  and every worker's local and global parameters;
* the same run, its checkpoints written in the background, with every rank SIGKILLed
  after its step-4 checkpoint, then resumed: bit-identical to it;
* resumed from its step-4 checkpoint with R = 1 (resharding) and with M = 1 (the
  elastic path): both continue, each within a tolerance the test explains.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from test_train_torchrun import (
    _assert_identical,
    _children,
    _finish,
    _in_process,
    _rank_of,
    _torchrun,
    _train_args,
    _wait_for_checkpoint,
)

from diloco.cli import main as cli_main
from diloco.train import checkpoint as ckpt
from diloco.train import sharded_checkpoint as sc
from diloco.train.config import TrainConfig, load_preset
from diloco.train.rundir import plan_run_dir

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds torchrun's workers through /proc"),
]

STEPS = 16  # (24 until the suite was cut to time; the tolerances below were measured at 24)
BASE = ["--set", f"steps={STEPS}", "--set", "checkpoint_every=4", "--set", "codec=fp32", "--set", "eval_every=4"]
RUN = [*BASE, "--set", "ranks_per_worker=2"]
FSDP = ["--set", "worker_sharding=fsdp"]
ASYNC = ["--set", "checkpoint_async=true"]  # the killed run writes its checkpoints in the background
KEEP_ALL = ["--set", "keep_checkpoints=20"]  # the resharding tests start from step 4 (a runtime setting)


@pytest.fixture(scope="module")
def runs(token_cache: Path, tmp_path_factory) -> dict[str, Path]:
    """The FSDP reference run (torchrun, 4 processes); beside it the same run killed with SIGKILL after its
    step-4 checkpoint; then the in-process run of 2 replicated replicas."""
    root = tmp_path_factory.mktemp("fsdp-runs")
    out = {"fsdp": root / "fsdp", "killed": root / "killed", "replicate": root / "replicate"}
    proc = _torchrun(
        _train_args(out["fsdp"], token_cache, "streaming", *RUN, *FSDP, *KEEP_ALL), root / "fsdp.log", nproc=4
    )
    killed = _torchrun(
        _train_args(out["killed"], token_cache, "streaming", *RUN, *FSDP, *ASYNC), root / "killed.log", nproc=4
    )  # keep_checkpoints at its default, 2
    try:
        _wait_for_checkpoint(out["killed"], 4, killed, root / "killed.log")
        workers = {_rank_of(pid): pid for pid in _children(killed.pid)}
        assert sorted(workers) == [0, 1, 2, 3], workers
        os.kill(workers[3], signal.SIGKILL)  # worker 1's second rank first, then the rest: the machine died
        for pid in (workers[0], workers[1], workers[2], killed.pid):
            os.kill(pid, signal.SIGKILL)
        killed.wait(timeout=60)
    finally:
        if killed.poll() is None:
            killed.kill()
            killed.wait()
    # stopped mid-run: a committed checkpoint, no results
    assert 4 <= ckpt.latest_meta(out["killed"])["step"] < STEPS and not (out["killed"] / "summary.json").exists()
    _in_process(_train_args(out["replicate"], token_cache, "streaming", *BASE))
    _finish(proc, root / "fsdp.log")
    return out


@pytest.fixture(scope="module")
def continued(runs: dict[str, Path], token_cache: Path, tmp_path_factory) -> dict[str, Path]:
    """Side by side: the killed run resumed (4 processes); the reference's step-4 checkpoint resumed with
    R = 1 (2 processes) and, elastic, with M = 1 (2 processes)."""
    root = tmp_path_factory.mktemp("fsdp-continued")
    r1, m1 = _from_step(runs["fsdp"], 4, root / "r1"), _from_step(runs["fsdp"], 4, root / "m1")
    procs = {
        "killed": _torchrun(
            _train_args(runs["killed"], token_cache, "streaming", *RUN, *FSDP, *ASYNC, "--resume"),
            root / "killed.log",
            nproc=4,
        ),
        "r1": _torchrun(
            _train_args(r1, token_cache, "streaming", *BASE, *FSDP, "--set", "ranks_per_worker=1", "--resume"),
            root / "r1.log",
            nproc=2,
        ),
        "m1": _torchrun(_train_args(m1, token_cache, "streaming", *RUN, *FSDP, "--elastic"), root / "m1.log", nproc=2),
    }
    for name, proc in procs.items():
        _finish(proc, root / f"{name}.log")
    return {"killed": runs["killed"], "r1": r1, "m1": m1, "m1.log": root / "m1.log"}


def _losses(run: Path) -> dict[int, float]:
    return {
        r["step"]: r["loss"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if "loss" in r
    }


def _evals(run: Path) -> dict[int, float]:
    return {
        r["step"]: r["eval_loss"]
        for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
        if "eval_loss" in r
    }


def _fragment_names(run: Path) -> list[list[str]]:
    """The run's fragments, parameter names in order (how the flat global copies of replicated workers are laid out)."""
    from diloco.algorithm.fragments import split_fragments
    from diloco.models.factory import build_model

    cfg = TrainConfig.from_dict(json.loads((run / "config.json").read_text()))
    return [
        f.names
        for f in split_fragments(
            build_model(cfg.model, size=cfg.size, vocab_size=cfg.vocab_size, seq_len=cfg.seq_len, seed=cfg.seed),
            cfg.num_fragments,
            pattern=cfg.fragment_pattern,
        )
    ]


# -- 1. FSDP workers = replicated workers --------------------------------------
def test_fsdp_workers_equal_replicated_workers_in_fp32(runs: dict[str, Path]):
    """Eval losses of the global parameters every 4 steps, each worker's local and global parameters at the end.

    (The logged training losses differ by design: the in-process run logs the mean over replicas of their
    whole batches, a torchrun run its first rank's rows.) Each FSDP worker averages two half-batch
    gradients (FSDP's reduce-scatter) where the replica differentiates the mean over the whole batch: the
    same number in another FP32 order, which the inner AdamW can grow from 1 ulp: 5e-5 on parameters of
    order 1 after 16 steps (measured 1.4e-5 after 24; the replicated 2 x 2 workers are as far from this run), 1e-5
    relative on eval losses (measured: equal to the printed digits).
    """
    fsdp, rep = runs["fsdp"], runs["replicate"]
    assert sorted(_losses(fsdp)) == list(range(1, STEPS + 1))
    ea, eb = _evals(fsdp), _evals(rep)
    assert sorted(ea) == sorted(eb) == list(range(4, STEPS + 1, 4))
    for step in ea:
        assert ea[step] == pytest.approx(eb[step], rel=1e-5), step
    frags = _fragment_names(rep)
    for w in range(2):
        sharded, replicated = sc.read_full(fsdp, STEPS, w), ckpt.load_replica(rep, w, STEPS)
        for name, value in replicated["model"].items():
            torch.testing.assert_close(sharded[f"model/{name}"], value, rtol=0, atol=5e-5, msg=name)
        for names, flat in zip(frags, replicated["algorithm"]["global"], strict=True):
            mine = torch.cat([sharded[f"global/{n}"].reshape(-1) for n in names])
            torch.testing.assert_close(mine, flat, rtol=0, atol=5e-5)
    # the bytes a worker sent: its R ranks' columns together, the same as a replicated worker's
    got, want = (json.loads((run / "summary.json").read_text()) for run in (fsdp, rep))
    assert got["bytes_sent_per_replica"] == want["bytes_sent_per_replica"] > 0
    # not vacuous: the workers trained apart between syncs, and the parameters moved from their start
    w0, w1 = sc.read_full(fsdp, STEPS, 0), sc.read_full(fsdp, STEPS, 1)
    assert not torch.equal(w0["model/embed.weight"], w1["model/embed.weight"])
    assert torch.equal(w0["global/embed.weight"], w1["global/embed.weight"])  # one global copy, the same bits
    assert (w0["global/embed.weight"] - sc.read_full(fsdp, 4, 0)["global/embed.weight"]).abs().max() > 1e-3


def test_the_sharded_checkpoint_every_rank_its_shard_with_digests(runs: dict[str, Path]):
    """Each worker's folder holds one DCP shard file per rank, DCP's index and each rank's small state;
    the record lists every file with its SHA-256, and a damaged file makes resume fall back a step."""
    fsdp = runs["fsdp"]
    meta = ckpt.latest_meta(fsdp)
    assert meta["format"] == "dcp" and meta["step"] == STEPS and meta["num_replicas"] == 2
    names = {
        f"worker-{w}/{f}"
        for w in range(2)
        for f in (".metadata", "__0_0.distcp", "__1_0.distcp", "rank-0.pt", "rank-1.pt")
    }
    assert set(meta["files"]) == names
    # each rank holds about half of every sharded tensor: the two shard files are about the same size
    sizes = [meta["files"][f"worker-0/__{r}_0.distcp"]["bytes"] for r in range(2)]
    assert max(sizes) < 1.3 * min(sizes)

    copy = fsdp.parent / "damaged"
    shutil.copytree(fsdp, copy)
    shard = ckpt.step_dir(copy, STEPS) / "worker-1" / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    found = ckpt.find_resumable(copy)
    assert found.step == STEPS - 4 and "worker-1/__0_0.distcp is damaged" in found.skipped[0]


def test_an_fsdp_run_exports_its_global_parameters(runs: dict[str, Path], tmp_path: Path):
    from diloco.train.export import global_model

    model, meta, _ = global_model(runs["fsdp"], cache_dir=tmp_path)
    assert meta["step"] == STEPS and meta["format"] == "dcp"
    full = sc.read_full(runs["fsdp"], STEPS, 0)
    for name, p in model.named_parameters():
        assert torch.equal(p, full[f"global/{name}"]), name


# -- 2. kill -9, then --resume: bit-identical --------------------------------------
def _tensors_and_state(run: Path, step: int, worker: int) -> tuple[dict[str, torch.Tensor], list[dict[str, Any]]]:
    ranks = [
        torch.load(ckpt.step_dir(run, step) / f"worker-{worker}" / f"rank-{r}.pt", weights_only=True) for r in range(2)
    ]
    for r in ranks:
        r.pop("train_time_s")  # wall-clock, not state
    return sc.read_full(run, step, worker), ranks


def test_fsdp_run_killed_with_sigkill_resumes_bit_identical(runs: dict[str, Path], continued: dict[str, Path]):
    """Every rank of the killed run (see ``runs``) got SIGKILL right after its step-4 checkpoint was committed;
    ``--resume`` (4 fresh processes) ends with the same bits as the uninterrupted run. The killed run writes
    its checkpoints in the background (``checkpoint_async``, committed a step later), the reference in the
    foreground: the same files."""
    run, ref = continued["killed"], runs["fsdp"]
    for w in range(2):
        got, want = _tensors_and_state(run, STEPS, w), _tensors_and_state(ref, STEPS, w)
        _assert_identical(got, want, f"worker {w}")
    assert ckpt.saved_steps(run) == [STEPS - 4, STEPS]  # keep K = 2
    assert _losses(run) == _losses(ref) and _evals(run) == _evals(ref)  # every step logged once, same bits
    assert (
        json.loads((run / "summary.json").read_text())["final_eval_loss"]
        == json.loads((ref / "summary.json").read_text())["final_eval_loss"]
    )


# -- 3. resharding (R 2 -> 1) and the elastic path (M 2 -> 1) --------------------------
def _from_step(run: Path, step: int, dest: Path) -> Path:
    """A copy of ``run`` as it was when ``step`` was its latest checkpoint (later steps and results removed)."""
    shutil.copytree(run, dest)
    for later in ckpt.saved_steps(dest):
        if later > step:
            shutil.rmtree(ckpt.step_dir(dest, later))
            (ckpt.checkpoint_dir(dest) / f"step-{later:08d}.json").unlink()
    shutil.copy(ckpt.checkpoint_dir(dest) / f"step-{step:08d}.json", ckpt.checkpoint_dir(dest) / "latest.json")
    (dest / "summary.json").unlink()
    return dest


def test_resume_with_fewer_ranks_and_with_fewer_workers(runs: dict[str, Path], continued: dict[str, Path]):
    """From the step-4 checkpoint of the 2 x 2 run (no exchange in flight there: fragment 0 synced at
    step 3, fragment 1 starts at step 5).

    R 2 -> 1 (2 processes, ``--resume --set ranks_per_worker=1``): DCP reshards every tensor; each worker
    trains on the same batches, its one rank computing the gradient of the whole batch instead of two
    halves averaged: the same run in another FP32 order. So its eval losses (every 4 steps) and global
    parameters follow the reference's within float tolerance: 1e-5 relative and 1e-5 absolute (measured
    4e-8 and 2.4e-7 at 24 steps). (Its logged training losses are of all 4 rows of worker 0's
    batch, the reference's of its first rank's 2: not comparable.)

    M 2 -> 1 (2 processes, ``--elastic``: 1 worker of 2 ranks): the one worker takes worker 0's state and
    the whole global batch of the re-cut epoch, so tokens per step and the lr schedule are unchanged but
    the run is no longer the same computation (one worker's outer gradient instead of the mean of two,
    other batches). It must finish with every step logged once and stay close to the reference: every
    eval loss after the restart within 2 % (measured: at most 0.5 % over 24 steps).
    """
    ref, r1, m1 = runs["fsdp"], continued["r1"], continued["m1"]
    want = _evals(ref)

    got = _evals(r1)
    assert sorted(_losses(r1)) == list(range(1, STEPS + 1)) and got.keys() == want.keys()
    for step in got:
        assert got[step] == pytest.approx(want[step], rel=1e-5), step
    meta = ckpt.latest_meta(r1)
    assert meta["config"]["ranks_per_worker"] == 1 and set(meta["files"]) == {
        f"worker-{w}/{f}" for w in range(2) for f in (".metadata", "__0_0.distcp", "rank-0.pt")
    }
    a, b = sc.read_full(r1, STEPS, 0), sc.read_full(ref, STEPS, 0)
    for name in b:
        if name.startswith("global/"):
            torch.testing.assert_close(a[name], b[name], rtol=0, atol=1e-5, msg=name)

    got = _evals(m1)
    assert sorted(_losses(m1)) == list(range(1, STEPS + 1)) and got.keys() == want.keys()
    assert (
        "elastic restart: resuming from step 4 (written by 2 workers) with 1 workers" in continued["m1.log"].read_text()
    )
    assert ckpt.latest_meta(m1)["num_replicas"] == 1
    for step in got:
        assert got[step] == pytest.approx(want[step], rel=0.02), step


# -- 4. bad input: a clear error before anything is written ---------------------------------
def test_fsdp_in_one_process_and_ranks_that_do_not_divide_the_world_are_refused(tmp_path: Path, monkeypatch, capsys):
    out = tmp_path / "out"
    args = [
        "train",
        "--preset",
        "tiny",
        "--no-progress",
        "--out",
        str(out),
        "--cache-dir",
        str(tmp_path / "c"),
        "--set",
        "worker_sharding=fsdp",
        "--set",
        "ranks_per_worker=2",
    ]

    def refused(argv: list[str], message: str) -> None:
        assert cli_main(argv) == 2
        assert message in capsys.readouterr().err
        assert not out.exists()  # nothing written

    refused(
        args,
        "worker_sharding='fsdp' shards each worker over its ranks, one process each: launch replicas x "
        "ranks_per_worker = 4 processes with torchrun",
    )
    # under torchrun (its environment), 3 processes for workers of 2 ranks: refused before joining
    for key, value in {
        "RANK": "0",
        "WORLD_SIZE": "3",
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "3",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "1",
    }.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    refused(args, "3 processes were launched but replicas x ranks_per_worker = 2 x 2 = 4; launch 4 processes")
    refused([*args, "--elastic"], "--elastic: 3 processes cannot form workers of ranks_per_worker=2 ranks")


def test_a_resume_of_sharded_checkpoints_first_deletes_the_uncommitted_steps(tmp_path: Path):
    """Many processes write a step's folder; one a crash left half-written must be empty before it is written again."""
    for step in (4, 8, 12):
        (ckpt.step_dir(tmp_path, step) / "worker-0").mkdir(parents=True)
        (ckpt.step_dir(tmp_path, step) / "worker-0" / "__3_0.distcp").write_bytes(b"x")
    assert ckpt.discard_uncommitted(tmp_path, 4) == [8, 12]
    assert ckpt.saved_steps(tmp_path) == [4]


def _tiny(**kw: Any) -> TrainConfig:
    return TrainConfig.from_dict({**load_preset("tiny")["base"], **kw})


def test_fsdp_settings_are_validated():
    with pytest.raises(ValueError, match=r"worker_sharding='zero3': choose one of replicate, fsdp"):
        _tiny(worker_sharding="zero3")
    with pytest.raises(ValueError, match=r"worker_sharding='fsdp' runs DiLoCo / streaming workers, not method='dp'"):
        _tiny(worker_sharding="fsdp", method="dp")
    with pytest.raises(ValueError, match=r"fsdp_mixed_precision=true needs worker_sharding='fsdp'"):
        _tiny(fsdp_mixed_precision=True)


def test_a_checkpoint_of_the_other_format_is_refused_saying_what_to_do(runs: dict[str, Path]):
    """Sharded and one-file-per-worker checkpoints do not load into each other's workers; the error says how
    to resume each."""
    fsdp, rep = runs["fsdp"], runs["replicate"]
    cfg = TrainConfig.from_dict(json.loads((fsdp / "config.json").read_text()))
    with pytest.raises(
        ValueError,
        match=r"holds one file per worker \(replicated workers, worker_sharding="
        r"'replicate'\); FSDP workers resume only from sharded checkpoints. "
        r"Resume it with --set worker_sharding=replicate",
    ):
        plan_run_dir(rep, cfg.with_overrides({"steps": STEPS + 8}), resume=True)
    with pytest.raises(
        ValueError,
        match=r"is sharded \(written by FSDP workers\); resume it with --set "
        r"worker_sharding=fsdp under torchrun",
    ):
        plan_run_dir(fsdp, cfg.with_overrides({"worker_sharding": "replicate", "steps": STEPS + 8}), resume=True)
