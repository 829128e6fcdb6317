"""The claims study's grids (``diloco.studies.claims``): the ablation from Streaming DiLoCo toward DiLoCo, then the
batch bracket of data-parallel and DiLoCo M = 1 and 2 (stage 1: seed 0, three inner lrs a batch).

    .venv/bin/python studies/claims/write_grids.py            # adds the ablation's and the batch bracket's grids
    .venv/bin/python studies/claims/write_grids.py --files    # grids/NAME.json for diloco sweep --grid; their paths

grids.jsonl holds every grid a sweep of the study ran, one line each; a grid in it is never rewritten.
"""

from __future__ import annotations

import sys

from diloco.studies.claims import GRIDS, HERE, ablation_grids, batch_grids
from diloco.studies.grid_files import append_grids, read_grids, write_grid_files


def main() -> int:
    args = sys.argv[1:]
    if args == ["--files"]:
        written = read_grids(
            GRIDS
        )  # in the study's order (seed-major ablation, then the batch bracket), not the file's
        for path in write_grid_files(
            GRIDS, HERE / "grids", [n for n in {**ablation_grids(), **batch_grids()} if n in written]
        ):
            print(path.relative_to(HERE.parents[1]))
        return 0
    if args:
        print("usage: write_grids.py [--files]", file=sys.stderr)
        return 2
    todo = {**ablation_grids(), **batch_grids()}
    added = set(append_grids(GRIDS, todo))
    for name in todo:
        print(f"{'added' if name in added else 'kept (exists)'} {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
