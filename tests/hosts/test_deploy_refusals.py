"""A site's printed command refused across hosts (:mod:`_deploy`), before it writes anything: the service on host 0
with packets between host 1 and it dropped (a firewall that drops: a blackhole route on host 0), and
host 2's copy of the command with a wrong token. The loopback versions: test_syncer_service.py. Root only."""

from __future__ import annotations

import shlex
import subprocess
import time

import pytest

pytest.importorskip("ray")

from _deploy import PORT, give_cache, printed_commands, run_site, site_out, start_service, wait

from diloco.decoupled.rpc.probe import PROBE_TIMEOUT_S
from diloco.testing.hosts import Hosts, unavailable

pytestmark = [pytest.mark.hosts, pytest.mark.skipif(unavailable() is not None, reason=str(unavailable()))]

SETS = {"replicas": 2, "sync_every": 4, "num_fragments": 2, "steps": 16, "eval_every": 16, "threads": 1}


def _drop_to(h0, dst: str) -> None:
    """Host 0 silently discards every packet it would send to ``dst`` (a blackhole route: its SYN-ACKs never
    leave, no RST, no ICMP), so from ``dst`` host 0 is a black hole. (This kernel has no tc classifiers or
    iptables to drop on arrival; the route is host 0's own rule all the same, and only for host 1.)"""
    subprocess.run(["ip", "-n", h0.netns, "route", "add", "blackhole", f"{dst}/32"], check=True)


def _seen(procs_texts: dict[str, tuple], began: float, timeout: float = 120.0) -> dict[str, float]:
    """Per name, seconds from ``began`` until its process's output first shows its text (the first try's refusal)."""
    got: dict[str, float] = {}

    def check() -> bool:
        for name, (proc, text) in procs_texts.items():
            if name not in got and any(
                text in p.read_text(errors="replace") for p in (proc.stdout_path, proc.stderr_path)
            ):
                got[name] = time.monotonic() - began
        return len(got) == len(procs_texts)

    wait(f"the refusals {list(procs_texts)}", check, timeout=timeout)
    return got


@pytest.mark.slow  # 46-94 s on 2 cores (load 4-12): Ray on host 0, two sites refused (torchrun tries each 4 times)
@pytest.mark.timeout(300)
def test_a_black_holed_syncer_and_a_wrong_token_are_refused_before_out_is_written(token_cache):
    """Host 1 runs its printed command while host 0 drops its packets: refused with the probe's message (nothing
    answered within 5 s, packets dropped, which port to open), not after a connect that hangs on. Host 2 runs its
    printed command with another token: refused saying the token is wrong. Neither site's --out is ever created
    (torchrun tries each job 1 + --max-restarts 3 times: every try is refused the same way), and both exit non-zero.
    The service itself never saw a learner."""
    with Hosts(3) as (h0, h1, h2):
        service = start_service(h0, token_cache, SETS)
        lines, service = printed_commands(h0, service, token_cache=token_cache, sets=SETS)
        for h in (h1, h2):
            give_cache(h, token_cache)
        _drop_to(h0, h1.address)
        token = shlex.split(lines[1])[0]
        assert token.startswith("DILOCO_SYNCER_TOKEN=")
        wrong = lines[1].replace(token, "DILOCO_SYNCER_TOKEN=not-the-token", 1)
        began = time.monotonic()
        dropped, refused = run_site(h1, lines[0], "black-holed"), run_site(h2, wrong, "wrong-token")
        message = f"nothing answered at {h0.address}:{PORT} within {PROBE_TIMEOUT_S:g} s"
        seconds = _seen({"black_hole": (dropped, message), "wrong_token": (refused, "wrong token")}, began)
        for p in (dropped, refused):
            assert p.wait(timeout=200) != 0
        seconds["both_done"] = time.monotonic() - began
        out = dropped.stdout_path.read_text() + dropped.stderr_path.read_text()
        assert "packets are dropped" in out and f"open TCP port {PORT}" in out
        out = refused.stdout_path.read_text() + refused.stderr_path.read_text()
        assert "refused a call with a wrong token" in out
        assert not h1.path(site_out(lines[0])).exists() and not h2.path(site_out(lines[1])).exists()
        assert service.poll() is None and "learners live [0" not in service.stdout_path.read_text()
        assert "learners live [1" not in service.stdout_path.read_text()
    print(f"refusals across hosts: {seconds}")
