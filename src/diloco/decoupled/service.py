"""The syncer as a service: one ``diloco syncer`` per run, one learner job per site.

::

    diloco syncer --preset P [--set k=v ...] --out DIR [--port 7171]    # on the machine that holds the syncer
    # then, on each site m = 0..M-1 (the exact lines are printed, and kept in DIR/syncer.json):
    DILOCO_SYNCER_TOKEN=TOKEN torchrun --standalone --nproc-per-node R --max-restarts 3 -m diloco train \\
        --preset P --method decoupled [--set k=v ...] --set learner=m --set syncer=NAME@HOST:PORT \\
        --out SITE_DIR --resume auto

:func:`run_service` resolves the run's config (``method=decoupled``, ``decoupled_transport=ray``), prepares its
data and initial model exactly as ``diloco train`` does (:func:`diloco.train.inputs.prepare_inputs`), and starts
the syncer as a named, detached Ray actor (:class:`~diloco.decoupled.ray_transport.SyncerActor`) that saves every
merge to ``DIR/syncer`` and is restarted from there by Ray, as often as it dies (a SIGKILL of its process
included). It runs on a new local Ray instance, or on the cluster at ``ray_address`` (inside this site: no site
joins it). Beside it, in this process, a gRPC gateway (:mod:`diloco.decoupled.rpc.gateway`) serves the sites'
learners on ``--port`` (one TCP port, the one a firewall opens to the sites), every call carrying the token
generated at the service's first start (kept in ``syncer.json`` for a resume). Everything (the config, the data,
the model, ``DIR``, the port, the Ray address) is checked before anything is written into ``DIR``: new or empty,
or a ``diloco syncer`` run of the same config (resumed from its newest checkpoint; nothing a user wrote is lost).

It then stays in the foreground as the run's monitor, printing the merges so far and the learners live and finished
every ``poll_s`` seconds, until each of the M learners has *finished* (left after its last step). Killed, it resumes
when run again (:mod:`~diloco.decoupled.monitor_ledger`). At the end it writes ``DIR/merges.jsonl`` and the final global
parameters as a committed checkpoint of one replica (``DIR/checkpoints``, with ``DIR/config.json`` and
``DIR/tokenizer.json``, so ``diloco export DIR --out MODEL`` reads it), then stops the actor.

Files in ``DIR``: ``config.json`` (the resolved config), ``syncer.json`` (mode 0600: what each site needs: the
syncer's ``NAME@HOST:PORT``, the port, the token, the whole learner command of each site, the config fingerprint),
``tokenizer.json``, ``syncer/`` (the actor's checkpoints, merge log and events), ``monitor.json`` (the monitor's
counts), and at the end ``merges.jsonl``, ``checkpoints/`` and ``summary.json``.

A standby (``--standby-of``, another host: :mod:`diloco.decoupled.standby`) holds a copy of the syncer's state and
takes over at ``epoch`` + 1; a service a learner names a newer epoch to stops (summary ``fenced_by``).

Learners (:func:`connect_learner`, which the trainer calls for ``--set syncer=NAME@HOST:PORT``; over gRPC, no Ray at
the site: :mod:`diloco.decoupled.rpc.client`): a learner job claims its index with a *session* (a random id) and the
config's :func:`fingerprint`, and holds the claim with a heartbeat every ``HEARTBEAT_S`` from a daemon thread (the
claims are saved with the syncer's state: they survive its restart). Refused, as a ConfigError:

* a fingerprint that differs from its own (each differing key named, with both values);
* an index outside 0..M-1;
* an index another session holds and was heard from within ``LEASE_S`` (it waits up to ``LEASE_S`` for the
  claim to lapse first, so the restarted job of a killed learner gets in);
* a learner that has finished (its last ``leave`` said so): it cannot join again.

A learner that leaves without finishing (``channel.leave(finished=False)``) or dies may come back; one that
finished or left no longer counts toward the quorum (:meth:`~diloco.decoupled.syncer.Syncer.leave`). A channel's
plain ``leave()`` (what :meth:`Learner.finish` and :meth:`Learner.close` call after the last step) says *finished*.

A site's job probes its syncer before it writes anything (:mod:`diloco.decoupled.rpc.probe`): an address that drops
packets or refuses, something else on the port, a wrong token and another run's syncer name are each refused within
:data:`~diloco.decoupled.rpc.probe.PROBE_TIMEOUT_S` seconds with a message saying which. Ray not installed on the
syncer's host is a ConfigError naming ``pip install -e .[ray]``; grpcio not installed at a site, ``.[site]``.
"""

from __future__ import annotations

import os
import secrets
import shlex
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from diloco.decoupled.fingerprint import DATA_KEYS, FINGERPRINT_KEYS, describe_differences, fingerprint
from diloco.decoupled.rpc import TOKEN_ENV
from diloco.decoupled.rpc.bind import DEFAULT_HOST, check_endpoint, sites_address
from diloco.decoupled.run_folder import plan_out
from diloco.errors import ConfigError, RunError

#: The keys a site's learner command must not repeat from the syncer's overrides (the syncer's address goes in
#: ``syncer=NAME@ADDRESS``).
SYNCER_ONLY_KEYS = ("ray_address", "decoupled_transport", "syncer_device", "learner_lease")
RAY_MISSING = "the syncer service needs Ray: pip install -e .[ray] (or ray>=2.9)"
#: ``syncer=NAME@ray:GCS_ADDRESS``: a learner inside the syncer's own Ray cluster (``diloco chaos``) talks to the
#: actor through Ray; any other address is a service's gRPC endpoint (a site, no Ray).
RAY_SCHEME = "ray:"
#: How often torchrun restarts a site's job in the printed command (each restart resumes its checkpoint).
MAX_RESTARTS = 3


# -- the learner's side ------------------------------------------------------
def parse_syncer(spec: str) -> tuple[str, str]:
    """``NAME@ADDRESS`` (as ``diloco syncer`` prints it) -> (name, address)."""
    name, sep, address = str(spec).partition("@")
    if not sep or not name or not address:
        raise ConfigError(
            f"syncer={spec!r}: give NAME@ADDRESS as `diloco syncer` printed it (e.g. "
            f"diloco-syncer-1a2b3c@10.0.0.1:7171; also in its --out folder's syncer.json)"
        )
    return name, address


def _import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ConfigError(RAY_MISSING) from None
    return ray


def connect_learner(
    cfg: Any,
    *,
    learner: int,
    syncer: str,
    vocab_size: int | None = None,
    data_digest: str | None = None,
    token: str | None = None,
) -> Any:
    """Learner ``learner``'s channel to the service ``syncer`` (``NAME@HOST:PORT``) over gRPC
    (:func:`diloco.decoupled.rpc.client.connect_site`: no Ray here; ``NAME@ray:GCS_ADDRESS``, what ``diloco chaos``
    gives its learners inside the syncer's Ray cluster: the actor's Ray channel), its index claimed and held by a heartbeat
    (module docstring). ``vocab_size``, ``data_digest``: the learner's data (``TokenData.vocab_size``,
    ``TokenData.digest()``), checked against the syncer's. ``token``: default ``DILOCO_SYNCER_TOKEN``. A refusal is
    a ConfigError saying why; the channel's ``leave()`` says the learner finished (``leave(finished=False)`` if it
    stops before its end)."""
    name, address = parse_syncer(syncer)
    if address.startswith(RAY_SCHEME):  # in-cluster (diloco chaos): this learner is a process of the syncer's cluster
        _import_ray()
        from diloco.decoupled.ray_shards import connect_shards
        from diloco.decoupled.ray_transport import DEFAULT_NAMESPACE

        return connect_shards(
            learner=learner,
            name=name,
            num_shards=cfg.syncer_shards,
            namespace=DEFAULT_NAMESPACE,
            address=address.removeprefix(RAY_SCHEME),
            fingerprint=fingerprint(cfg, vocab_size=vocab_size, data_digest=data_digest),
        )
    from diloco.decoupled.rpc.client import connect_site

    return connect_site(
        learner=learner,
        syncer=syncer,
        num_shards=cfg.syncer_shards,
        fingerprint=fingerprint(cfg, vocab_size=vocab_size, data_digest=data_digest),
        token=token,
    )


# -- the service's side ------------------------------------------------------
def learner_command(
    *,
    preset: str,
    overrides: Sequence[str],
    ranks: int,
    learner: int,
    syncer: str,
    out: str,
    token: str | None = None,
) -> str:
    """The whole command a site runs for learner ``learner`` (``overrides``: the syncer's ``--set`` items;
    ``token``: the service's, set in the command's environment): restarted by torchrun up to
    :data:`MAX_RESTARTS` times, each start resuming the site's newest checkpoint (``--resume auto``)."""
    words = [f"{TOKEN_ENV}={token}"] if token else []
    words += ["torchrun", "--standalone", "--nproc-per-node", str(ranks), "--max-restarts", str(MAX_RESTARTS)]
    words += ["-m", "diloco", "train", "--preset", preset, "--method", "decoupled"]
    for item in overrides:
        if item.partition("=")[0].strip() not in SYNCER_ONLY_KEYS + ("method", "learner", "syncer"):
            words += ["--set", item]
    words += ["--set", f"learner={learner}", "--set", f"syncer={syncer}", "--out", out, "--resume", "auto"]
    return shlex.join(words)


def build_syncer(config: dict[str, Any], vocab_size: int, shard: int = 0) -> Any:
    """The run's syncer (shard ``shard`` of its ``syncer_shards``), from its config (a dict) and the data's
    vocabulary: what the actor runs (built in the actor's process, so that Ray can restart it without the process
    that started it)."""
    from diloco.decoupled.syncer_device import actor_device
    from diloco.decoupled.trainer import make_syncers
    from diloco.models.factory import build_model
    from diloco.train.config import TrainConfig
    from diloco.train.inputs import run_fragments
    from diloco.train.speed import unwrap_compiled

    cfg = TrainConfig.from_dict({**config, "syncer_device": actor_device(config.get("syncer_device", "cpu"))})
    model = unwrap_compiled(
        build_model(
            cfg.model, size=cfg.size, vocab_size=vocab_size, seq_len=cfg.seq_len, seed=cfg.seed, z_loss=cfg.z_loss
        )
    )
    return make_syncers(cfg, model, run_fragments(cfg, model), only=shard)[0]


def run_service(
    cfg: Any,
    *,
    out: Path | str,
    preset: str,
    overrides: Sequence[str] = (),
    cache_dir: Path | str,
    poll_s: float = 5.0,
    node_ip_address: str | None = None,
    host: str = DEFAULT_HOST,
    port: int | None = None,
    advertise: str | None = None,
    echo: Callable[[str], None] = print,
    status_port: int | None = 0,
    status_host: str = DEFAULT_HOST,
    status_eval_s: float = 30.0,
    epoch: int = 0,
    standby: str | None = None,
) -> dict[str, Any]:
    """``diloco syncer`` (module docstring): start (or resume) the run's syncer service in ``out``, monitor it
    until every learner has finished, write the run's results; returns the summary (also ``summary.json``).

    ``cfg``: the run's config (:func:`diloco.cli.syncer.service_config`); ``preset`` and ``overrides`` (the ``--set``
    items) are what the printed learner commands repeat. The sites' endpoint: served on ``host``:``port`` (default
    loopback and :data:`~diloco.decoupled.rpc.DEFAULT_PORT`, or a resumed run's port), printed as ``advertise``
    (:mod:`diloco.decoupled.rpc.bind`). ``node_ip_address``: the address a new local Ray instance advertises. A Ray
    instance this process already joined is used as it is. ``status_port`` / ``status_host``: where the run's
    status page and metrics are served (:mod:`diloco.decoupled.status`; port 0: a free one, None: none), the loss
    plot's evaluation every ``status_eval_s`` seconds (0: none). ``epoch``: the syncer's epoch (a standby that
    takes over gives the active's + 1; a resumed run keeps its own if newer); ``standby``: a standby's ``HOST:PORT``,
    listed after this service's address in the printed learner commands."""
    out = Path(out)
    if cfg.method != "decoupled":
        raise ConfigError(f"method={cfg.method!r}: the syncer service runs method=decoupled")
    previous = plan_out(out, cfg)
    check_endpoint(host, advertise)
    check_endpoint(host, (previous or {}).get("advertise") if not advertise else None, what="the resumed run's address")
    from diloco.decoupled.standby import service_epoch

    epoch = service_epoch(out, previous, epoch)  # (a standby's folder is refused: it takes over by itself)
    from diloco.decoupled.status.monitor import StatusPage
    from diloco.train.rundir import RunDirLock

    page = StatusPage.open(host=status_host, port=status_port, eval_every_s=status_eval_s)  # before `out` is written

    lock = RunDirLock(out)  # one monitor per folder: a second would start a second actor on the same checkpoints
    lock.acquire()  # (nothing to lock yet for a new folder: taken once it is created, below)
    try:
        return _run(
            cfg,
            out,
            previous,
            preset=preset,
            overrides=overrides,
            cache_dir=cache_dir,
            poll_s=poll_s,
            node_ip_address=node_ip_address,
            endpoint=(host, port, advertise),
            echo=echo,
            lock=lock,
            page=page,
            epoch=epoch,
            standby=standby,
        )
    finally:
        page.close()
        lock.release()


def _run(
    cfg: Any,
    out: Path,
    previous: dict[str, Any] | None,
    *,
    preset: str,
    overrides: Sequence[str],
    cache_dir: Path | str,
    poll_s: float,
    node_ip_address: str | None,
    endpoint: tuple[str, int | None, str | None],
    echo: Callable[[str], None],
    lock: Any,
    page: Any,
    epoch: int = 0,
    standby: str | None = None,
) -> dict[str, Any]:
    from diloco.data.sources import check_sources
    from diloco.decoupled.rpc.gateway import Gateway, ray_backend
    from diloco.decoupled.run_folder import write_final_checkpoint
    from diloco.decoupled.site_budget import learner_counts
    from diloco.decoupled.trainer import write_merges
    from diloco.files import write_json
    from diloco.train.inputs import prepare_inputs

    ray = _import_ray()
    from diloco.decoupled.ray_shards import RayShards
    from diloco.decoupled.ray_transport import DEFAULT_NAMESPACE, check_address

    check_sources(cfg.sources)
    inputs = prepare_inputs(cfg, cache_dir)  # the data and the seeded model, as `diloco train` builds them
    from diloco.decoupled.capacity import check_syncer_memory
    from diloco.decoupled.monitor_ledger import MonitorLedger, resume_port

    # this host (or, on a Ray cluster, each of its nodes) holds the syncer: checked before `out` is written
    check_syncer_memory(cfg, inputs.model, inputs.fragments, on_cluster=bool(cfg.ray_address))
    vocab, digest = inputs.data.vocab_size, inputs.data.digest()
    name = previous["name"] if previous else f"diloco-syncer-{uuid.uuid4().hex[:12]}"
    token = (previous or {}).get("token") or secrets.token_urlsafe(24)  # a resumed run keeps its sites' token
    host, port, advertise = endpoint
    port = resume_port(port, previous)  # a resumed run serves where its sites were told (monitor_ledger.py)
    handles: list[Any] = []  # the actors, once started: until then the sites' calls are answered "try again"
    # a learner's calls at a shard: a heartbeat, a claim, and a wait for a reply per fragment in flight (each may take
    # up to WAIT_REPLY_S): room for 8 a learner and shard
    workers = max(64, 8 * cfg.replicas * cfg.syncer_shards)
    backend = ray_backend(handles, cfg.syncer_shards)
    from diloco.decoupled.rpc.replicate import replicator_for

    replicator = replicator_for(cfg, out / "syncer")  # (its info once known, below; None on a Ray cluster)
    gateway = Gateway(
        backend, name=name, token=token, host=host, port=port, workers=workers, epoch=epoch, replicator=replicator
    )
    gateway.start()  # a port in use is refused here, before `out` is written
    started_ray = not ray.is_initialized()
    try:
        if started_ray:
            check_address(cfg.ray_address or None)  # fails fast where no Ray cluster answers
            kw: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False, "namespace": DEFAULT_NAMESPACE}
            if node_ip_address and not cfg.ray_address:
                kw["_node_ip_address"] = node_ip_address
            from diloco.decoupled.ray_start import start_ray

            try:
                start_ray(cfg.ray_address or None, **kw)  # Ray's start-up timeouts on a busy machine: retried
            except Exception as exc:  # (a timeout of Ray's own start on a busy machine: not a bug of ours)
                raise RunError(
                    f"Ray did not {'join ' + cfg.ray_address if cfg.ray_address else 'start'} ({type(exc).__name__}: "
                    f"{exc}); nothing was written to {out}: run the same command again (on a busy machine Ray's start "
                    "can time out)"
                ) from exc
        namespace = ray.get_runtime_context().namespace or DEFAULT_NAMESPACE
        advertise = sites_address(host, advertise or (previous or {}).get("advertise"), ray.util.get_node_ip_address)
        spec = f"{name}@{advertise}:{gateway.port}" + (f",{standby}" if standby else "")
        prints = fingerprint(cfg, vocab_size=vocab, data_digest=digest)
        commands = [
            learner_command(
                preset=preset,
                overrides=overrides,
                ranks=cfg.ranks_per_worker,
                learner=m,
                syncer=spec,
                out=f"{out.name}-learner-{m}",
                token=token,
            )
            for m in range(cfg.replicas)
        ]
        info = {
            "name": name,
            "namespace": namespace,
            "syncer": spec,
            "advertise": advertise,
            "port": gateway.port,
            "token": token,
            "token_env": TOKEN_ENV,
            "learners": commands,
            "fingerprint": prints,
            "status_port": page.port,
            "epoch": epoch,
            "preset": preset,
            "overrides": list(overrides),
        }
        if replicator is not None:
            replicator.info = {k: v for k, v in info.items() if k != "token"} | {"config": cfg.to_dict()}
        out.mkdir(parents=True, exist_ok=True)  # everything is checked: only now is `out` written
        lock.acquire()
        write_json(out / "config.json", cfg.to_dict())
        if inputs.data.tokenizer is not None:
            (out / "tokenizer.json").write_text(inputs.data.tokenizer.to_json(), encoding="utf-8")
        write_json(out / "syncer.json", info)
        os.chmod(out / "syncer.json", 0o600)  # it holds the token
        ledger = MonitorLedger(out, resumed=previous is not None)  # counts kept across this monitor's restarts
        try:  # a resumed run whose detached actors still run
            shards = RayShards.find(name, cfg.syncer_shards, namespace=namespace)
            echo(f"diloco syncer: {name} still runs; monitoring it")
        except ValueError:
            if previous is not None:  # (a local Ray instance ends with the monitor that started it)
                echo(f"diloco syncer: resuming {name}: its actors are gone; restored from {out / 'syncer'}")
            from functools import partial

            shards = RayShards.start(
                [partial(build_syncer, cfg.to_dict(), vocab, s) for s in range(cfg.syncer_shards)],
                name=name,
                namespace=namespace,
                checkpoint_dir=str((out / "syncer").resolve()),
                detached=True,
                fingerprint=prints,
                num_gpus=1 if cfg.syncer_device.startswith("cuda") else 0,  # auto: a GPU if Ray gives the actor one
            )
        handles.extend(shards.handles)
        status = shards.status()
        echo(
            f"diloco syncer: {name} runs (pid {status['pid']}"
            + (f", resumed from {status['restored_merges']} merges" if status["restored_merges"] is not None else "")
            + f"); the sites connect to {advertise}:{gateway.port} (TCP, gRPC; served on {host}:{gateway.port}; "
            f"epoch {epoch})"
        )
        echo(f"learner commands, one per site (also in {out / 'syncer.json'}; they hold the token):")
        for line in commands:
            echo(f"  {line}")
        page.start(out=out, name=name, cfg=cfg, inputs=inputs, echo=echo)
        on_status = ledger.chain(page.on_status, gateway)  # each status read: the page's, then the ledger's
        summary = watch_run(
            shards,
            num_learners=cfg.replicas,
            poll_s=poll_s,
            echo=echo,
            on_status=on_status,
            fenced=lambda: gateway.fenced_by,
        )
        if summary.get("fenced_by") is not None:  # a standby took over: it finishes the run, this one writes no result
            from diloco.decoupled.standby import end_fenced

            return end_fenced(shards, summary | {"name": name, "address": spec}, out, epoch, replicator, echo)
        records, lease = shards.records(), shards.lease_summary()  # (lease: the learner lease's leaves and joins)
        summary.update(learner_counts(cfg, shards.learner_steps()))  # each learner's steps and tokens, as counted
        named = shards.global_named_parameters()
        write_merges(out / "merges.jsonl", records)
        write_final_checkpoint(
            out, cfg, inputs.model, named, vocab_size=vocab, data_digest=digest, step=cfg.total_steps
        )
        import torch

        from diloco.train.evaluation import evaluate_parameters

        loss = evaluate_parameters(inputs.model, named, inputs.val_batches, bf16=cfg.bf16, device=torch.device("cpu"))
        page.finish(final_loss=loss)
        shards.kill()
        summary = {**summary, "merges": len(records), "name": name, "address": spec, "final_eval_loss": loss}
        summary |= ledger.totals(gateway.calls) | {"learner_lease": lease}  # (ledger: every start of this monitor)
        summary |= {"epoch": epoch, "replication": replicator and replicator.stats()}
        write_json(out / "summary.json", summary)
        echo(f"diloco syncer: every learner finished; {len(records)} merges; results in {out}")
        return summary
    finally:
        gateway.stop()
        if started_ray:
            ray.shutdown()


def watch_run(
    shards: Any,
    *,
    num_learners: int,
    poll_s: float,
    echo: Callable[[str], None],
    on_status: Callable[[dict[str, Any] | None], None] = lambda status: None,
    fenced: Callable[[], int | None] = lambda: None,
) -> dict[str, Any]:
    """Print the run's progress until every learner has finished (at every shard); the restarts seen.
    ``on_status``: given each status read (None: the syncer did not answer), e.g. the status page's. ``fenced``:
    a newer epoch a learner named (the run is then left to the standby that took over), or None."""
    from ray.exceptions import GetTimeoutError

    start = time.monotonic()
    pid, restarts, last, last_at = None, 0, "", 0.0
    while True:
        if fenced() is not None:
            return {"learners": num_learners, "syncer_restarts": restarts, "fenced_by": fenced()}
        try:
            status = shards.status(timeout=max(30.0, 3 * poll_s))
        except GetTimeoutError:
            echo("diloco syncer: the syncer does not answer (restarting?); waiting")
            on_status(None)
            continue
        on_status(status)
        if pid is not None and status["pid"] != pid:
            restarts += 1
            echo(
                f"diloco syncer: the syncer restarted (pid {pid} -> {status['pid']}) from its checkpoint of "
                f"{status['restored_merges']} merges"
            )
        pid = status["pid"]
        line = (
            f"merges {status['merges']}; learners live {status['live']}, joined {status['members']}, "
            f"finished {len(status['finished'])}/{num_learners} {status['finished']}"
        )
        if line != last or time.monotonic() - last_at >= 60:
            echo(f"[{time.monotonic() - start:7.1f} s] {line}")
            last, last_at = line, time.monotonic()
        if len(status["finished"]) >= num_learners:
            return {"learners": num_learners, "syncer_restarts": restarts, "seconds": time.monotonic() - start}
        time.sleep(poll_s)


__all__ = [
    "DATA_KEYS",
    "FINGERPRINT_KEYS",
    "build_syncer",
    "connect_learner",
    "describe_differences",
    "fingerprint",
    "learner_command",
    "parse_syncer",
    "plan_out",
    "run_service",
    "watch_run",
]
