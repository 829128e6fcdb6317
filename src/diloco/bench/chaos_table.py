"""The chaos benchmark's table (``benchmarks/chaos.py``): its columns, each a pure function of one stored row, and
the paired loss difference over seeds that its trainer-loop section prints.

A row is one run: ``method``, ``M``, ``fault``, ``eval_loss``, ``wall_s``, ``goodput``; for a decoupled run on
Ray also ``wait_share`` (each learner's share of its step time spent waiting for replies,
:func:`diloco.decoupled.chaos_logs.wait_shares`), ``kills`` (per learner kill), ``syncer_kills`` (per syncer
kill), ``versions_contiguous``; ``loop`` is ``"trainer"`` where the learners ran the trainer (rows stored before
that have none: the earlier plain loop) and ``seed`` where the run named one.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

Row = Mapping[str, Any]
#: Rows whose learners are not decoupled learners on Ray: data-parallel under TorchElastic and torchft's DiLoCo.
OWN_LOOP_METHODS = ("dp", "dp-ckpt16", "torchft")


def _fmt(x: Any, spec: str = ".3f") -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def loop_text(r: Row) -> str | None:
    """Which loop the learners ran: ``trainer`` (the row says so) or ``plain`` (a decoupled or sync row stored
    without it); None for rows with their own loop (:data:`OWN_LOOP_METHODS`)."""
    return None if r["method"] in OWN_LOOP_METHODS else r.get("loop", "plain")


def mean_wait(r: Row) -> float | None:
    """The learners' mean waiting share (learners without a step left out); None without one."""
    shares = [float(x) for x in r.get("wait_share") or () if x is not None]
    return sum(shares) / len(shares) if shares else None


def wait_text(r: Row) -> str | None:
    """The mean waiting share and, in brackets, each learner's, in %."""
    shares = r.get("wait_share")
    if not shares:
        return None
    return f"{_fmt(mean_wait(r), '.1%')} ({' '.join(_fmt(x, '.1%') for x in shares)})"


def kills_text(r: Row) -> str | None:
    """Per learner kill: the survivors' worst step ÷ typical, steps kept, restart s, rejoin s (and, for
    data-parallel, the steps redone and seconds until the run is past where it was)."""
    return (
        "; ".join(
            f"{_fmt(k['worst_step_ratio'], '.1f')}x {_fmt(k['steps_kept'], '.0%')} "
            f"{_fmt(k['restart_s'], '.1f')} {_fmt(k['rejoin_s'], '.1f')}"
            + (
                f" (redone {k['redone_steps']}, past it {_fmt(k['caught_up_s'], '.1f')} s)"
                if "redone_steps" in k
                else ""
            )
            for k in r.get("kills") or ()
        )
        or None
    )


def syncer_kill_text(r: Row) -> str | None:
    """Per syncer kill: the learners' worst step ÷ typical in the 10 s after it, seconds down, merges the
    restarted syncer held of those made before; then whether each fragment's versions run without a gap."""
    if not r.get("syncer_kills"):
        return None
    kills = "; ".join(
        f"{_fmt(k['worst_step_ratio'], '.1f')}x, {k['down_s']:.1f} s down, {k['restored_merges']} of "
        f"{k['merges_before']} merges kept"
        for k in r["syncer_kills"]
    )
    gap = r.get("versions_contiguous")
    return kills + ("" if gap is None else ", versions without a gap" if gap else ", a version missing")


def guard_text(r: Row) -> str | None:
    if r.get("corrupted_reports") is None or not r["fault"].startswith("corrupt"):
        return None
    return f"corrupted reports {r['corrupted_reports']}, guard events {r['guard_events']}"


COLUMNS = [
    ("loop", loop_text, ""),
    ("method", "method", ""),
    ("M", "M", ""),
    ("faults", "fault", ""),
    ("loss", "eval_loss", ".4f"),
    ("wall s", "wall_s", ".1f"),
    ("goodput", "goodput", ".2f"),
]
SEED_COLUMN = ("seed", "seed", "")
WAIT_COLUMN = ("waiting: mean (per learner)", wait_text, "")
SYNCER_COLUMN = ("syncer kill: worst step x, down, merges kept", syncer_kill_text, "")
KILLS_COLUMN = ("per kill: worst step x, steps kept, restart s, rejoin s", kills_text, "")
GUARD_COLUMN = ("guard", guard_text, "")


def columns_for(rows: Sequence[Row]) -> list:
    """:data:`COLUMNS`, with the seed, waiting, kill, syncer-kill and guard columns where a row has them."""
    return (
        COLUMNS[:2]
        + [SEED_COLUMN] * any("seed" in r for r in rows)
        + COLUMNS[2:]
        + [WAIT_COLUMN] * any(map(wait_text, rows))
        + [KILLS_COLUMN] * any(r.get("kills") for r in rows)
        + [SYNCER_COLUMN] * any(map(syncer_kill_text, rows))
        + [GUARD_COLUMN] * any(map(guard_text, rows))
    )


def paired_difference(
    rows: Sequence[Row], *, base: tuple[str, str], other: tuple[str, str], M: int, key: str = "eval_loss"
) -> tuple[float, float | None, int] | None:
    """``other``'s ``key`` minus ``base``'s, each a (method, fault) at ``M``, paired by seed: the mean difference,
    its standard error (None for one pair) and the number of pairs; None without a pair."""
    by = {(r["method"], r["fault"], r.get("seed")): r for r in rows if r["M"] == M}
    diffs = [
        float(by[(*other, s)][key]) - float(r[key])
        for (m, f, s), r in sorted(by.items(), key=lambda kv: str(kv[0]))
        if (m, f) == base and (*other, s) in by
    ]
    if not diffs:
        return None
    se = statistics.stdev(diffs) / math.sqrt(len(diffs)) if len(diffs) > 1 else None
    return statistics.fmean(diffs), se, len(diffs)


__all__ = [
    "COLUMNS",
    "OWN_LOOP_METHODS",
    "columns_for",
    "guard_text",
    "kills_text",
    "loop_text",
    "mean_wait",
    "paired_difference",
    "syncer_kill_text",
    "wait_text",
]
