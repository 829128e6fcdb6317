"""`diloco compare`: several methods on one preset, side by side."""

from __future__ import annotations

import argparse
from pathlib import Path

from diloco.cli._common import add_config_args, cache_dir, load_preset, overrides, resolve


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "compare",
        help="train a list of methods on one preset and print the comparison table",
        description="Train each method of a preset (same model, data and token budget) and print: method, "
        "final eval loss, % vs DP, bytes sent per replica, x fewer than DP, peak bytes per sync, "
        "wall time. Writes compare.json, compare.txt, loss_vs_tokens.png and loss_vs_bytes.png to --out. "
        "Every method's settings and run folder are checked before any trains: finished runs with an "
        "identical config are reused, interrupted ones resumed, and a folder holding a run of another "
        "config is an error naming the settings that differ (--fresh replaces them).",
    )
    add_config_args(p, default_preset="demo")
    p.add_argument(
        "--methods",
        default=None,
        help="comma-separated method names from the preset (default: all of them, in preset order)",
    )
    p.add_argument("--out", type=Path, default=None, help="output directory (default: runs/compare-<preset>)")
    p.add_argument(
        "--fresh",
        action="store_true",
        help="retrain every method, replacing the runs in --out/<method> (deletes their results)",
    )
    p.add_argument("--device", default="cpu", help="torch device (default: cpu)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from diloco.compare import format_report, run_compare

    preset = load_preset(args.preset)
    names = [m.strip() for m in args.methods.split(",")] if args.methods else list(preset["methods"])
    if not names:
        raise SystemExit(f"preset {args.preset!r} defines no methods; pass --methods or use a preset with 'methods'")
    extra = overrides(args)
    configs = {name: resolve(preset, name, extra) for name in names}  # validate all before training any
    out = args.out or Path("runs") / f"compare-{Path(args.preset).stem}"
    rows = run_compare(
        configs, out, cache_dir=cache_dir(args), progress=not args.no_progress, device=args.device, reuse=not args.fresh
    )
    print()
    print(format_report(rows))
    print(f"\nwritten: {out}/compare.json, compare.txt, loss_vs_tokens.png, loss_vs_bytes.png")
    return 0
