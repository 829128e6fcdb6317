"""`diloco train` under torchrun: the same bits as the in-process run, and a rank killed mid-run.

These tests run the real command line both ways on the tiny preset:

* in-process: ``diloco train`` in this process (M = 2 replica threads);
* distributed: ``torchrun --standalone --nproc-per-node 2 -m diloco train`` (2 processes, gloo).

Both use one intra-op thread per replica (``--set threads=1``), so they run the
same kernels on the same data and must end with the same bits (see
docs/guides/distributed.md, "Equivalence"). The comparison is of everything a replica
checkpoints: model, inner optimizer, algorithm (global parameters, outer momenta,
pending fragments, byte counters) and sampler.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from _replicas import single_thread

from diloco.cli import main as cli_main
from diloco.train import checkpoint as ckpt
from diloco.train.config import TrainConfig, load_preset

pytestmark = [
    pytest.mark.timeout(240),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds torchrun's workers through /proc"),
]

COMMON = ["--preset", "tiny", "--set", "threads=1", "--no-progress"]
# Seconds a survivor may wait for a peer (the CLI's --timeout). A dead peer is noticed at once;
# this is the bound the test holds the survivor to, generous for a machine busy with other jobs.
TIMEOUT_S = 30


@pytest.fixture(scope="module")
def cache(token_cache: Path) -> Path:
    """Tokenizer and token cache, built once per session (conftest) so that no run (or rank) below pays for it."""
    return token_cache


def _train_args(out: Path, cache: Path, method: str, *extra: str) -> list[str]:
    return ["train", *COMMON, "--method", method, "--out", str(out), "--cache-dir", str(cache), *extra]


def _torchrun(args: list[str], log: Path, *, nproc: int = 2, torchrun_opts: tuple[str, ...] = ()) -> subprocess.Popen:
    """Start ``torchrun --standalone --nproc-per-node NPROC [opts] -m diloco <args>``; output to ``log``."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "GLOO_SOCKET_IFNAME")
    }
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        str(nproc),
        *torchrun_opts,
        "-m",
        "diloco",
        *args,
    ]
    with open(log, "wb") as f:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(cmd, env=env, stdout=f, stderr=subprocess.STDOUT)


def _finish(proc: subprocess.Popen, log: Path, timeout: float = 150) -> None:
    try:
        rc = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise AssertionError(f"torchrun still running after {timeout}s:\n{log.read_text()[-3000:]}") from None
    assert rc == 0, f"torchrun exited with {rc}:\n{log.read_text()[-3000:]}"


def _in_process(args: list[str]) -> None:
    with single_thread():  # the trainer sets the thread count of this (test) process; put it back after
        assert cli_main(args) == 0


def _assert_identical(a: Any, b: Any, where: str = "") -> None:
    """Nested dicts / lists of tensors and numbers: equal bit for bit (tensors: same dtype, shape, values)."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), f"{where}: keys {sorted(a)} != {sorted(b)}"
        for k in a:
            _assert_identical(a[k], b[k], f"{where}/{k}")
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), f"{where}: lengths differ"
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_identical(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def _assert_same_replicas(run_a: Path, run_b: Path) -> int:
    """Both runs' latest checkpoints hold the same state for every replica; returns the step."""
    a, b = ckpt.load_latest(run_a), ckpt.load_latest(run_b)
    assert a["step"] == b["step"] and a["num_replicas"] == b["num_replicas"] == 2
    for r, (ra, rb) in enumerate(zip(a["replicas"], b["replicas"], strict=True)):
        for part in ("model", "optimizer", "algorithm", "sampler"):
            _assert_identical(ra[part], rb[part], f"replica {r} {part}")
    return a["step"]


def _summary(run: Path) -> dict[str, Any]:
    return json.loads((run / "summary.json").read_text())


# -- 1. equivalence -----------------------------------------------------------
SIXTEEN = ["--set", "steps=16", "--set", "checkpoint_every=8"]


@pytest.fixture(scope="module")
def streaming_in_process(cache: Path, tmp_path_factory) -> Path:
    """The in-process Streaming DiLoCo run of 16 steps (2 replica threads) that the torchrun runs of 2 processes and
    of 2 workers x 2 ranks are compared with; built by the first test that asks, while its torchrun starts."""
    out = tmp_path_factory.mktemp("streaming-in-process") / "in-process"
    _in_process(_train_args(out, cache, "streaming", *SIXTEEN))
    return out


def _reference(request: pytest.FixtureRequest, method: str, out: Path, cache: Path) -> Path:
    """The in-process run of ``method`` (16 steps): streaming's is the module's, run once; dp's is run into ``out``."""
    if method == "streaming":
        return request.getfixturevalue("streaming_in_process")
    _in_process(_train_args(out, cache, method, *SIXTEEN))
    return out


@pytest.mark.parametrize("method", ["streaming", "dp"])
def test_torchrun_train_equals_the_in_process_run_bit_for_bit(
    tmp_path: Path, cache: Path, method: str, request: pytest.FixtureRequest
):
    dist_out = tmp_path / "torchrun"
    proc = _torchrun(_train_args(dist_out, cache, method, *SIXTEEN), tmp_path / "torchrun.log")
    local_out = _reference(request, method, tmp_path / "in-process", cache)  # meanwhile: torchrun's startup
    _finish(proc, tmp_path / "torchrun.log")

    assert _assert_same_replicas(dist_out, local_out) == 16
    got, want = _summary(dist_out), _summary(local_out)
    for key in (
        "final_eval_loss",
        "bytes_sent_per_replica",
        "bytes_received_per_replica",
        "peak_bytes_per_sync",
        "num_params",
        "dropped_contributions",
    ):
        assert got[key] == want[key], key
    assert got["bytes_sent_per_replica"] > 0 and got["dropped_contributions"] == 0
    if method == "streaming":  # the preset's Streaming DiLoCo: P = 3, tau = 1, FP4 on the wire
        cfg = json.loads((dist_out / "config.json").read_text())
        assert (cfg["num_fragments"], cfg["overlap_steps"], cfg["codec"]) == (3, 1, "fp4_e3m0")


# -- 2. a rank killed with SIGKILL ---------------------------------------------
def _children(ppid: int) -> dict[int, str]:
    """pid -> state letter of every process whose parent is ``ppid`` (from /proc/*/stat)."""
    kids = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        state, parent = stat.rsplit(")", 1)[1].split()[:2]  # the command name may hold spaces
        if int(parent) == ppid:
            kids[int(entry)] = state
    return kids


def _rank_of(pid: int) -> int:
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return int(next(v for v in environ if v.startswith(b"RANK=")).split(b"=", 1)[1])


def _wait_for_checkpoint(run: Path, step: int, proc: subprocess.Popen, log: Path, timeout: float = 120) -> int:
    latest = run / "checkpoints" / "latest.json"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"torchrun ended before step {step} was committed:\n{log.read_text()[-3000:]}"
        try:
            committed = json.loads(latest.read_text())["step"]
            if committed >= step:
                return committed
        except (FileNotFoundError, json.JSONDecodeError):
            pass
        time.sleep(0.005)
    raise AssertionError(f"no checkpoint of step {step} after {timeout}s")


def test_a_rank_killed_mid_run_stops_the_survivor_and_resume_ends_bit_identical(tmp_path: Path, cache: Path):
    """SIGKILL rank 1 right after the step-8 checkpoint is committed.

    torchrun's agent SIGTERMs the surviving workers as soon as it notices a dead one (every
    ``--monitor-interval`` s, default 0.1), which would hide the survivor's own error; so this run
    uses a long interval, the test watches the survivor itself, then stops the agent.
    """
    total = 160  # ~2 s of training: ample room to kill rank 1 well before the end
    run_args = ["--set", f"steps={total}", "--set", "checkpoint_every=8", "--timeout", str(TIMEOUT_S)]
    reference, run = tmp_path / "uninterrupted", tmp_path / "killed"
    log = tmp_path / "killed.log"
    proc = _torchrun(_train_args(run, cache, "streaming", *run_args), log, torchrun_opts=("--monitor-interval", "600"))
    try:
        _wait_for_checkpoint(run, 8, proc, log)
        workers = {_rank_of(pid): pid for pid in _children(proc.pid)}
        assert sorted(workers) == [0, 1], workers
        os.kill(workers[1], signal.SIGKILL)
        killed_at = time.monotonic()
        while _children(proc.pid).get(workers[0], "Z") != "Z":  # exited (a zombie until the agent reaps it)
            assert time.monotonic() - killed_at < TIMEOUT_S + 30, "the survivor hangs after its peer died"
            time.sleep(0.05)  # a scan of /proc each time: at 10 ms it cost this process ~3 s of CPU
        stopped_after = time.monotonic() - killed_at
    finally:
        proc.send_signal(signal.SIGTERM)  # the agent stops (any remaining) workers and exits
        proc.wait(timeout=60)
    output = log.read_text()

    # The survivor's own error (torchrun prefixes its lines with [rank0]) names the dead rank and the step.
    error = re.search(r"\[rank0\]: diloco\.comm\.base\.CommError: replica 0 at step (\d+): (.*)", output)
    assert error, output[-3000:]
    assert re.search(r"rank\(s\) \[1\] (never reached it|stopped responding)", error.group(2)), error.group(0)
    assert stopped_after < TIMEOUT_S, f"survivor stopped {stopped_after:.1f}s after the kill (timeout {TIMEOUT_S}s)"

    # The last committed checkpoint is whole: both replicas' files, loadable with weights_only=True.
    meta = ckpt.latest_meta(run)
    assert 8 <= meta["step"] <= int(error.group(1)) < total
    step_dir = run / "checkpoints" / f"step-{meta['step']:08d}"
    assert sorted(p.name for p in step_dir.glob("replica-*.pt")) == ["replica-0.pt", "replica-1.pt"]
    for r in range(2):
        state = torch.load(step_dir / f"replica-{r}.pt", map_location="cpu", weights_only=True)
        assert state["algorithm"]["step"] == meta["step"]

    # Two fresh processes resume and finish; the reference runs meanwhile in this process.
    log2 = tmp_path / "resume.log"
    proc = _torchrun(_train_args(run, cache, "streaming", *run_args, "--resume"), log2)
    _in_process(_train_args(reference, cache, "streaming", *run_args))
    _finish(proc, log2)
    assert _assert_same_replicas(run, reference) == total
    assert _summary(run)["final_eval_loss"] == _summary(reference)["final_eval_loss"]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "loss" in r] == list(range(1, total + 1))  # none lost, none twice


# -- 3. workers of several ranks -----------------------------------------------
def test_two_workers_of_two_ranks_equal_the_in_process_two_replica_run(
    tmp_path: Path, cache: Path, request: pytest.FixtureRequest
):
    """4 processes as 2 workers x 2 ranks (``--set ranks_per_worker=2``) vs 2 in-process replicas.

    Each rank computes the gradient of its half of its worker's batch (the batch the in-process
    replica draws) and the two are averaged: the gradient of the mean loss over the whole batch,
    summed in another FP32 order. The inner optimizer is AdamW, whose m / sqrt(v) can turn a
    1-ulp difference in a near-zero gradient into a visible step, so the runs agree to a
    tolerance, not to the bit: 1e-5 absolute on parameters of order 1 after 16 steps (measured:
    at most 2.4e-7 on the local parameters; FP4 rounding absorbed every difference in the global ones).
    """
    mesh_out = tmp_path / "2x2"
    log = tmp_path / "2x2.log"
    proc = _torchrun(_train_args(mesh_out, cache, "streaming", *SIXTEEN, "--set", "ranks_per_worker=2"), log, nproc=4)
    local_out = _reference(request, "streaming", tmp_path / "in-process", cache)
    _finish(proc, log)

    a, b = ckpt.load_latest(mesh_out), ckpt.load_latest(local_out)
    assert a["step"] == b["step"] == 16 and a["num_replicas"] == 2  # one file per worker, not per process
    assert sorted(p.name for p in (mesh_out / "checkpoints" / "step-00000016").iterdir()) == [
        "replica-0.pt",
        "replica-1.pt",
    ]
    for ra, rb in zip(a["replicas"], b["replicas"], strict=True):
        for k in rb["model"]:
            torch.testing.assert_close(ra["model"][k], rb["model"][k], rtol=0, atol=1e-5, msg=k)
        for ga, gb in zip(ra["algorithm"]["global"], rb["algorithm"]["global"], strict=True):
            torch.testing.assert_close(ga, gb, rtol=0, atol=1e-5)
        _assert_identical(ra["sampler"], rb["sampler"])  # the same batches, in the same order
        _assert_identical(ra["algorithm"]["comm_stats"], rb["algorithm"]["comm_stats"])  # logical bytes per worker
    # not vacuous: the replicas trained apart between syncs, and the sync moved the global parameters
    assert not torch.equal(b["replicas"][0]["model"]["embed.weight"], b["replicas"][1]["model"]["embed.weight"])
    got, want = _summary(mesh_out), _summary(local_out)
    assert got["bytes_sent_per_replica"] == want["bytes_sent_per_replica"] > 0
    assert got["final_eval_loss"] == pytest.approx(want["final_eval_loss"], rel=1e-5)


def test_decoupled_learners_of_two_ranks_equal_one_process_learners(tmp_path: Path, cache: Path):
    """Decoupled DiLoCo with 2 learners of 2 ranks each (4 processes under torchrun, the syncer two shards, each a
    Ray actor owning one fragment, each learner's lead rank its link, the reply broadcast to the other rank)
    against 2 learners as threads of one process and one syncer, synchronous (K = M) so both make the same merges:
    the same parameters to the tolerance the 2 x 2 Streaming test derives (a learner's two half-batch gradients are
    summed in another order)."""
    pytest.importorskip("ray")
    args = ["--set", "steps=16", "--set", "overlap_steps=1", "--set", "num_fragments=2"]
    ranks_out, local_out = tmp_path / "2x2", tmp_path / "threads"
    log = tmp_path / "2x2.log"
    proc = _torchrun(
        _train_args(
            ranks_out,
            cache,
            "decoupled",
            *args,
            "--set",
            "ranks_per_worker=2",
            "--set",
            "decoupled_transport=ray",
            "--set",
            "syncer_shards=2",
        ),
        log,
        nproc=4,
    )
    _in_process(_train_args(local_out, cache, "decoupled", *args))
    _finish(proc, log)

    a, b = ckpt.load_latest(ranks_out), ckpt.load_latest(local_out)
    assert a["step"] == b["step"] == 16 and a["num_replicas"] == 2
    for ra, rb in zip(a["replicas"], b["replicas"], strict=True):
        for k in rb["model"]:
            torch.testing.assert_close(ra["model"][k], rb["model"][k], rtol=0, atol=1e-5, msg=k)
        for ga, gb in zip(ra["algorithm"]["global"], rb["algorithm"]["global"], strict=True):
            torch.testing.assert_close(ga, gb, rtol=0, atol=1e-5)
        assert ra["algorithm"]["versions"] == rb["algorithm"]["versions"] == [2, 2]  # every merge, both fragments
    merges = [
        [json.loads(line) for line in (run / "merges.jsonl").read_text().splitlines()] for run in (ranks_out, local_out)
    ]
    assert sorted((m["fragment"], m["version"], m["learners"]) for m in merges[0]) == sorted(
        (m["fragment"], m["version"], m["learners"]) for m in merges[1]
    )
    assert len(merges[0]) == 4 and all(sorted(m["learners"]) == [0, 1] for m in merges[0])
    got, want = _summary(ranks_out), _summary(local_out)
    assert got["bytes_sent_per_replica"] == want["bytes_sent_per_replica"] > 0
    assert got["final_eval_loss"] == pytest.approx(want["final_eval_loss"], rel=1e-5)
    assert 0 < got["goodput"] <= 1


def _tiny(**kw: Any) -> TrainConfig:
    return TrainConfig.from_dict({**load_preset("tiny")["base"], **kw})


def test_ranks_per_worker_splits_each_replica_batch_and_is_validated(tmp_path: Path):
    cfg = _tiny(replicas=2, ranks_per_worker=2)
    assert (cfg.global_batch, cfg.batch_per_replica, cfg.batch_per_rank) == (8, 4, 2)
    multiple = r"global_batch=8 must be a positive multiple of replicas=2 x ranks_per_worker=3"
    with pytest.raises(ValueError, match=multiple):
        _tiny(replicas=2, ranks_per_worker=3)
    with pytest.raises(ValueError, match=r"ranks_per_worker=0: need at least 1"):
        _tiny(ranks_per_worker=0)
    from diloco.train.trainer import Trainer

    with pytest.raises(ValueError, match=r"ranks_per_worker=2 needs one process per rank: launch 4 processes"):
        Trainer(_tiny(ranks_per_worker=2), tmp_path, cache_dir=tmp_path, progress=False).run()
