"""The frontier's brackets on one CUDA GPU: the CPU grids' runs, unchanged but for the device and the data files.

    .venv/bin/python studies/frontier/gpu_grids.py [SIZE]          # the first stage: adds the grids gpu/* to
                                                                   # grids.jsonl, writes grids/gpu/*.json, prints them
    .venv/bin/python studies/frontier/gpu_grids.py [SIZE] --next   # also the second stage, from results-gpu.jsonl

The grids are ``diloco.studies.frontier.gpu_grids`` and ``next_stage`` (what each stage holds is said there). Their
records go to results-gpu.jsonl, a set of its own: a GPU run and a CPU run of one point differ in rounding, so each
method's gap is taken against DP on the same device. gpu-stage2-order.txt lists the second stage as it ran (the
first stage's grids, done, then the new ones); gpu-stage3-order.txt the third, written from the second's results
by hand: seeds 3 and 4 of DP, Streaming and eager and seed 2 of the others at their best, and the lr below four
bests that still sat at the low edge (none of them at a method's best batch). ``write_grids.py --files gpu/``
writes every GPU grid that ran. A grid already in grids.jsonl is never rewritten.
"""

from __future__ import annotations

import json
import sys

from diloco.studies.frontier import GRIDS, HERE, gpu_grids, next_stage
from diloco.studies.grid_files import append_grids, write_grid_files


def main() -> int:
    args = [a for a in sys.argv[1:] if a != "--next"]
    size = args[0] if args else "cpu-1m"
    todo = gpu_grids(size)
    if "--next" in sys.argv[1:]:
        records = [json.loads(line) for line in (HERE / "results-gpu.jsonl").read_text().splitlines() if line.strip()]
        todo |= next_stage(size, records)
    names = [f"gpu/{name}" for name in todo]
    append_grids(GRIDS, {f"gpu/{name}": grid for name, grid in todo.items()})
    for path in write_grid_files(GRIDS, HERE / "grids", names):
        print(path.relative_to(HERE.parents[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
