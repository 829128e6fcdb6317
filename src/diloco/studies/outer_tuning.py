"""The outer-tuning study's records and grids (studies/outer-tuning): one records file for its CPU runs, written by
``diloco sweep``, and one grids file; each part of the study (the staged search, the long runs, the token budgets)
reads its own runs from the records by the runs folder its grids gave them."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

from diloco.studies import STUDIES

HERE = STUDIES / "outer-tuning"
RESULTS = HERE / "results-cpu.jsonl"
GRIDS = HERE / "grids.jsonl"

#: part -> the runs folders of its grids (``base.runs_dir``)
PARTS = {
    "search": re.compile(r"runs/outer-tuning/s\d+-"),
    "long": re.compile(r"runs/outer-tuning/long-"),
    "budget": re.compile(r"runs/outer-tuning/budget-"),
    "corpus-check": re.compile(r"runs/outer-tuning/corpus-check"),
}


def part_of(rec: dict) -> str | None:
    """Which part of the study a record belongs to (None: none)."""
    runs_dir = rec.get("base", {}).get("runs_dir", "")
    return next((name for name, pattern in PARTS.items() if pattern.match(runs_dir)), None)


def records(*parts: str, path=RESULTS) -> Iterator[dict]:
    """The records of the parts named (all parts if none), in the file's order; a line being written is skipped."""
    if not path.exists():
        return
    for line in path.read_text().splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if not parts or part_of(rec) in parts:
            yield rec


def method_key(rec: dict) -> str:
    """One name per method of the search: dp, diloco-m1-h30, diloco-m2-h10, streaming-m2-h30-fp4_e3m0, ..."""
    if rec["method"] == "dp":
        return "dp"
    key = f"{rec['method']}-m{rec['replicas']}-h{rec['sync_every']}"
    return key + (f"-{rec['base']['codec']}" if rec["method"] == "streaming" else "")
