"""The status server (:mod:`diloco.status.server`) on loopback: a request without the run's token, or with another,
is refused (401) and runs no route; the token is taken as a bearer header or a query parameter; a port out of range
or taken is refused with the port named, before anything is bound."""

from __future__ import annotations

import socket
import sys
import urllib.error
import urllib.request

import pytest

pytest.importorskip("aiohttp")

from diloco.errors import ConfigError
from diloco.status.server import StatusServer, open_socket, status_token


def _get(url: str, headers: dict | None = None) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=30) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_the_token_is_required_on_every_route():
    calls = []

    def page(query):
        calls.append(query)
        return "<p>ok</p>", "text/html"

    server = StatusServer(open_socket("127.0.0.1", 0), token="s3cret", routes={"/": page, "/metrics": page}).start()
    try:
        base = f"http://127.0.0.1:{server.port}"
        for path in ("/", "/metrics"):
            assert _get(base + path)[0] == 401
            assert _get(base + path + "?token=wrong")[0] == 401
            assert _get(base + path, {"Authorization": "Bearer wrong"})[0] == 401
            assert _get(base + path, {"Authorization": "Basic s3cret"})[0] == 401
        assert calls == [] and server.refused == 8  # a refused request ran no route
        assert _get(base + "/?token=s3cret") == (200, "<p>ok</p>")
        assert _get(base + "/metrics", {"Authorization": "Bearer s3cret"}) == (200, "<p>ok</p>")
        assert server.url("127.0.0.1") == f"{base}/?token=s3cret"
    finally:
        server.stop()


def test_a_port_out_of_range_or_taken_is_refused():
    for bad in (-1, 65536, 70000, True, "8080"):
        with pytest.raises(ConfigError, match="out of range: give 1..65535, or 0 for a free port"):
            open_socket("127.0.0.1", bad)
    taken = open_socket("127.0.0.1", 0)
    port = taken.getsockname()[1]
    try:
        with pytest.raises(ConfigError, match=f"--status-port {port} is taken on 127.0.0.1.*give another port"):
            open_socket("127.0.0.1", port)
    finally:
        taken.close()
    with socket.socket() as probe:  # the refused bind left nothing behind: the port is free again
        probe.bind(("127.0.0.1", port))


def test_the_token_file_is_made_once_for_its_owner_and_the_environment_wins(tmp_path, monkeypatch):
    monkeypatch.delenv("DILOCO_STATUS_TOKEN", raising=False)
    token = status_token(tmp_path)
    assert len(token) >= 32 and (tmp_path / "status-token").stat().st_mode & 0o777 == 0o600
    assert status_token(tmp_path) == token  # a resumed run keeps its token
    monkeypatch.setenv("DILOCO_STATUS_TOKEN", "given")
    assert status_token(tmp_path) == "given"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a thread's own niceness is Linux's")
def test_the_page_is_served_from_threads_nicer_than_the_process_and_the_caller_keeps_its_priority():
    """Serving and drawing the page yield the cores to training and merging: the route runs NICENESS steps nicer
    than the process (capped at 19), and so does the server's own thread; the thread that started it does not."""
    import os
    import threading

    from diloco.status.server import NICENESS

    process = os.getpriority(os.PRIO_PROCESS, 0)
    seen = {}

    def page(query):
        seen["route"] = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
        return "ok", "text/plain"

    server = StatusServer(open_socket("127.0.0.1", 0), token="t", routes={"/": page}).start()
    try:
        assert _get(f"http://127.0.0.1:{server.port}/?token=t") == (200, "ok")
        assert server.thread is not None
        seen["server"] = os.getpriority(os.PRIO_PROCESS, server.thread.native_id)
    finally:
        server.stop()
    want = min(19, process + NICENESS)
    assert seen == {"route": want, "server": want}
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == process
