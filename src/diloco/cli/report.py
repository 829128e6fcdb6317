"""`diloco report`: plots and a Markdown report of the scaling laws fitted to a sweep's results."""

from __future__ import annotations

import argparse
from pathlib import Path

from diloco.cli.fit import add_input_args, load_fit


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "report",
        help="plots (loss, optimal hyperparameters, %% vs DP) and a Markdown report of the fits",
        description="Fit the scaling laws (as `diloco fit`) and write loss_vs_n.png, hparams_vs_n.png, "
        "pct_vs_dp.png and report.md to --out.",
    )
    add_input_args(p)
    p.add_argument("--out", type=Path, required=True, help="output directory")
    p.add_argument("--title", default="Scaling-law report", help="the report's title")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from diloco.scaling.report import write_report

    fit, source = load_fit(args)
    paths = write_report(fit, args.out, title=args.title, source=source)
    for path in paths.values():
        print(path)
    return 0
