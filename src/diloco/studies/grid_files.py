"""A study's grids in one file: ``grids.jsonl``, one line per grid file that a sweep ran (``{"name": ..., "grid":
...}``, the name relative to the study's ``grids/`` folder). ``diloco sweep --grid`` reads grid files, so
:func:`write_grid_files` writes them back into ``grids/`` (not in git) exactly as they were written."""

from __future__ import annotations

import json
from pathlib import Path


def train_grid(
    comment: str,
    *,
    size: str,
    batch: int,
    method: str,
    replicas: int,
    sync_every: list[int],
    outer_lr: list[float],
    inner_lr: list[float],
    seed: int,
    base: dict,
) -> dict:
    """A study's grid of ``diloco train`` runs (``diloco sweep --grid``): one size, batch, method and replica count at
    20 tokens per parameter, swept over H, the outer lr and the inner lr; ``base`` is every other config setting."""
    return {
        "_comment": comment,
        "runner": "train",
        "sizes": [size],
        "global_batch": [batch],
        "tokens_per_param": 20.0,
        "seed": seed,
        "methods": [method],
        "replicas": [replicas],
        "sync_every": list(sync_every),
        "outer_lr": list(outer_lr),
        "inner_lr": list(inner_lr),
        "base": base,
    }


def grid_text(grid: dict) -> str:
    """A grid file's text, as every grid writer of the studies writes it."""
    return json.dumps(grid, indent=1) + "\n"


def read_grids(path: Path) -> dict[str, dict]:
    """``{name: grid}`` from a ``grids.jsonl``, in its order."""
    out = {}
    for line in Path(path).read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            assert row["name"] not in out, f"{path}: grid {row['name']} twice"
            out[row["name"]] = row["grid"]
    return out


def append_grids(path: Path, grids: dict[str, dict]) -> list[str]:
    """Adds the grids not yet in ``path`` (a grid a sweep ran is a record: never rewritten); returns their names."""
    path = Path(path)
    have = read_grids(path) if path.exists() else {}
    new = [name for name in grids if name not in have]
    if new:
        with path.open("a") as f:
            for name in new:
                f.write(json.dumps({"name": name, "grid": grids[name]}) + "\n")
    return new


def write_grid_files(path: Path, folder: Path, names: list[str] | None = None) -> list[Path]:
    """Writes each grid of ``path`` (or those named) to ``folder/NAME.json`` unless that file exists; returns the
    paths of all of them, written or kept, in the file's order."""
    grids = read_grids(path)
    out = []
    for name in names if names is not None else grids:
        target = Path(folder) / f"{name}.json"
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(grid_text(grids[name]))
        out.append(target)
    return out
