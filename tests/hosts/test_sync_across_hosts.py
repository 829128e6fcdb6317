"""Synchronous Streaming DiLoCo across two emulated hosts, each with its own ``--out`` (no shared file system).

Each host (:mod:`diloco.testing.hosts`: own address, hostname, ``/etc/hosts``, ``/tmp`` and PID namespace) runs the
README's multi-node command, ``torchrun --nnodes 2 --nproc-per-node 1 --rdzv-backend c10d --rdzv-endpoint
host0:29400 --rdzv-id run1 -m diloco train ... --out /tmp/run``, its ``/tmp`` its own (the token cache copied
in, as a machine would hold its data). The reference is the same config in one process on this machine (two
replica threads), which ``tests/distributed/test_train_torchrun.py`` shows equal to a one-host torchrun job bit for
bit: both hosts' checkpoints (every replica's model, inner optimizer, algorithm, sampler) and the final eval loss
must equal it bit for bit. Every run pads its steps to ``step_time`` (a sleep, no change to what is computed) so
that a kill lands mid-run on a machine of any speed.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from diloco.cli import main as cli_main
from diloco.testing.hosts import Host, Hosts, unavailable
from diloco.train import checkpoint as ckpt

pytestmark = [
    pytest.mark.hosts,
    pytest.mark.skipif(unavailable() is not None, reason=str(unavailable())),
    pytest.mark.timeout(300),
]

SRC = str(Path(__file__).resolve().parents[2] / "src")
RDZV = ["--rdzv-backend", "c10d", "--rdzv-endpoint", "host0:29400", "--rdzv-id", "run1"]
# tiny preset, Streaming DiLoCo (P = 3, tau = 1, FP4); one intra-op thread as in the reference
COMMON = ["--preset", "tiny", "--method", "streaming", "--set", "threads=1", "--no-progress", "--set", "step_time=0.2"]


def _torchrun(*train_args: str, torchrun_opts: tuple[str, ...] = ()) -> list[str]:
    """The README's two-machine command (this checkout's diloco), every host the same."""
    head = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1", *RDZV]
    return [*head, *torchrun_opts, "-m", "diloco", "train", *COMMON, *train_args]


def _env(**extra: str) -> dict[str, str]:
    drop = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "GLOO_SOCKET_IFNAME", "PYTHONPATH")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    # a restarted round's workers get a store of their own (docs/guides/elastic.md, "The joining node")
    return {**env, "PYTHONPATH": SRC, "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1", **extra}


def _host_args(*extra: str) -> list[str]:
    return ["--out", "/tmp/run", "--cache-dir", "/tmp/cache", *extra]


def _start(hosts: list[Host], cmd: list[str], cache: Path, **env: str) -> list:
    for h in hosts:
        if not h.path("/tmp/cache").exists():
            shutil.copytree(cache, h.path("/tmp/cache"))
    return [h.run(cmd, env=_env(**env), cwd="/") for h in hosts]


def _log(proc) -> str:
    return proc.stdout_path.read_text()[-2000:] + proc.stderr_path.read_text()[-4000:]


def _finish(procs: list, timeout: float = 200) -> None:
    deadline = time.monotonic() + timeout
    for p in procs:
        try:
            rc = p.wait(timeout=max(1.0, deadline - time.monotonic()))
        except Exception:
            raise AssertionError(f"still running after {timeout}s:\n{_log(p)}") from None
        assert rc == 0, f"exited with {rc}:\n{_log(p)}"


@contextlib.contextmanager
def _single_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _reference(out: Path, cache: Path, *extra: str) -> Path:
    with _single_thread():
        assert cli_main(["train", *COMMON, "--out", str(out), "--cache-dir", str(cache), *extra]) == 0
    return out


def _same(a: Any, b: Any, where: str = "") -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), where
        for k in a:
            _same(a[k], b[k], f"{where}/{k}")
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def _assert_equal_to_reference(hosts: list[Host], reference: Path, steps: int) -> None:
    """Each host's folder holds its own replica's file only; both equal the reference's bit for bit, and so does
    the final eval loss (the lead's summary)."""
    for r, h in enumerate(hosts):
        run = h.path("/tmp/run")
        meta = ckpt.latest_meta(run)
        assert meta["step"] == steps and meta["folder_replicas"] == [r], meta
        step_dir = ckpt.step_dir(run, steps)
        assert sorted(p.name for p in step_dir.iterdir()) == [f"replica-{r}.pt"]
        mine = ckpt.load_replica(run, r, steps)
        want = ckpt.load_replica(reference, r, steps)
        for part in ("model", "optimizer", "algorithm", "sampler"):
            _same(mine[part], want[part], f"replica {r} {part}")
    got = json.loads(hosts[0].path("/tmp/run/summary.json").read_text())
    want = json.loads((reference / "summary.json").read_text())
    assert got["final_eval_loss"] == want["final_eval_loss"]
    assert got["bytes_sent_per_replica"] == want["bytes_sent_per_replica"] > 0
    assert not hosts[1].path("/tmp/run/summary.json").exists()  # the lead's


def _wait_committed(host: Host, step: int, procs: list, timeout: float = 200) -> int:
    latest = host.path("/tmp/run/checkpoints/latest.json")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for p in procs:
            assert p.poll() is None, f"ended before step {step} was committed:\n{_log(p)}"
        with contextlib.suppress(FileNotFoundError, json.JSONDecodeError):
            if (committed := json.loads(latest.read_text())["step"]) >= step:
                return committed
        time.sleep(0.02)
    raise AssertionError(f"{host.name}: no checkpoint of step {step} after {timeout}s")


@pytest.mark.slow  # two torchrun jobs on two hosts (~25 s on an idle 2-core machine, torch imported 4 times)
def test_two_hosts_each_with_its_own_out_equal_the_one_host_run_bit_for_bit(tmp_path: Path, token_cache: Path):
    args = ["--set", "steps=16", "--set", "checkpoint_every=8"]
    with Hosts(2) as hosts:
        procs = _start(hosts, _torchrun(*_host_args(*args)), token_cache)
        reference = _reference(tmp_path / "reference", token_cache, *args)  # meanwhile
        _finish(procs)
        _assert_equal_to_reference(hosts, reference, 16)
        # `diloco export` of either machine's folder: the reference's global parameters, byte for byte
        exported = []
        for name, run in (("ref", reference), *((h.name, h.path("/tmp/run")) for h in hosts)):
            with _single_thread():
                assert cli_main(["export", str(run), "--out", str(tmp_path / f"export-{name}")]) == 0
            exported.append((tmp_path / f"export-{name}" / "model.safetensors").read_bytes())
        assert exported[1] == exported[0] and exported[2] == exported[0]


@pytest.mark.slow  # three torchrun agents, a restart of host 0's worker, the rendezvous waiting for host 1 (~40 s)
def test_a_host_killed_whole_resumes_from_its_own_folder_and_ends_bit_for_bit_the_same(
    tmp_path: Path, token_cache: Path
):
    """Both hosts run the command with ``--resume auto`` (as a job that is restarted runs) under ``torchrun
    --max-restarts 3``. Host 1 is killed whole (every process of its PID namespace) once it has committed step 8;
    host 0's agent restarts its worker (stopped on the lost peer, or on host 1's command waiting in the rendezvous,
    whichever comes first), which waits in the rendezvous until host 1's command runs again; both resume from step
    8, each from its own folder. The agents log at INFO (``LOGLEVEL``) so that the restart is seen."""
    args = ["--set", "steps=24", "--set", "checkpoint_every=8", "--timeout", "30", "--resume", "auto"]
    opts = ("--max-restarts", "3")
    with Hosts(2) as hosts:
        cmd = _torchrun(*_host_args(*args), torchrun_opts=opts)
        procs = _start(hosts, cmd, token_cache, LOGLEVEL="INFO")
        _wait_committed(hosts[1], 8, procs)
        hosts[1].kill()
        killed_meta = ckpt.latest_meta(hosts[1].path("/tmp/run"))
        assert 8 <= killed_meta["step"] < 24  # mid-run
        again = hosts[1].run(cmd, env=_env(LOGLEVEL="INFO"), cwd="/", name="again")
        reference = _reference(tmp_path / "reference", token_cache, *args[:-2])  # meanwhile
        _finish([procs[0], again])
        _assert_equal_to_reference(hosts, reference, 24)
        # host 0's agent restarted its worker: on the lost peer (the worker's CommError) or, when host 1's command
        # joined first, on the new node waiting in the rendezvous; which comes first is a race (CI saw the second)
        assert "will restart worker group" in procs[0].stderr_path.read_text()
        rows = [json.loads(line) for line in hosts[0].path("/tmp/run/metrics.jsonl").read_text().splitlines()]
        assert [r["step"] for r in rows if "loss" in r] == list(range(1, 25))  # none lost, none twice


@pytest.mark.slow  # four torchrun agents, two of which wait out the store's read timeout (~35 s)
def test_an_endpoint_address_the_hostname_does_not_resolve_to_needs_is_host(token_cache: Path):
    """torchrun's c10d agent hosts the rendezvous store only where the endpoint matches the machine's hostname or
    an address that hostname resolves to. Host 0 gets a second address, 10.231.0.101, and the endpoint names it:
    no agent hosts the store and both stop with RendezvousConnectionError; with ``--rdzv-conf is_host=1`` on host 0
    (``is_host=0`` on host 1) the same command trains (docs/guides/distributed.md, "The rendezvous host")."""
    import subprocess

    with Hosts(2) as hosts:
        subprocess.run(["ip", "-n", hosts[0].netns, "addr", "add", "10.231.0.101/24", "dev", "eth0"], check=True)
        for is_host in (None, True):
            procs = []
            for i, h in enumerate(hosts):
                conf = "read_timeout=5" + ("" if is_host is None else f",is_host={int(i == 0)}")
                cmd = _torchrun(
                    *_host_args("--set", "steps=2", "--set", "step_time=0", "--overwrite"),
                    torchrun_opts=("--rdzv-conf", conf),
                )
                cmd[cmd.index("host0:29400")] = "10.231.0.101:29400"
                procs += _start([h], cmd, token_cache)
            if is_host is None:
                for p in procs:
                    assert p.wait(timeout=200) != 0
                    assert "RendezvousConnectionError" in p.stderr_path.read_text(), _log(p)
            else:
                _finish(procs)
                assert json.loads(hosts[0].path("/tmp/run/summary.json").read_text())["steps"] == 2
