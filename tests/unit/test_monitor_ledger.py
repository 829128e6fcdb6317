"""What a ``diloco syncer`` monitor keeps across its own restarts (:mod:`diloco.decoupled.monitor_ledger`): the port
its sites were told, and its counts in ``DIR/monitor.json``. The restart itself: tests/hosts/test_deploy_monitor_restart.py."""

from __future__ import annotations

import json

from diloco.decoupled.monitor_ledger import LEDGER, MonitorLedger, resume_port
from diloco.decoupled.rpc import DEFAULT_PORT


class _Gateway:
    calls = 0


def test_a_resumed_run_serves_on_the_port_its_sites_were_told():
    assert resume_port(None, None) == DEFAULT_PORT and resume_port(0, None) == 0 and resume_port(9, None) == 9
    previous = {"port": 40123}
    assert resume_port(None, previous) == 40123
    assert resume_port(0, previous) == 40123  # `--port 0` again: the same port, not another free one
    assert resume_port(7171, previous) == 7171  # a port named: that one (the sites need the new commands)


def test_the_counts_add_up_over_the_monitors_starts(tmp_path):
    first = MonitorLedger(tmp_path, resumed=False)
    gateway = _Gateway()
    seen = []
    on_status = first.chain(seen.append, gateway)
    for pid, calls in ((11, 5), (11, 9), (12, 20), (None, 21)):  # the syncer restarted once (pid 11 -> 12)
        gateway.calls = calls
        on_status(None if pid is None else {"pid": pid})
    assert len(seen) == 4  # the status page's hook got every read
    assert first.totals(21) == {"monitor_restarts": 0, "syncer_restarts": 1, "gateway_calls": 21}
    assert json.loads((tmp_path / LEDGER).read_text()) == {
        "monitor_starts": 1,
        "syncer_restarts": 1,
        "gateway_calls": 21,
    }

    # the monitor killed, started again: a new syncer (pid 30) is no syncer restart; the counts go on
    again = MonitorLedger(tmp_path, resumed=True)
    again.observe({"pid": 30}, 4)
    assert again.totals(4) == {"monitor_restarts": 1, "syncer_restarts": 1, "gateway_calls": 25}


def test_a_resumed_run_from_before_the_ledger_counts_its_first_start(tmp_path):
    assert MonitorLedger(tmp_path, resumed=True).totals(0)["monitor_restarts"] == 1
