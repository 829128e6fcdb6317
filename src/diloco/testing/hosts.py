"""Emulated hosts on this machine, for tests and benchmarks: each with its own address, hostname, ``/tmp`` and processes.

How it works (root and iproute2 / util-linux's ``unshare`` and ``nsenter`` needed; :func:`unavailable` says why not)::

    with Hosts(2, rate_mbit=100) as (h0, h1):       # names "host0", "host1"; addresses 10.231.0.1, 10.231.0.2
        server = h0.run(["python", "-m", "http.server", "8000"])
        h1.run(["curl", "http://host0:8000/"]).wait()
        h1.kill()                                    # every process of host1 at once (a crashed machine)
        h0.partition(); h0.heal()                    # its link down, then up again

* **Network**: a namespace per host (``ip netns add``), and one more holding a bridge; each host's veth pair
  joins its namespace to that bridge. Addresses come from 10.231.0.0/24 and exist only inside these
  namespaces (two harnesses at once each have their own bridge namespace, so the same addresses never meet).
  Loopback is up in every host. ``rate_mbit`` shapes both ends of each host's veth with one HTB class
  (its upload and its download). :meth:`Host.partition` takes the bridge's end of the host's veth down:
  its packets are dropped, as across a cut link; :meth:`Host.heal` brings it back.
* **The host itself**: a first process, ``ip netns exec NS unshare --mount --uts --pid --fork --mount-proc``,
  whose forked child is pid 1 of the host's PID namespace. It sets the hostname, bind-mounts a hosts file
  listing every host over ``/etc/hosts`` and the host's own folder over ``/tmp`` (its disk: it survives
  :meth:`Host.kill`, as a crashed machine's disk does), then sleeps. :meth:`Host.run` enters its namespaces
  with ``nsenter`` (stdout and stderr to files), so everything a host runs is in that PID namespace;
  :meth:`Host.kill` SIGKILLs its pid 1 (found by its host-side pid), and the kernel kills every other process
  of the namespace with it. The next :meth:`Host.run` boots the host again (new processes, same address and
  ``/tmp``).
* **Cleanup**: leaving the ``with`` block (an exception included) kills every host, deletes the namespaces
  (the veths and the bridge go with them) and the hosts' folders. The mounts live only in the hosts' mount
  namespaces, which end with their processes. Every harness has names of its own (``dh`` + 6 random hex digits),
  so two test sessions never collide. If the process holding the harness is SIGKILLed, the hosts' processes die
  with it (their first process has PR_SET_PDEATHSIG, and ``--kill-child``); only its namespaces stay behind
  (``ip netns list``: ``dh…``; ``ip netns del`` each).
"""

from __future__ import annotations

import ctypes
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

SUBNET = "10.231.0"  # .1, .2, ... : the hosts' addresses, only inside this harness's namespaces
_TOOLS = ("ip", "unshare", "nsenter", "mount", "tc")


class HostsUnavailable(RuntimeError):
    """The harness cannot run here; the message says why (tests skip with it)."""


def unavailable() -> str | None:
    """Why emulated hosts cannot be made on this machine (not root, a tool missing), or None."""
    if os.name != "posix" or not hasattr(os, "geteuid"):
        return "emulated hosts need Linux namespaces"
    if os.geteuid() != 0:
        return "emulated hosts need root (network, mount and PID namespaces)"
    missing = [t for t in _TOOLS if shutil.which(t) is None]
    if missing:
        return f"emulated hosts need {', '.join(missing)} (apt-get install -y iproute2 util-linux)"
    return None


def _kept_from_outer_tmp() -> list[Path]:
    """The folders of this machine's /tmp that every host keeps seeing under its own /tmp: the one holding this
    Python (a virtualenv) and the one holding this package (a checkout), where they lie under /tmp."""
    kept = []
    for p in (Path(sys.executable).absolute(), Path(__file__).resolve()):
        if Path("/tmp") in p.parents and len(p.parts) > 3:
            kept.append(Path(*p.parts[:3]))  # /tmp/<first folder>
    return sorted(set(kept))


def _sh(*cmd: str) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise HostsUnavailable(f"`{' '.join(cmd)}` failed: {done.stderr.strip()}")


def _die_with_parent() -> None:  # in the child, before exec: SIGKILL when the harness's thread ends
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").glob("*/children"):
        out += [int(p) for p in task.read_text().split()]
    return out


class Host:
    """One emulated host; made by :class:`Hosts`."""

    def __init__(self, hosts: Hosts, index: int) -> None:
        self.index = index
        self.name = f"host{index}"
        self.address = f"{SUBNET}.{index + 1}"
        self.netns = f"{hosts.tag}-{index}"
        self.veth = f"{hosts.tag}h{index}"  # this end in the host, named eth0 there
        self.bridge_port = f"{hosts.tag}b{index}"  # the other end, on the bridge
        self.tmp = hosts.root / self.name / "tmp"  # the host's /tmp, seen from outside
        self.logs = hosts.root / self.name / "logs"
        self._hosts = hosts
        self._init: subprocess.Popen | None = None  # `unshare --fork`, whose child is the host's pid 1
        self._pid1: int | None = None  # that child's pid here (outside the namespace)
        self._runs = 0
        self._procs: list[subprocess.Popen] = []

    # -- processes -----------------------------------------------------------------------------------------------
    def boot(self) -> None:
        """Start the host's first process (``run`` does it when the host is down)."""
        self.tmp.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(parents=True, exist_ok=True)
        # a checkout or virtualenv under this machine's /tmp stays visible in the host: bound into the host's
        # own /tmp first, then that folder (with what is bound inside it: --rbind) mounted over /tmp
        keep = "".join(
            f"mkdir -p {self.tmp / k.name} && mount --bind {k} {self.tmp / k.name} && " for k in _kept_from_outer_tmp()
        )
        script = (
            f"hostname {self.name} && mount --bind {self._hosts.hosts_file} /etc/hosts && {keep}"
            f"mount --rbind {self.tmp} /tmp && echo up && exec sleep infinity"
        )
        cmd = ["ip", "netns", "exec", self.netns, "unshare", "--mount", "--uts", "--pid", "--fork", "--mount-proc"]
        cmd += ["--kill-child", "sh", "-c", script]
        init = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=_die_with_parent)
        assert init.stdout is not None
        line = init.stdout.readline()
        if line.strip() != b"up":
            init.kill()
            raise HostsUnavailable(f"{self.name} did not start: {init.communicate()[1].decode().strip()}")
        init.stdout.close()
        deadline = time.monotonic() + 5
        while not (children := _children(init.pid)) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(children) == 1, f"unshare --fork has children {children}"
        self._init, self._pid1 = init, children[0]

    @property
    def up(self) -> bool:
        return self._init is not None and self._init.poll() is None

    def run(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | Path | None = None,
        name: str | None = None,
    ) -> subprocess.Popen:
        """Start ``argv`` in the host (booting it if it is down); stdout and stderr go to ``logs/NAME.out|.err``
        (``handle.stdout_path`` / ``handle.stderr_path``). ``cwd`` is a path as the host sees it."""
        if not self.up:
            self.boot()
        self._runs += 1
        name = name or f"run{self._runs}"
        out, err = self.logs / f"{name}.out", self.logs / f"{name}.err"
        cmd = ["nsenter", "--target", str(self._pid1), "--net", "--mount", "--uts", "--pid", "--wd=/"]
        # the working directory is entered inside the host (nsenter's --wd opens its path before it enters the
        # host's mount namespace: a relative path would then land in this machine's /tmp, not the host's)
        argv = ["sh", "-c", 'cd "$0" && exec "$@"', str(cwd), *argv] if cwd is not None else list(argv)
        with open(out, "wb") as fo, open(err, "wb") as fe:
            proc = subprocess.Popen([*cmd, "--", *argv], stdout=fo, stderr=fe, env=None if env is None else dict(env))
        proc.stdout_path, proc.stderr_path = out, err  # type: ignore[attr-defined]
        self._procs.append(proc)
        return proc

    def kill(self) -> None:
        """SIGKILL the host's pid 1: the kernel kills every process of the host with it. Its /tmp stays."""
        if self._init is None:
            return
        if self._init.poll() is None and self._pid1 is not None:
            try:
                os.kill(self._pid1, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self._init.wait()
        for proc in self._procs:  # nsenter ends when its child is killed
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._procs.clear()
        self._init = self._pid1 = None

    def pids(self) -> list[int]:
        """The host-side pids of every process in the host (its pid 1 included)."""
        if self._pid1 is None:
            return []
        ns = os.readlink(f"/proc/{self._pid1}/ns/pid")
        out = []
        for d in Path("/proc").iterdir():
            if d.name.isdigit():
                try:
                    if os.readlink(d / "ns/pid") == ns:
                        out.append(int(d.name))
                except OSError:
                    continue
        return out

    # -- the link --------------------------------------------------------------------------------------------------
    def partition(self) -> None:
        """Take the host's link down (the bridge's end): its packets are dropped until :meth:`heal`."""
        _sh("ip", "-n", self._hosts.bridge_ns, "link", "set", self.bridge_port, "down")

    def heal(self) -> None:
        _sh("ip", "-n", self._hosts.bridge_ns, "link", "set", self.bridge_port, "up")

    def _shape(self, mbit: float) -> None:
        rate = f"{int(mbit * 1e6)}bit"
        burst = str(max(16 * 1024, int(mbit * 1e6 / 8 / 100)))  # ~10 ms of traffic
        for ns, dev in ((self.netns, "eth0"), (self._hosts.bridge_ns, self.bridge_port)):
            _sh("ip", "-n", ns, "link", "set", dev, "txqueuelen", "1000")
            tc = ["ip", "netns", "exec", ns, "tc"]
            _sh(*tc, "qdisc", "replace", "dev", dev, "root", "handle", "1:", "htb", "default", "1")
            htb = ["htb", "rate", rate, "ceil", rate, "burst", burst, "cburst", burst]
            _sh(*tc, "class", "add", "dev", dev, "parent", "1:", "classid", "1:1", *htb)

    def path(self, inside: str | Path) -> Path:
        """Where a path under the host's ``/tmp`` lies, seen from outside the host."""
        rel = Path(inside).relative_to("/tmp")
        return self.tmp / rel


class Hosts:
    """``n`` emulated hosts, for a ``with`` block (it yields the list of :class:`Host`); see the module docstring.

    ``rate_mbit``: each host's link rate each way (HTB), or None for an unshaped veth.
    """

    def __init__(self, n: int, *, rate_mbit: float | None = None) -> None:
        if not 1 <= n <= 200:
            raise ValueError(f"n={n}: between 1 and 200 hosts (one /24 of addresses)")
        self.n, self.rate_mbit = n, rate_mbit
        self.tag = f"dh{secrets.token_hex(3)}"
        self.bridge_ns = f"{self.tag}-br"
        self.root = Path(tempfile.mkdtemp(prefix=f"{self.tag}-"))
        self.hosts_file = self.root / "hosts"
        self.hosts = [Host(self, i) for i in range(n)]
        self._made: list[str] = []

    def __enter__(self) -> list[Host]:
        reason = unavailable()
        if reason is not None:
            shutil.rmtree(self.root, ignore_errors=True)
            raise HostsUnavailable(reason)
        try:
            self._make()
        except BaseException:
            self.close()
            raise
        return self.hosts

    def _make(self) -> None:
        lines = ["127.0.0.1 localhost", *(f"{h.address} {h.name}" for h in self.hosts)]
        self.hosts_file.write_text("\n".join(lines) + "\n")
        _sh("ip", "netns", "add", self.bridge_ns)
        self._made.append(self.bridge_ns)
        _sh("ip", "-n", self.bridge_ns, "link", "add", "br0", "type", "bridge")
        _sh("ip", "-n", self.bridge_ns, "link", "set", "br0", "up")
        for h in self.hosts:
            _sh("ip", "netns", "add", h.netns)
            self._made.append(h.netns)
            # both ends are made in the bridge's namespace (never in this machine's own), then one moves
            _sh("ip", "-n", self.bridge_ns, "link", "add", h.veth, "type", "veth", "peer", "name", h.bridge_port)
            _sh("ip", "-n", self.bridge_ns, "link", "set", h.veth, "netns", h.netns)
            _sh("ip", "-n", h.netns, "link", "set", h.veth, "name", "eth0")
            _sh("ip", "-n", self.bridge_ns, "link", "set", h.bridge_port, "master", "br0")
            _sh("ip", "-n", self.bridge_ns, "link", "set", h.bridge_port, "up")
            _sh("ip", "-n", h.netns, "addr", "add", f"{h.address}/24", "dev", "eth0")
            _sh("ip", "-n", h.netns, "link", "set", "eth0", "up")
            _sh("ip", "-n", h.netns, "link", "set", "lo", "up")
            if self.rate_mbit is not None:
                h._shape(self.rate_mbit)

    def close(self) -> None:
        """Kill every host, delete the namespaces (their veths and the bridge with them) and the hosts' folders."""
        for h in self.hosts:
            try:
                h.kill()
            except Exception:
                pass
        for ns in reversed(self._made):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        self._made.clear()
        shutil.rmtree(self.root, ignore_errors=True)

    def __exit__(self, *exc: object) -> None:
        self.close()


def namespaces() -> list[str]:
    """The names of this machine's network namespaces (``ip netns list``)."""
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


__all__ = ["SUBNET", "Host", "Hosts", "HostsUnavailable", "namespaces", "unavailable"]
