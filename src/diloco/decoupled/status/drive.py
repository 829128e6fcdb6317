"""A real run to watch: the syncer service (``python -m diloco syncer`` with its status page) and one torchrun job
per site, each a process of this machine on loopback. What ``benchmarks/status_page.py`` runs (the page's test runs
the service and its sites on emulated hosts: tests/hosts/test_deploy_host_kill.py).

::

    with WatchedRun(out=Path("runs/watch"), preset="tiny", sets={...}, cache_dir=..., sites=2) as run:
        run.wait_status()                           # the page is up: run.url, run.token
        text = run.get("/metrics")                  # with the token
        run.wait()                                  # the service ends once every learner finished

A site job runs ``diloco train --method decoupled ... --set learner=m --set syncer=NAME@ADDRESS --resume auto``
(one rank).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from diloco.decoupled.rpc import TOKEN_ENV
from diloco.distributed.launch import child_environment, torchrun_command
from diloco.errors import ConfigError


class WatchedRun:
    """The service and its sites (module docstring). ``out`` must be new."""

    def __init__(
        self,
        *,
        out: Path,
        preset: str,
        sets: dict[str, Any],
        cache_dir: Path,
        sites: int,
        status_eval_s: float = 5.0,
        extra_args: tuple[str, ...] = (),
    ) -> None:
        self.out = Path(out)
        if self.out.exists() and any(self.out.iterdir()):
            raise ConfigError(f"out={out} is not empty: give a new folder")
        self.out.mkdir(parents=True, exist_ok=True)
        items = [x for k, v in sets.items() for x in ("--set", f"{k}={v}")]
        self.common = ["--preset", preset, *items, "--cache-dir", str(cache_dir)]
        self.sites, self.status_eval_s, self.extra_args = sites, status_eval_s, extra_args
        self.procs: dict[str, subprocess.Popen] = {}
        self._logs: list[Any] = []
        self.info: dict[str, Any] = {}
        self.token = ""
        self.url = ""

    def _start(self, key: str, args: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
        log = open(self.out / f"{key}.log", "ab")
        self._logs.append(log)
        proc = subprocess.Popen(
            args, env=child_environment(**(env or {})), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        self.procs[key] = proc
        return proc

    def __enter__(self) -> WatchedRun:
        args = [
            sys.executable,
            "-m",
            "diloco",
            "syncer",
            *self.common,
            "--out",
            str(self.out / "syncer"),
            "--poll",
            "1",
        ]
        args += ["--port", "0", "--host", "127.0.0.1", "--advertise", "127.0.0.1"]  # loopback, any free port
        args += ["--status-host", "127.0.0.1", "--status-eval", str(self.status_eval_s), *self.extra_args]
        try:
            self._start("syncer", args)
            info_path = self.out / "syncer" / "syncer.json"
            self._wait("the syncer's syncer.json", info_path.is_file, timeout=300)
            self.info = json.loads(info_path.read_text())
            for m in range(self.sites):
                self.start_site(m)
        except BaseException:  # (an interrupt too): nothing this run started is left behind
            self.close()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def start_site(self, m: int) -> None:
        """Start (or start again) site ``m``'s job."""
        auth = {TOKEN_ENV: self.info["token"]}  # the run's token, as the printed site command sets it
        args = ["train", "--method", "decoupled", *self.common, "--no-progress"]
        args += ["--set", f"learner={m}", "--set", f"syncer={self.info['syncer']}"]
        args += ["--out", str(self.out / f"site-{m}"), "--resume", "auto"]
        self._start(f"site-{m}", torchrun_command(nproc=1, args=args), auth)

    def wait_status(self, timeout: float = 300) -> None:
        """Until the page is served (its token written): sets ``url`` and ``token``."""
        token_file = self.out / "syncer" / "status-token"
        self._wait("the status page", token_file.is_file, timeout=timeout)
        self.token = token_file.read_text().strip()
        self.url = f"http://127.0.0.1:{self.info['status_port']}"

    def get(self, path: str, *, token: str | None = None, bearer: bool = False) -> tuple[int, str]:
        """``(status, body)`` of ``path`` on the page's server, with the run's token (``token=""``: none)."""
        token = self.token if token is None else token
        url = self.url + path
        headers = {}
        if token and bearer:
            headers["Authorization"] = f"Bearer {token}"
        elif token:
            url += ("&" if "?" in url else "?") + f"token={token}"
        try:
            with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=30) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    def snapshot(self) -> dict[str, Any]:
        status, body = self.get("/status.json")
        assert status == 200, (status, body)
        return json.loads(body)

    def _wait(self, what: str, check: Any, *, timeout: float) -> Any:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            got = check()
            if got:
                return got
            for key, p in self.procs.items():
                if p.poll() not in (None, 0, -signal.SIGKILL):
                    raise RuntimeError(f"{key} exited with {p.returncode} while waiting for {what}\n{self.tails()}")
            time.sleep(0.2)
        raise TimeoutError(f"timed out after {timeout:g} s waiting for {what}\n{self.tails()}")

    def wait_for(self, what: str, check: Any, *, timeout: float = 120) -> Any:
        return self._wait(what, check, timeout=timeout)

    def wait(self, timeout: float = 600) -> None:
        """Until the service and every site's job exited (each with 0)."""
        end = time.monotonic() + timeout
        for key, p in self.procs.items():
            if p.returncode == -signal.SIGKILL:
                continue
            p.wait(timeout=max(1.0, end - time.monotonic()))
            if p.returncode != 0:
                raise RuntimeError(f"{key} exited with {p.returncode}\n{self.tails()}")

    def tails(self) -> str:
        return "\n".join(
            f"--- {p.name}\n" + p.read_text(errors="replace")[-1500:] for p in sorted(self.out.glob("*.log"))
        )

    def close(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        for log in self._logs:
            log.close()


__all__ = ["WatchedRun"]
