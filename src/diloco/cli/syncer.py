"""`diloco syncer`: a Decoupled DiLoCo run's syncer as a service that learner jobs at each site join."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from diloco.cli._common import add_config_args, cache_dir, load_preset, overrides, resolve
from diloco.decoupled.rpc import DEFAULT_PORT
from diloco.decoupled.rpc.bind import DEFAULT_HOST
from diloco.errors import ConfigError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "syncer",
        help="run a Decoupled DiLoCo syncer as a service; learner jobs at each site join it",
        description="Start the syncer of a Decoupled DiLoCo run (method=decoupled) as a named, checkpointed Ray "
        "actor (a new local Ray instance, or the cluster at --set ray_address=HOST:PORT, inside this site), serve "
        "the sites' learners over gRPC beside it (--port, with a token generated here), print the whole command "
        "each site runs (DILOCO_SYNCER_TOKEN=... torchrun --max-restarts 3 ... diloco train ... --set learner=m "
        "--set syncer=NAME@HOST:PORT --resume auto; a site needs no Ray; also in --out's syncer.json) and monitor the run until every learner has "
        "finished. Writes config.json, syncer.json, syncer/ (checkpoints: a killed syncer restarts from "
        "them), merges.jsonl, summary.json and a checkpoint of the final global parameters that `diloco "
        "export` reads. An --out that holds a syncer run of the same config is resumed; any other non-empty "
        "--out is refused.",
    )
    add_config_args(p, default_preset="demo")
    p.add_argument("--out", type=Path, required=True, help="the run's folder (new, empty, or this syncer's to resume)")
    p.add_argument("--poll", type=float, default=5.0, help="seconds between progress lines (default: 5)")
    p.add_argument(
        "--node-ip-address",
        default=None,
        help="the address a new local Ray instance advertises inside this site, on a machine with several "
        "(default: Ray's choice; the sites are told --advertise, not Ray's address)",
    )
    p.add_argument(
        "--port",
        type=int,
        default=None,
        help=f"the TCP port the sites' learners connect to (gRPC; the one a firewall opens to the sites; default "
        f"{DEFAULT_PORT}, or the port of the run being resumed; 0: any free port)",
    )
    p.add_argument(
        "--host",
        default=DEFAULT_HOST,
        help=f"the address to serve the sites on (default {DEFAULT_HOST}: this machine only; 0.0.0.0: every address "
        "of this host, for sites on other hosts)",
    )
    p.add_argument(
        "--advertise",
        default=None,
        help="the address the printed site commands connect to (default: --host's, or this machine's address as Ray "
        "sees it with --host 0.0.0.0)",
    )
    p.add_argument(
        "--standby",
        default=None,
        metavar="HOST:PORT",
        help="where this run's standby serves once it takes over (`diloco syncer --standby-of` there): listed after "
        "this service's address in the printed site commands (syncer=NAME@HOST:PORT,HOST2:PORT2)",
    )
    p.add_argument(
        "--standby-of",
        default=None,
        metavar="NAME@HOST:PORT",
        help="run as the standby of the active syncer at this address (with its token in DILOCO_SYNCER_TOKEN): keep "
        "a copy of its state in --out, and take over (epoch + 1, serving --port) when it has not answered for "
        "--takeover-after seconds. The run's config comes from the active: no --set",
    )
    p.add_argument(
        "--takeover-after",
        type=float,
        default=None,
        metavar="S",
        help="with --standby-of: seconds of silence from the active before the standby takes over (default 10)",
    )
    from diloco.decoupled.status.cli_args import add_status_args

    add_status_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from diloco.decoupled.service import run_service
    from diloco.decoupled.status.cli_args import status_kwargs

    if args.standby_of is not None:
        return _standby(args)
    if args.takeover_after is not None:
        raise ConfigError("--takeover-after is a standby's setting: give it with --standby-of NAME@HOST:PORT")
    cfg = service_config(load_preset(args.preset), overrides(args))
    summary = run_service(
        cfg,
        out=args.out,
        preset=args.preset,
        overrides=args.overrides,
        cache_dir=cache_dir(args),
        poll_s=args.poll,
        node_ip_address=args.node_ip_address,
        host=args.host,
        port=args.port,
        advertise=args.advertise,
        echo=lambda line: print(line, flush=True),
        standby=args.standby,
        **status_kwargs(args),
    )
    print(json.dumps(summary, indent=2), flush=True)
    return 1 if summary.get("fenced_by") is not None else 0


def _standby(args: argparse.Namespace) -> int:
    from diloco.decoupled.standby import TAKEOVER_S, run_standby
    from diloco.decoupled.status.cli_args import status_kwargs

    if args.overrides or args.standby:
        raise ConfigError(
            "--standby-of takes the run's config from the active syncer: drop "
            + ("--set" if args.overrides else "--standby")
        )
    summary = run_standby(
        args.standby_of,
        out=args.out,
        cache_dir=cache_dir(args),
        takeover_s=TAKEOVER_S if args.takeover_after is None else args.takeover_after,
        host=args.host,
        port=args.port,
        advertise=args.advertise,
        node_ip_address=args.node_ip_address,
        poll_s=args.poll,
        echo=lambda line: print(line, flush=True),
        **status_kwargs(args),
    )
    print(json.dumps(summary, indent=2), flush=True)
    return 1 if summary.get("fenced_by") is not None else 0


def service_config(preset: dict[str, Any], extra: dict[str, Any]) -> Any:
    """The run's config: the preset's base with ``method=decoupled``, then ``extra`` (``--set``), with the
    syncer on Ray (``decoupled_transport=ray``)."""
    method = extra.get("method", "decoupled")
    if method != "decoupled":
        raise ConfigError(f"method={method!r}: the syncer service runs method=decoupled; drop --set method")
    transport = extra.get("decoupled_transport", "ray")
    if transport != "ray":
        raise ConfigError(
            f"decoupled_transport={transport!r}: the syncer service is a Ray actor; drop --set decoupled_transport"
        )
    return resolve(preset, "decoupled", {**extra, "decoupled_transport": "ray"})
