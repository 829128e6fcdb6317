"""A Decoupled DiLoCo run deployed across emulated hosts (:mod:`diloco.testing.hosts`), as a team deploys it: the
service (``diloco syncer --host 0.0.0.0 --advertise HOST0 --port 7171 --out /tmp/svc``) on host 0, and on each site
host the command the service printed, copied from its output as a user copies it and run there as it is (in a shell,
from the host's /tmp, so each site's ``--out`` is that host's own). Each host has its own token cache in its own /tmp
(``DILOCO_CACHE``, a copy of the session's: a site machine's cache), and this Python's ``torchrun`` first on its PATH.
"""

from __future__ import annotations

import json
import shlex
import shutil
import sys
from pathlib import Path
from typing import Any

from diloco.decoupled.chaos_logs import read_learner_log
from diloco.testing.deploy_env import host_env
from diloco.testing.hosts import Host
from diloco.testing.waiting import wait

PORT = 7171
SERVICE_OUT = "/tmp/svc"  # on host 0
rows = read_learner_log  # whole rows of a JSONL file another process appends to


def give_cache(host: Host, token_cache: Path) -> None:
    """The host's own copy of the session's tokenizer and tokens (its /tmp/cache)."""
    host.tmp.mkdir(parents=True, exist_ok=True)
    shutil.copytree(token_cache, host.path("/tmp/cache"), dirs_exist_ok=True)


def sets_args(sets: dict[str, Any]) -> list[str]:
    return [x for k, v in sets.items() for x in ("--set", f"{k}={v}")]


def start_service(
    h0: Host, token_cache: Path, sets: dict[str, Any], name: str = "service", extra: tuple[str, ...] = ()
):
    """``diloco syncer`` on host 0, serving every address of it on :data:`PORT` and advertising host 0's address (its
    status page too, on a free port: syncer.json's ``status_port``); ``extra``: more of its options."""
    give_cache(h0, token_cache)
    argv = [sys.executable, "-m", "diloco", "syncer", "--preset", "tiny", *sets_args(sets), "--poll", "1", *extra]
    argv += ["--host", "0.0.0.0", "--advertise", h0.address, "--port", str(PORT), "--out", SERVICE_OUT]
    return h0.run(argv, env=host_env(), name=name)  # (absolute paths only: see run_site)


def printed_commands(
    h0: Host,
    service,
    *,
    timeout: float = 240.0,
    token_cache: Path | None = None,
    sets=None,
    extra: tuple[str, ...] = (),
):
    """The learner commands as the service printed them (the indented lines after its "learner commands" line),
    checked against its --out's syncer.json; and the service (started again, once, where Ray's own startup timed
    out on an overloaded machine: its fixed 30 s for the raylet to register, before the service writes anything)."""

    def lines() -> list[str] | None:
        text = service.stdout_path.read_text(errors="replace").splitlines()
        at = next((i for i, line in enumerate(text) if line.startswith("learner commands, one per site")), None)
        if at is None:
            return None
        got = [line.strip() for line in text[at + 1 :] if line.startswith("  ")]
        return got if got and "--resume auto" in got[-1] else None

    try:
        got = wait("the service's printed learner commands", lines, timeout=timeout, procs=[service], every=0.3)
    except AssertionError as exc:
        if sets is None or "timed out during startup" not in str(exc) and "gcs_server_port" not in str(exc):
            raise
        service = start_service(h0, token_cache, sets, name="service-again", extra=extra)
        got = wait("the service's printed learner commands", lines, timeout=timeout, procs=[service], every=0.3)
    info = json.loads(h0.path(f"{SERVICE_OUT}/syncer.json").read_text())
    assert got == info["learners"], (got, info["learners"])
    return got, service


def fsdp_site(line: str, ranks: int = 2) -> str:
    """The printed command for a site of ``ranks`` ranks sharding one model (FSDP): ``--nproc-per-node`` set and
    ``--set ranks_per_worker=R --set worker_sharding=fsdp`` added, the two edits a site's own hardware asks for."""
    words = shlex.split(line)
    words[words.index("--nproc-per-node") + 1] = str(ranks)
    words += ["--set", f"ranks_per_worker={ranks}", "--set", "worker_sharding=fsdp"]
    return shlex.join(words)


def run_site(host: Host, line: str, name: str):
    """The site's command, in a shell on ``host`` from its /tmp (as pasted into a terminal there)."""
    # (`cd` in the host's shell, not Host.run's cwd: nsenter opens its --wd before entering the host's mount
    # namespace, so a relative --out would land in this machine's /tmp, not the host's)
    return host.run(["sh", "-c", f"cd /tmp && {line}"], env=host_env(), name=name)


def site_out(line: str) -> str:
    """The site's --out, as the host sees it (relative to /tmp, where it runs)."""
    words = shlex.split(line)
    return str(Path("/tmp") / words[words.index("--out") + 1])


def learner_log(host: Host, line: str, m: int) -> Path:
    return host.path(site_out(line)) / f"learner-{m}.jsonl"


def ray_processes(host: Host) -> list[str]:
    """The command lines of the host's processes that are Ray's (a raylet, a GCS server, a Ray worker)."""
    found = []
    for pid in host.pids():
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if any(word in cmd for word in ("raylet", "gcs_server", "ray::", "default_worker.py")):
            found.append(cmd[:200])
    return found


def records(h0: Host) -> list[dict]:
    """The syncer's merge records so far (its checkpoint folder's log, appended to as it merges)."""
    return rows(h0.path(f"{SERVICE_OUT}/syncer/records.jsonl"))


def weighted_after(merges: list[dict], m: int, t: float) -> list[float]:
    """The wall times of merges after ``t`` where learner ``m`` had a weight > 0."""
    return [r["at"] for r in merges if r["at"] > t and m in r["learners"] and r["weights"][r["learners"].index(m)] > 0]


def host_pid(host: Host, pid_inside: int) -> int:
    """The pid, seen from here, of the process whose pid inside ``host`` is ``pid_inside`` (a learner logs its own)."""
    for pid in host.pids():
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        nspid = next((line.split()[1:] for line in status.splitlines() if line.startswith("NSpid:")), [])
        if nspid and int(nspid[-1]) == pid_inside:
            return pid
    raise LookupError(f"no process {pid_inside} in {host.name}")
