"""`diloco train`: one training run from a preset."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from diloco.cli._common import add_config_args, cache_dir, load_preset, overrides, resolve


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "train", help="train one configuration (dp, diloco or streaming)",
        description="Train one configuration with M in-process replicas. Writes config.json, metrics.jsonl, "
                    "summary.json and checkpoint.pt to --out.",
    )
    add_config_args(p, default_preset="demo")
    p.add_argument("--method", default=None,
                   help="one of the preset's named methods (e.g. dp, diloco, streaming, diloco-m1); "
                        "default: the preset's base config")
    p.add_argument("--out", type=Path, default=None, help="output directory (default: runs/<preset>-<method>)")
    p.add_argument("--resume", action="store_true", help="continue from --out/checkpoint.pt exactly")
    p.add_argument("--device", default="cpu", help="torch device, e.g. cpu or cuda (default: cpu)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from diloco.train.trainer import train

    preset = load_preset(args.preset)
    cfg = resolve(preset, args.method, overrides(args))
    name = Path(args.preset).stem
    out = args.out or Path("runs") / f"{name}-{args.method or cfg.method}"
    result = train(cfg, out, cache_dir=cache_dir(args), resume=args.resume,
                   progress=not args.no_progress, device=args.device)
    print(json.dumps(result.to_dict(), indent=2))
    return 0
