"""Where ``diloco syncer`` serves its sites, and the address it tells them.

The service binds loopback (127.0.0.1) unless asked otherwise (``--host``): a run on one machine is reachable from
nowhere else. Sites on other hosts need ``--host 0.0.0.0`` (every address of this host) or ``--host`` one of its
addresses. The printed site commands connect to ``--advertise``; by default the bound address, or this machine's
address as Ray sees it where every address is bound. A bound loopback address advertised as another is refused
before anything is written: no site could connect.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable

from diloco.errors import ConfigError

#: The address the service serves its sites on unless ``--host`` says otherwise.
DEFAULT_HOST = "127.0.0.1"
_EVERY = ("0.0.0.0", "::", "")


def is_loopback(address: str) -> bool:
    """Whether ``address`` (an IP or ``localhost``) is this machine's loopback."""
    if address.strip("[]").lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(address.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: whatever it resolves to, not ours to decide


def check_endpoint(host: str, advertise: str | None, *, what: str = "--advertise") -> None:
    """ConfigError where the sites would be told ``advertise`` while only loopback ``host`` is served."""
    if advertise and is_loopback(host) and not is_loopback(advertise):
        raise ConfigError(
            f"{what} {advertise}: the sites would connect there, but the service serves only {host} (--host; "
            f"{DEFAULT_HOST} by default: this machine alone). Give --host 0.0.0.0 to serve every address of this "
            f"host (or --host {advertise}), or leave {what} out on one machine"
        )


def sites_address(host: str, advertise: str | None, node_ip: Callable[[], str]) -> str:
    """The address the printed site commands connect to: ``advertise``, else ``host`` where one address is bound,
    else ``node_ip()`` (this machine's address as Ray sees it)."""
    if advertise:
        return advertise
    return node_ip() if host in _EVERY else host.strip("[]")


__all__ = ["DEFAULT_HOST", "check_endpoint", "is_loopback", "sites_address"]
