"""A standby syncer: ``diloco syncer --standby-of NAME@HOST:PORT --out DIR2`` on another host.

::

    # on host A (the active), naming where the standby will run, so the printed site commands list both:
    diloco syncer --preset P [--set k=v ...] --out DIR --port 7171 --standby HOST_B:7171
    # on host B, with the token the active printed (its syncer.json):
    DILOCO_SYNCER_TOKEN=TOKEN diloco syncer --standby-of NAME@HOST_A:7171 --out DIR2 --port 7171

:func:`run_standby` asks the active for its first copy (:mod:`diloco.decoupled.rpc.replicate`), which brings the
run's config, name, epoch and printed-command settings; it writes ``DIR2/config.json`` and ``DIR2/syncer.json``
(role ``standby``, mode 0600: the token), prepares the run's data as the active did (so a takeover does not wait for
it), starts its Ray instance, and then keeps ``DIR2/syncer`` a copy of the active's checkpoint files, taken before any
learner is told of a merge (synchronous: a takeover loses no merge a learner has seen). It serves nothing meanwhile
(its port is closed: a learner trying it goes on to the active).

When the active has not answered for ``takeover_s`` seconds (its host is down, or its gateway), the standby takes
over: it runs the service (:func:`~diloco.decoupled.service.run_service`) in ``DIR2`` at the active's epoch + 1,
its syncer actor started from the copied files as a Ray restart would be, and serves the learners on its port until
they have all finished, writing the run's results in ``DIR2``. A learner sees its calls to the lost active fail and
go on at this address (``syncer=NAME@HOST_A:PORT,HOST_B:PORT``), riding the switch out for ``ride_out_steps``; a
report the active took but had not merged is sent again. Takeover time: ``takeover_s``, plus the start of the syncer
actor from its copy (a few seconds; Ray is up already).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from diloco.decoupled.rpc import TOKEN_ENV
from diloco.decoupled.rpc.bind import DEFAULT_HOST, check_endpoint, is_loopback
from diloco.errors import ConfigError

#: Seconds without an answer from the active before the standby takes over. The active lets a silent standby go
#: after :data:`~diloco.decoupled.rpc.replicate.STANDBY_LOST_S`; both are far above a copy's round trip.
TAKEOVER_S = 10.0
#: Seconds the standby waits for the active's first answer when it starts (the active may be starting too).
FIRST_COPY_S = 120.0


def _plan(out: Path, name: str) -> None:
    """Reads only: ``out`` must be new or empty, or this syncer's standby folder (then followed again)."""
    from diloco.files import read_json

    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} is a file: give a new or empty folder for the standby")
    if not out.is_dir() or not any(out.iterdir()):
        return
    info = read_json(out / "syncer.json") if (out / "syncer.json").is_file() else {}
    if info.get("name") != name:
        raise ConfigError(
            f"--out {out} holds files but no standby of the syncer {name}: give a new or empty folder "
            f"(nothing is overwritten)"
        )
    if info.get("role") != "standby":
        raise ConfigError(
            f"--out {out}: this standby took over already (epoch {info.get('epoch')}); resume it as the active with "
            f"`diloco syncer --out {out}` (no --standby-of)"
        )


def run_standby(
    active: str,
    *,
    out: Path | str,
    cache_dir: Path | str,
    token: str | None = None,
    takeover_s: float = TAKEOVER_S,
    host: str = DEFAULT_HOST,
    port: int | None = None,
    advertise: str | None = None,
    node_ip_address: str | None = None,
    poll_s: float = 5.0,
    echo: Callable[[str], None] = print,
    **service: Any,
) -> dict[str, Any]:
    """``diloco syncer --standby-of`` (module docstring): follow the active syncer ``active`` (``NAME@HOST:PORT``,
    its one address) into ``out`` and take over when it is silent for ``takeover_s`` seconds; returns the summary of
    the run it then finishes. ``host``/``port``/``advertise``/``node_ip_address``/``service``: as
    :func:`~diloco.decoupled.service.run_service` takes them, for after the takeover."""
    from diloco.decoupled.rpc.client import Link, Unreachable, parse_addresses
    from diloco.decoupled.rpc.replicate import Follower
    from diloco.decoupled.status.host import whoami
    from diloco.files import write_json
    from diloco.train.config import TrainConfig
    from diloco.train.rundir import RunDirLock

    name, addresses = parse_addresses(active)
    if len(addresses) != 1:
        raise ConfigError(f"--standby-of {active!r}: give the active syncer's one address, NAME@HOST:PORT")
    if takeover_s <= 0:
        raise ConfigError(
            f"--takeover-after {takeover_s!r}: give a positive number of seconds (default {TAKEOVER_S:g})"
        )
    token = token or os.environ.get(TOKEN_ENV, "")
    if not token:
        raise ConfigError(
            f"a standby needs the active syncer's token: run it with {TOKEN_ENV}=... (the token the active printed, "
            f"also in its --out's syncer.json)"
        )
    check_endpoint(host, advertise)
    if is_loopback(host) and not is_loopback(addresses[0][0]):
        raise ConfigError(
            f"--standby-of {active}: the active serves its sites from another host, and this standby serves them "
            f"once it takes over, but it would serve only {host} (--host; {DEFAULT_HOST} by default). Give --host "
            "0.0.0.0 (every address of this host) or --host one of its addresses"
        )
    out = Path(out)
    _plan(out, name)
    who = f"{whoami().rsplit(' pid ', 1)[0]}:{out.resolve()}"  # this host and folder (a restart is the same standby)
    follower = Follower(Link(active, token=token, retry_for=0.0), out / "syncer", standby=who)
    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    lock, started_ray = RunDirLock(out), False
    lock.acquire()  # one standby per folder (dropped before the takeover's service takes it again)
    try:  # (the active may be starting: tried again for FIRST_COPY_S)
        follower.link.retry_for = FIRST_COPY_S
        follower.pull(timeout=FIRST_COPY_S)
    except (Unreachable, RuntimeError, ConfigError) as exc:  # no answer, or refused (token, name, no copy to give)
        lock.release()
        follower.link.close()
        if created and not any(out.iterdir()):
            out.rmdir()  # (a folder this call made, left as it was)
        if isinstance(exc, ConfigError):
            raise
        if isinstance(exc, Unreachable):
            raise ConfigError(
                f"--standby-of {active}: the active syncer does not answer ({exc}); start the standby once the "
                f"active runs (`diloco syncer` printed its address)"
            ) from None
        raise ConfigError(f"--standby-of {active}: {exc}") from None
    follower.link.retry_for = 0.0
    info = follower.info or {}
    cfg = TrainConfig.from_dict(info["config"])
    epoch = int(info.get("epoch", 0))
    try:
        write_json(out / "config.json", cfg.to_dict())
        local = {"name": name, "token": token, "role": "standby", "active": active, "epoch": epoch}
        if port is not None:
            local["port"] = port
        if advertise:
            local["advertise"] = advertise
        write_json(out / "syncer.json", local)
        os.chmod(out / "syncer.json", 0o600)  # it holds the token
        started_ray = _prepare(cfg, cache_dir, node_ip_address)
        echo(
            f"diloco syncer: standby of {name} at {addresses[0][0]}:{addresses[0][1]} (epoch {epoch}); its state is "
            f"copied into {out / 'syncer'} before a learner is told of it; takes over after {takeover_s:g} s of silence"
        )
        last = [time.monotonic()]

        def progress(f: Follower) -> None:
            if time.monotonic() - last[0] >= poll_s:
                echo(f"diloco syncer: standby holds copy {f.seq} ({f.copies} copies, {f.bytes_received} bytes)")
                last[0] = time.monotonic()

        why = follower.follow(takeover_s=takeover_s, on_copy=progress)
        took_at = time.time()
        echo(f"diloco syncer: taking over as epoch {follower.epoch + 1}: {why}")
        lock.release()
        from diloco.decoupled.service import run_service

        active_address = f"{addresses[0][0]}:{addresses[0][1]}"
        summary = run_service(
            cfg,
            out=out,
            preset=info.get("preset", "tiny"),
            overrides=info.get("overrides", []),
            cache_dir=cache_dir,
            poll_s=poll_s,
            node_ip_address=node_ip_address,
            host=host,
            port=port,
            advertise=advertise,
            echo=echo,
            epoch=follower.epoch + 1,
            standby=active_address,
            **service,
        )
        summary["standby"] = {
            "took_over_at": took_at,
            "copies": follower.copies,
            "bytes_received": follower.bytes_received,
            "why": why,
        }
        write_json(out / "summary.json", summary)
        return summary
    finally:
        lock.release()
        follower.link.close()
        if started_ray:
            import ray

            ray.shutdown()


def _prepare(cfg: Any, cache_dir: Path | str, node_ip_address: str | None) -> bool:
    """What a takeover would otherwise wait for: the run's data and model (checked as the active checked them) and
    a local Ray instance. Whether Ray was started here."""
    from diloco.data.sources import check_sources
    from diloco.decoupled.capacity import check_syncer_memory
    from diloco.decoupled.service import _import_ray
    from diloco.train.inputs import prepare_inputs

    ray = _import_ray()
    check_sources(cfg.sources)
    inputs = prepare_inputs(cfg, cache_dir)
    check_syncer_memory(cfg, inputs.model, inputs.fragments, on_cluster=bool(cfg.ray_address))
    if ray.is_initialized():
        return False
    from diloco.decoupled.ray_transport import DEFAULT_NAMESPACE, check_address

    check_address(cfg.ray_address or None)
    kw: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False, "namespace": DEFAULT_NAMESPACE}
    if node_ip_address and not cfg.ray_address:
        kw["_node_ip_address"] = node_ip_address
    from diloco.decoupled.ray_start import start_ray

    start_ray(cfg.ray_address or None, **kw)  # Ray's start-up timeouts on a busy machine: retried
    return True


def service_epoch(out: Path, previous: dict[str, Any] | None, epoch: int) -> int:
    """The epoch a service in ``out`` runs at: ``epoch``, or the resumed run's if newer. A standby's folder (not taken
    over yet) is refused unless its takeover starts it (at the epoch it copied + 1)."""
    held = int((previous or {}).get("epoch", 0))
    if previous and previous.get("role") == "standby" and epoch <= held:
        raise ConfigError(
            f"--out {out} is a standby's copy of the syncer {previous.get('name')} (epoch {held}): run it as "
            f"`diloco syncer --standby-of {previous.get('active')} --out {out}`; it takes over by itself when the "
            f"active is lost"
        )
    return max(int(epoch), held)


def end_fenced(
    shards: Any, summary: dict[str, Any], out: Path, epoch: int, replicator: Any, echo: Callable[[str], None]
) -> dict[str, Any]:
    """A service that a learner told of a newer epoch (a standby took over from it): it stops its syncer and writes
    its summary (``fenced_by``), and no result: the standby finishes the run."""
    from diloco.files import write_json

    shards.kill()
    summary = summary | {"epoch": epoch, "replication": replicator and replicator.stats()}
    write_json(out / "summary.json", summary)
    echo(
        f"diloco syncer: a learner named epoch {summary['fenced_by']} (a standby took over from this syncer of epoch "
        f"{epoch}): this syncer merges no more and stops; the standby finishes the run"
    )
    return summary


__all__ = ["FIRST_COPY_S", "TAKEOVER_S", "end_fenced", "run_standby", "service_epoch"]
