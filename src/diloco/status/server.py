"""A token-protected HTTP server for a run's status page and Prometheus metrics (aiohttp, in a thread of its own).

::

    sock = open_socket("0.0.0.0", 8265)          # refuses a port out of range or taken (ConfigError), binds it
    token = status_token(folder)                   # DILOCO_STATUS_TOKEN, or the folder's status-token, or a new one
    server = StatusServer(sock, token=token, routes={"/": page, "/metrics": metrics})
    server.start(); ...; server.stop()

A route is a function of the request's query (a dict) that returns ``(body, content_type)``; it runs in the
server's thread pool, never on the caller's thread. Every request must carry the token, as a bearer header
(``Authorization: Bearer TOKEN``, what Prometheus' ``authorization`` setting sends) or as ``?token=TOKEN`` (what a
browser opens); anything else is answered 401 and runs no route. The socket is bound by :func:`open_socket`
before the caller writes anything, so a bad ``--status-port`` is refused first.

The server's threads (its event loop and the pool its routes run in) run :data:`NICENESS` steps nicer than the
process (Linux sets a thread's niceness on its own), so serving and drawing the page yield the cores to the
training and merging beside it whenever they want them.
"""

from __future__ import annotations

import asyncio
import hmac
import os
import secrets
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from diloco.errors import ConfigError

#: The environment variable that gives the status page's token (else one is made and kept in the run's folder).
TOKEN_ENV = "DILOCO_STATUS_TOKEN"
TOKEN_FILE = "status-token"

Route = Callable[[dict[str, str]], tuple[bytes | str, str]]

#: How much nicer than its process a thread serving the page runs (:func:`lower_priority`).
NICENESS = 10


def lower_priority(by: int = NICENESS) -> int | None:
    """Make the calling thread ``by`` steps nicer than the process (its main thread; at most 19, never less nice
    than it is); its niceness now, or None where the system does not set a thread's priority on its own (Linux
    does: ``setpriority`` of its thread id) or refuses."""
    try:
        tid = threading.get_native_id()
        nice = max(os.getpriority(os.PRIO_PROCESS, tid), min(19, os.getpriority(os.PRIO_PROCESS, os.getpid()) + by))
        os.setpriority(os.PRIO_PROCESS, tid, nice)
        return os.getpriority(os.PRIO_PROCESS, tid)
    except (AttributeError, OSError):
        return None


def open_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (port 0: one the system picks); a ConfigError naming the port and
    the fix when it is out of range or taken."""
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise ConfigError(f"--status-port {port!r} is out of range: give 1..65535, or 0 for a free port")
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
    except OSError as exc:
        raise ConfigError(f"--status-host {host!r}: {exc}") from None
    try:
        sock.bind((host, port))
        sock.listen(64)
    except OSError as exc:
        sock.close()
        if exc.errno in (98, 13):  # EADDRINUSE, EACCES
            why = "is taken" if exc.errno == 98 else "needs privileges"
            raise ConfigError(
                f"--status-port {port} {why} on {host} ({exc.strerror}): give another port, or 0 for a free one"
            ) from None
        raise ConfigError(f"--status-host {host!r} --status-port {port}: cannot listen there ({exc})") from None
    return sock


def status_token(folder: Path | None = None, *, write: bool = True) -> str:
    """The token the page and the metrics ask for: ``$DILOCO_STATUS_TOKEN``, else ``folder/status-token`` (made,
    readable by its owner only, when ``write`` and it does not exist)."""
    given = os.environ.get(TOKEN_ENV, "").strip()
    if given:
        return given
    if folder is None:
        return secrets.token_urlsafe(24)
    path = Path(folder) / TOKEN_FILE
    if path.is_file():
        return path.read_text(encoding="utf-8").strip()
    token = secrets.token_urlsafe(24)
    if write:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(token + "\n")
    return token


def authorized(headers: Any, query: Any, token: str) -> bool:
    """Whether a request carries ``token`` (a bearer header or ``?token=``), compared in constant time."""
    given = query.get("token") or ""
    auth = headers.get("Authorization") or ""
    if auth.lower().startswith("bearer "):
        given = auth[7:].strip()
    return bool(given) and hmac.compare_digest(given.encode(), token.encode())


class StatusServer:
    """aiohttp serving ``routes`` on ``sock`` from a daemon thread (module docstring)."""

    def __init__(self, sock: socket.socket, *, token: str, routes: dict[str, Route]) -> None:
        self.sock, self.token, self.routes = sock, token, routes
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self.requests = 0
        self.refused = 0

    @property
    def port(self) -> int:
        return int(self.sock.getsockname()[1])

    def url(self, host: str, path: str = "/") -> str:
        shown = f"[{host}]" if ":" in host else host
        return f"http://{shown}:{self.port}{path}?token={self.token}"

    @property
    def thread(self) -> threading.Thread | None:
        """The thread that serves (its event loop); the routes run in the loop's default thread pool."""
        return self._thread

    def _app(self) -> Any:
        from aiohttp import web

        @web.middleware
        async def guard(request: web.Request, handler: Any) -> web.StreamResponse:
            if not authorized(request.headers, request.query, self.token):
                self.refused += 1
                return web.Response(
                    status=401,
                    text="401: this page needs the run's status token (?token=... or Authorization: Bearer ...)\n",
                    headers={"WWW-Authenticate": 'Bearer realm="diloco"'},
                )
            return await handler(request)

        def handler_for(route: Route) -> Any:
            async def handle(request: web.Request) -> web.Response:
                self.requests += 1
                body, kind = await asyncio.get_running_loop().run_in_executor(None, route, dict(request.query))
                data = body.encode() if isinstance(body, str) else body
                return web.Response(body=data, headers={"Content-Type": kind, "Cache-Control": "no-store"})

            return handle

        app = web.Application(middlewares=[guard])
        for path, route in self.routes.items():
            app.router.add_get(path, handler_for(route))
        return app

    def _serve(self) -> None:
        from concurrent.futures import ThreadPoolExecutor

        from aiohttp import web

        lower_priority()  # (this thread, then each thread of the routes' pool as it starts)
        loop = asyncio.new_event_loop()
        self._loop = loop
        asyncio.set_event_loop(loop)
        loop.set_default_executor(
            ThreadPoolExecutor(max_workers=4, thread_name_prefix="diloco-status-route", initializer=lower_priority)
        )
        try:
            runner = web.AppRunner(self._app(), access_log=None)
            loop.run_until_complete(runner.setup())
            loop.run_until_complete(web.SockSite(runner, self.sock).start())
        except BaseException as exc:  # raised again by start()
            self._error = exc
            self._ready.set()
            return
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            loop.run_until_complete(runner.cleanup())
            loop.close()

    def start(self) -> StatusServer:
        self._thread = threading.Thread(target=self._serve, name="diloco-status-server", daemon=True)
        self._thread.start()
        self._ready.wait(timeout=30)
        if self._error is not None:
            raise self._error
        return self

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
        self.sock.close()


__all__ = ["TOKEN_ENV", "TOKEN_FILE", "StatusServer", "authorized", "open_socket", "status_token"]
