"""`diloco status`: the status page of a `diloco syncer` run, rendered from its folder after the run."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "status",
        help="the status page of a `diloco syncer` run, rendered from its folder (after the run)",
        description="Render the page `diloco syncer` serves during a run (one row per learner, the merges, the "
        "syncer's state, the loss and step-rate plots) from the run's --out folder: the syncer's events and "
        "merges, and the losses its monitor evaluated. Writes DIR/status.html unless --out is given.",
    )
    p.add_argument("folder", type=Path, help="the --out folder of a `diloco syncer` run")
    p.add_argument("--out", type=Path, default=None, help="the HTML file to write (default: FOLDER/status.html)")
    p.add_argument("--json", action="store_true", help="also print the page's figures as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from diloco.decoupled.status.offline import write_page

    path, snap = write_page(args.folder, args.out)
    if args.json:
        print(json.dumps(snap, indent=2, allow_nan=False))
    print(path)
    return 0
