"""The bandwidth frontier at laptop scale: one grid per method and global batch, each bracketing the inner lr.

    .venv/bin/python studies/frontier/write_grids.py SIZE [BATCH]    # adds the grids SIZE-* to grids.jsonl
    .venv/bin/python studies/frontier/write_grids.py SIZE BATCH --lr-of-batch 16   # one lr per method: its best at
                                                                                     # batch 16 (frontier-summary.json)
    .venv/bin/python studies/frontier/write_grids.py SIZE BATCH --bracket   # the lrs that bracket each method's best
    .venv/bin/python studies/frontier/write_grids.py --files [PREFIX]   # grids/NAME.json of the grids named PREFIX*,
                                                                        # for diloco sweep --grid; prints their paths

The methods, their settings and the grids are in ``diloco.studies.frontier``. grids.jsonl holds every grid a sweep
of the study ran, one line each, as it was written (by this script, gpu_grids.py or by hand); a grid in it is
never rewritten, and ``--files`` writes it back to grids/ (not in git) byte for byte.
"""

from __future__ import annotations

import json
import sys

from diloco.studies.frontier import GRIDS, HERE, INNER_LRS, at_best_lr, bracketing, grids
from diloco.studies.grid_files import append_grids, read_grids, write_grid_files


def write_files(prefix: str = "") -> int:
    names = [n for n in read_grids(GRIDS) if n.startswith(prefix)]
    for path in write_grid_files(GRIDS, HERE / "grids", names):
        print(path.relative_to(HERE.parents[1]))
    return 0


def main() -> int:
    args = sys.argv[1:]
    if args[:1] == ["--files"] and len(args) <= 2:
        return write_files(*args[1:])
    of_batch, bracket = None, False
    if len(args) == 4 and args[2] == "--lr-of-batch" and args[3].isdigit():
        of_batch, args = int(args[3]), args[:2]
    elif len(args) == 3 and args[2] == "--bracket":
        bracket, args = True, args[:2]
    if (
        len(args) not in (1, 2)
        or args[0] not in INNER_LRS
        or not all(b.isdigit() for b in args[1:])
        or ((of_batch is not None or bracket) and len(args) != 2)
    ):
        print(
            f"usage: write_grids.py SIZE [BATCH] [--lr-of-batch B | --bracket] | --files [PREFIX]  (SIZE: "
            f"{', '.join(INNER_LRS)}; BATCH: a global batch, default 16 and 32; --lr-of-batch: one lr per method, "
            f"its best at batch B; --bracket: the lrs past each best at an edge; --files: write grids/NAME.json)",
            file=sys.stderr,
        )
        return 2
    if of_batch is None and not bracket:
        todo = grids(args[0], tuple(int(b) for b in args[1:]) or (16, 32))
    else:
        rows = json.loads((HERE / "frontier-summary.json").read_text())["rows"]
        todo = bracketing(args[0], int(args[1]), rows) if bracket else at_best_lr(args[0], int(args[1]), of_batch, rows)
        if not todo:
            print(
                f"write_grids.py: nothing to write for {args[0]} at batch {of_batch or args[1]} from "
                f"frontier-summary.json (no finished rows there, or every best bracketed; run "
                f"studies/frontier/report.py first)",
                file=sys.stderr,
            )
            return 2
    added = set(append_grids(GRIDS, todo))
    for name in todo:
        print(f"{'added' if name in added else 'kept (exists)'} {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
