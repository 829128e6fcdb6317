"""What every script under ``benchmarks/`` shares: timing, the printed table and the JSON result.

* :func:`time_it` runs a function ``warmup`` times untimed, then ``repeats`` times timed, and gives a
  :class:`Timing` (every time, their minimum and median). :func:`summarize` makes one from times a
  script measured itself (a training loop's step times).
* :func:`time_rounds` times several functions in alternating rounds (A, B, C, A, B, C, ...), so a
  slower or busier machine late in the run hits them alike; :func:`ratio` compares two timings of
  the same run by their medians. Compare within one run: machines are noisy, runs on different days
  are not comparable. :func:`round_ratios` compares two configurations round by round (each
  round's own ratio, then their median): a machine that drifts between rounds moves neither.
* :func:`write_result` writes strict JSON (NaN refused) atomically to ``benchmarks/results/<name>.json``
  (or ``--out``), one file a benchmark, replaced by a rerun.
* :func:`format_table` / :func:`print_table` lay out rows (dicts) under columns.
* :func:`add_quick` and :func:`add_out` add the ``--quick`` and ``--out`` arguments with one wording.

Pure standard library (no torch), like :mod:`diloco.files`.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from diloco.files import write_json

#: ``benchmarks/results`` of the source tree this package is imported from (benchmarks run from a checkout).
RESULTS_DIR = Path(__file__).resolve().parents[3] / "benchmarks" / "results"


@dataclass(frozen=True)
class Timing:
    """Seconds of each timed repeat, in the order they ran; ``min`` and ``median`` of them."""

    all: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.all:
            raise ValueError("a Timing needs at least one time")

    @property
    def min(self) -> float:
        return min(self.all)

    @property
    def median(self) -> float:
        return statistics.median(self.all)

    @property
    def max(self) -> float:
        return max(self.all)

    def as_dict(self) -> dict[str, Any]:
        """``{"median_s", "min_s", "max_s", "all_s"}`` for a JSON result."""
        return {"median_s": self.median, "min_s": self.min, "max_s": self.max, "all_s": list(self.all)}


def summarize(times: Iterable[float]) -> Timing:
    """A :class:`Timing` of times measured by the caller (e.g. the step times of a training loop)."""
    return Timing(tuple(float(t) for t in times))


def time_it(
    fn: Callable[[], Any],
    *,
    repeats: int,
    warmup: int = 0,
    before: Callable[[], Any] | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> Timing:
    """Call ``fn()`` ``warmup`` times untimed, then ``repeats`` times, each timed alone with ``clock``.
    ``before()``, if given, runs untimed before each timed call (a barrier, so ranks start together)."""
    if repeats < 1 or warmup < 0:
        raise ValueError(f"repeats must be >= 1 and warmup >= 0, got repeats={repeats}, warmup={warmup}")
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        if before is not None:
            before()
        t0 = clock()
        fn()
        times.append(clock() - t0)
    return Timing(tuple(times))


def time_rounds(
    fns: Mapping[str, Callable[[], Any]],
    *,
    repeats: int,
    warmup: int = 0,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, Timing]:
    """Time each of ``fns`` ``repeats`` times in alternating rounds (every function once a round, in order),
    after ``warmup`` untimed rounds: drift over the run (a busy neighbour, a warm cache) hits all alike."""
    if repeats < 1 or warmup < 0:
        raise ValueError(f"repeats must be >= 1 and warmup >= 0, got repeats={repeats}, warmup={warmup}")
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = clock()
            fn()
            times[name].append(clock() - t0)
    return {name: Timing(tuple(t)) for name, t in times.items()}


def ratio(timing: Timing, baseline: Timing) -> float:
    """``timing.median / baseline.median``: above 1 is slower than the baseline (both from one run)."""
    return timing.median / baseline.median


def round_ratios(numerators: Sequence[float], denominators: Sequence[float]) -> tuple[list[float], float]:
    """Each round's ``numerators[r] / denominators[r]`` (two configurations measured in the same round r) and the
    median of those ratios. Unlike the ratio of the two medians, a round in which the machine was slower for both,
    or a disturbance that hit one configuration in one round, cannot move it past the other rounds' ratios."""
    if len(numerators) != len(denominators) or not numerators:
        raise ValueError(
            f"round_ratios needs one value of each configuration per round, got {len(numerators)} and "
            f"{len(denominators)}"
        )
    if any(d <= 0 for d in denominators):
        raise ValueError(f"round_ratios: denominators must be > 0, got {list(denominators)}")
    ratios = [n / d for n, d in zip(numerators, denominators, strict=True)]
    return ratios, statistics.median(ratios)


def machine() -> dict[str, Any]:
    """The machine a time was measured on, to quote beside it: Python, OS, processor, core count."""
    import os

    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
    }


def result_path(name: str) -> Path:
    """``benchmarks/results/<name>.json``."""
    return RESULTS_DIR / f"{name}.json"


def write_result(name: str, payload: Any, *, out: Path | str | None = None, quiet: bool = False) -> Path:
    """Write ``payload`` as strict JSON, atomically, to ``out`` or ``benchmarks/results/<name>.json``;
    says where (unless ``quiet``) and returns the path. NaN or infinity is refused: use ``None``."""
    path = Path(out) if out is not None else result_path(name)
    write_json(path, payload)
    if not quiet:
        print(f"wrote {path}")
    return path


#: A column: its header, the row key (or a function of the row), and a format spec (``""``, ``".2f"``, ...).
Column = tuple[str, "str | Callable[[Mapping[str, Any]], Any]", str]


def _cell(row: Mapping[str, Any], key: Any, spec: str) -> str:
    value = key(row) if callable(key) else row.get(key)
    if value is None:
        return "-"
    return format(value, spec) if spec else str(value)


def format_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[Column]) -> str:
    """The rows as a text table: a header line, then a line a row. Each column is as wide as its widest
    cell; text is left-aligned, numbers right-aligned; a missing value (``None``) prints as ``-``."""
    cells = [[_cell(row, key, spec) for _, key, spec in columns] for row in rows]
    numeric = [
        all(isinstance(key(r) if callable(key) else r.get(key), (int, float, type(None))) for r in rows)
        for _, key, _ in columns
    ]
    widths = [max([len(h)] + [len(c[i]) for c in cells]) for i, (h, _, _) in enumerate(columns)]

    def line(values: Sequence[str]) -> str:
        return " ".join(
            v.rjust(w) if num else v.ljust(w) for v, w, num in zip(values, widths, numeric, strict=True)
        ).rstrip()

    return "\n".join([line([h for h, _, _ in columns]), *(line(c) for c in cells)])


def print_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[Column], *, title: str | None = None) -> None:
    """Print :func:`format_table` (after ``title``, if given)."""
    if title:
        print(title)
    print(format_table(rows, columns))


def add_quick(ap: argparse.ArgumentParser, what: str = "a smoke run") -> None:
    """Add ``--quick``: a short run to check the script works, not a measurement to quote."""
    ap.add_argument("--quick", action="store_true", help=f"{what} (checks the script runs; not a figure to quote)")


def add_out(ap: argparse.ArgumentParser, name: str) -> None:
    """Add ``--out`` (a path), defaulting to ``benchmarks/results/<name>.json``."""
    ap.add_argument(
        "--out", type=Path, default=result_path(name), help=f"JSON result (default: benchmarks/results/{name}.json)"
    )


__all__ = [
    "RESULTS_DIR",
    "Column",
    "Timing",
    "add_out",
    "add_quick",
    "format_table",
    "machine",
    "print_table",
    "ratio",
    "result_path",
    "round_ratios",
    "summarize",
    "time_it",
    "time_rounds",
    "write_result",
]
