"""`diloco config`: the resolved, validated configuration of a preset, method and overrides, as JSON."""

from __future__ import annotations

import argparse
import json
import sys

from diloco.cli._common import config_keys_help, load_preset, overrides, resolve
from diloco.train.config import preset_names


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "config",
        help="print the resolved, validated config of a preset (and --method, --set)",
        description="Print the configuration `diloco train` would run with the same --preset, --method and --set "
        "(every key, validated), and what follows from it (steps, tokens per step, checkpoint "
        "interval, outer steps), with a warning where a setting ran but measured costly (fewer outer "
        "steps than studies/outer-steps found best). Nothing is trained or written.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=config_keys_help(),
    )
    p.add_argument(
        "--preset",
        default="demo",
        help=f"named preset ({', '.join(preset_names())}) or a path to a JSON preset (default: demo)",
    )
    p.add_argument("--method", default=None, help="one of the preset's named methods; default: its base config")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config field, e.g. --set sync_every=100 (repeatable)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    cfg = resolve(load_preset(args.preset), args.method, overrides(args))
    from diloco.outer_steps import outer_steps

    derived = {
        "total_steps": cfg.total_steps,
        "tokens_per_step": cfg.tokens_per_step,
        "total_tokens": cfg.total_steps * cfg.tokens_per_step,
        "checkpoint_interval": cfg.checkpoint_interval,
        "batch_per_replica": cfg.batch_per_replica,
        "outer_steps": (
            outer_steps(total_steps=cfg.total_steps, sync_every=cfg.sync_every) if cfg.method != "dp" else None
        ),
    }
    for warning in cfg.warnings:
        print(f"diloco: warning: {warning}", file=sys.stderr, flush=True)
    print(
        json.dumps({"config": cfg.to_dict(), "derived": derived, "warnings": cfg.warnings}, indent=2, allow_nan=False)
    )
    return 0


__all__ = ["register"]
