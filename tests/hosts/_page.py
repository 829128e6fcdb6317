"""The service's status page looked at from another host: a browser or a scrape run in that host's network (``ip netns
exec``: its address and routes, this machine's files), reaching the page at host 0's address as an operator's
machine on the network would. The service of :mod:`_deploy` serves it on every address of host 0 (``--host
0.0.0.0``: the page listens where the service does), on the free port it writes to its syncer.json, behind the token
it writes to ``status-token``."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Sequence

from _deploy import SERVICE_OUT

from diloco.testing.hosts import Host

_GET = """import json, sys, urllib.error, urllib.request
url, headers = sys.argv[1], json.loads(sys.argv[2])
try:
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=30) as r:
        got = [r.status, r.read().decode()]
except urllib.error.HTTPError as e:
    got = [e.code, e.read().decode()]
print(json.dumps(got))"""


def in_network(host: Host, argv: Sequence[str] = ()) -> list[str]:
    """``argv`` run in ``host``'s network with this machine's files (without ``argv``: the prefix alone)."""
    return ["ip", "netns", "exec", host.netns, *argv]


class Page:
    """Host 0's status page, seen from ``viewer``'s network: ``url`` (with the token: what a browser opens),
    :meth:`get`, :meth:`snapshot`."""

    def __init__(self, h0: Host, viewer: Host) -> None:
        info = json.loads(h0.path(f"{SERVICE_OUT}/syncer.json").read_text())
        self.token = h0.path(f"{SERVICE_OUT}/status-token").read_text().strip()
        self.base = f"http://{h0.address}:{info['status_port']}"
        self.url = f"{self.base}/?token={self.token}"
        self.viewer = viewer

    def get(self, path: str, *, token: str | None = None, bearer: bool = False) -> tuple[int, str]:
        """``(status, body)`` of ``path``, with the run's token (``token=""``: none), as a query or a bearer header."""
        token = self.token if token is None else token
        url, headers = self.base + path, {}
        if token and bearer:
            headers["Authorization"] = f"Bearer {token}"
        elif token:
            url += ("&" if "?" in url else "?") + f"token={token}"
        done = subprocess.run(
            in_network(self.viewer, [sys.executable, "-c", _GET, url, json.dumps(headers)]),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        status, body = json.loads(done.stdout)
        return status, body

    def snapshot(self) -> dict:
        status, body = self.get("/status.json")
        assert status == 200, (status, body)
        return json.loads(body)


def page_rows(dom: str) -> dict[int, tuple[str, int | None, int]]:
    """Learner -> (state, step, restarts) from the page's rows (their ``data-*`` attributes)."""
    found = re.findall(r'<tr id="learner-(\d+)" data-state="([^"]+)" data-step="(\d*)"\s+data-restarts="(\d+)">', dom)
    return {int(m): (state, int(step) if step else None, int(r)) for m, state, step, r in found}
