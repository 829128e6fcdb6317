"""The claims study's grids (``diloco.studies.claims``): the ablation from Streaming DiLoCo toward DiLoCo, then the
batch bracket of data-parallel and DiLoCo M = 1 and 2 (stage 1: seed 0, three inner lrs a batch; then, from its
records, a wider bracket where a best lr or batch sits at an edge, and stage 2: more seeds at each method's best
batch and its neighbours).

    .venv/bin/python studies/claims/write_grids.py            # adds the ablation's and the batch bracket's grids
    .venv/bin/python studies/claims/write_grids.py --next     # adds what the batch bracket needs next (from results)
    .venv/bin/python studies/claims/write_grids.py --check C  # adds a check of the bracket's slope: wd, clip or beta2
    .venv/bin/python studies/claims/write_grids.py --common   # adds what claim 3 on one validation set needs next
    .venv/bin/python studies/claims/write_grids.py --files    # grids/NAME.json for diloco sweep --grid; their paths

grids.jsonl holds every grid a sweep of the study ran, one line each; a grid in it is never rewritten. ``--files``
lists them in the study's order: the ablation seed-major, the batch bracket's stage 1, then what ``--next`` added.
"""

from __future__ import annotations

import sys

from diloco.files import read_jsonl
from diloco.studies.claims import (
    GRIDS,
    HERE,
    SLOPE_CHECKS,
    ablation_grids,
    batch_grids,
    batch_next_grids,
    check_grids,
)
from diloco.studies.claims_common import REEVAL, common_grids, common_next_grids, has_final_checkpoint
from diloco.studies.grid_files import append_grids, read_grids, write_grid_files


def main() -> int:
    args = sys.argv[1:]
    if args == ["--files"]:
        written = read_grids(GRIDS)
        first = [n for n in {**ablation_grids(), **batch_grids()} if n in written]
        order = first + [n for n in written if n not in set(first)]
        for path in write_grid_files(GRIDS, HERE / "grids", order):
            print(path.relative_to(HERE.parents[1]))
        return 0
    results = HERE / "results.jsonl"
    if args == ["--next"]:
        todo = batch_next_grids(read_jsonl(results) if results.exists() else [])
        if not todo:
            print("nothing to add: a method's stage 1 is unfinished, or its stage 2 grids are all there")
    elif args == ["--common"]:
        records = read_jsonl(results) if results.exists() else []
        reeval = read_jsonl(REEVAL) if REEVAL.exists() else []
        todo = {
            **common_grids(records, has_final_checkpoint),
            **common_next_grids(records, reeval, has_final_checkpoint),
        }
        if not todo:
            print("nothing to add: the reruns are there, and what follows waits for them (and reeval.py)")
    elif len(args) == 2 and args[0] == "--check":
        if args[1] not in SLOPE_CHECKS:
            print(f"unknown check {args[1]!r}: one of {', '.join(SLOPE_CHECKS)}", file=sys.stderr)
            return 2
        todo = check_grids(read_jsonl(results) if results.exists() else [], args[1])
        if not todo:
            print("nothing to add: no method has both ends of its stage 1 yet")
    elif args:
        print(
            f"usage: write_grids.py [--next | --check {{{'|'.join(SLOPE_CHECKS)}}} | --common | --files]",
            file=sys.stderr,
        )
        return 2
    else:
        todo = {**ablation_grids(), **batch_grids()}
    added = set(append_grids(GRIDS, todo))
    for name in todo:
        print(f"{'added' if name in added else 'kept (exists)'} {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
