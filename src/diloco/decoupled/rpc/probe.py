"""Is a site's ``syncer=NAME@HOST:PORT`` worth starting for? One call, before any file of the site is written.

A ``Ping`` with the token, of one try and a deadline of :data:`PROBE_TIMEOUT_S`: refused with a ConfigError that
says which of these it is, so a site job does not train into a service it can never reach:

* nothing answers within the deadline (the packets are dropped: a firewall that drops, a host that is down, a wrong
  address), or the connection is refused (nothing listens on the port);
* something answers but is not a diloco syncer (another program on the port);
* the service refuses the token (wrong or missing) or serves another syncer (another run's command);
* the service has another number of shards than the learner's ``syncer_shards``.
"""

from __future__ import annotations

from diloco.decoupled.rpc.client import Link, parse_addresses
from diloco.decoupled.rpc.frames import FrameError, unpack
from diloco.errors import ConfigError

#: Seconds a probe waits for the service's answer.
PROBE_TIMEOUT_S = 5.0


def check_syncer(
    spec: str, *, token: str | None = None, num_shards: int | None = None, timeout_s: float = PROBE_TIMEOUT_S
) -> dict:
    """The service's ping answer (its name, shards, clock, epoch), or a ConfigError saying why not (module
    docstring). With several addresses (the active's, then a standby's) the first that answers as this run's syncer
    does is taken (a standby does not serve until it takes over); when none does, each one's reason is given."""
    name, addresses = parse_addresses(spec)
    link = Link(spec, token=token, retry_for=0.0)
    why: list[ConfigError] = []
    try:
        for at, (host, port) in enumerate(addresses):
            try:
                header = _probe(
                    link, at, spec if len(addresses) == 1 else f"{name}@{host}:{port}", host, port, timeout_s
                )
            except ConfigError as exc:
                why.append(exc)
                continue
            if num_shards is not None and header.get("shards") != num_shards:
                raise ConfigError(
                    f"syncer={spec!r} has syncer_shards={header.get('shards')}, this learner {num_shards}: start the "
                    f"learner with the syncer's settings (the command `diloco syncer` printed)"
                )
            return header
    finally:
        link.close()
    if len(why) == 1:
        raise why[0]
    raise ConfigError(f"syncer={spec!r}: no address answers as this run's syncer: " + "; ".join(map(str, why)))


def _probe(link: Link, at: int, spec: str, host: str, port: int, timeout_s: float) -> dict:
    import grpc

    try:
        answer = link.stub("Ping", at)(
            _ping(link.name), timeout=timeout_s, metadata=link.metadata, wait_for_ready=False
        )
    except grpc.RpcError as exc:
        code, details = exc.code(), exc.details() or ""
        if code == grpc.StatusCode.DEADLINE_EXCEEDED or "timed out" in details.lower():
            raise ConfigError(
                f"syncer={spec!r}: nothing answered at {host}:{port} within {timeout_s:g} s (the connection was "
                f"not refused: its packets are dropped, by a firewall, or the host is down or not this address): "
                f"open TCP port {port} on the syncer's host to this site, and check the address `diloco syncer` "
                f"printed"
            ) from None
        if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.NOT_FOUND):
            raise ConfigError(f"syncer={spec!r}: {details}") from None
        if code == grpc.StatusCode.UNAVAILABLE and "refused" in details.lower():
            raise ConfigError(
                f"syncer={spec!r}: {host}:{port} refused the connection (nothing listens there): start the "
                f"service (`diloco syncer ... --out DIR` prints the address), or fix the address"
            ) from None
        if code == grpc.StatusCode.UNAVAILABLE and "http" not in details.lower():
            raise ConfigError(f"syncer={spec!r}: {host}:{port} cannot be reached ({details})") from None
        raise ConfigError(
            f"syncer={spec!r}: something answers at {host}:{port} but not as a diloco syncer does "
            f"({code.name}: {details[:200]}): give the address `diloco syncer` printed"
        ) from None
    try:
        header, _ = unpack(answer)
    except FrameError as exc:
        raise ConfigError(f"syncer={spec!r}: {host}:{port} answers, but not as a diloco syncer does ({exc})") from None
    return header


def _ping(name: str) -> bytes:
    from diloco.decoupled.rpc.frames import pack

    return pack({"syncer": name, "shard": 0})


__all__ = ["PROBE_TIMEOUT_S", "check_syncer"]
