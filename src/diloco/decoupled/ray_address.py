"""Is a Ray cluster's address worth waiting for? A probe before ``ray.init``, which would otherwise wait for
minutes without a word where nothing listens, or where another service does. Needs no Ray."""

from __future__ import annotations

import os
import socket
import time

from diloco.errors import ConfigError

#: Seconds to wait for a Ray cluster's address to accept a connection before calling it unreachable.
PROBE_TIMEOUT_S = 5.0


def check_address(address: str | None, *, timeout_s: float = PROBE_TIMEOUT_S) -> None:
    """ConfigError naming ``address`` (``host:port`` or ``ray://host:port``) unless a gRPC server (what Ray's
    GCS and Ray Client are) answers there within ``timeout_s``: ``ray.init`` itself would wait for minutes
    without a word, both where nothing listens and where another service does (a web server, say). ``None``,
    ``""``, ``"auto"`` and ``"local"`` are Ray's own lookups and are not probed; with ``RAY_USE_TLS`` set only
    the connection is tried (the handshake is TLS's)."""
    if not address or address in ("auto", "local"):
        return
    hostport = address.split("://", 1)[-1].rstrip("/")
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError(
            f"ray_address={address!r}: give HOST:PORT (a head node's GCS, e.g. 10.0.0.1:6379) or "
            f"ray://HOST:PORT (Ray Client, port 10001), or leave it empty for a local Ray instance"
        )
    deadline = time.monotonic() + timeout_s
    try:
        sock = socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s)
    except OSError as exc:
        raise ConfigError(
            f"ray_address={address!r} does not answer ({type(exc).__name__}: {exc}, within "
            f"{timeout_s:g} s): start the cluster there (ray start --head --port {port}), fix the "
            f"address, or leave it empty to start a local Ray instance"
        ) from None
    if os.environ.get("RAY_USE_TLS", "0").lower() not in ("", "0", "false"):
        sock.close()
        return
    with sock:
        answer = _http2_settings(sock, deadline)
    if answer is not None:
        raise ConfigError(
            f"ray_address={address!r} is not a Ray cluster: something answers there but not as Ray's GCS "
            f"(a gRPC server) does ({answer}): give the head node's GCS address (`ray start --head` prints it, "
            f"port 6379 by default) or ray://HOST:10001 for Ray Client, or leave it empty to start a local Ray "
            f"instance"
        )


#: The HTTP/2 client preface and an empty SETTINGS frame: a gRPC server answers with a SETTINGS frame.
_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])


def _http2_settings(sock: socket.socket, deadline: float) -> str | None:
    """None if the server on ``sock`` speaks HTTP/2 (its first frame is SETTINGS), else what it did instead."""
    try:
        sock.settimeout(max(0.1, deadline - time.monotonic()))
        sock.sendall(_H2_PREFACE)
        head = b""
        while len(head) < 9:
            sock.settimeout(max(0.1, deadline - time.monotonic()))
            chunk = sock.recv(9 - len(head))
            if not chunk:
                break
            head += chunk
    except TimeoutError:
        return "no answer to an HTTP/2 greeting in time"
    except OSError as exc:
        return f"{type(exc).__name__}: {exc}"
    if len(head) == 9 and head[3] == 4:  # frame type 4: SETTINGS
        return None
    shown = head.split(b"\r\n", 1)[0].decode("latin-1") if head else "the connection was closed"
    return f"it answered {shown!r}"


__all__ = ["PROBE_TIMEOUT_S", "check_address"]
