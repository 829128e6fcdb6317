"""The claims study's tables as docs/results/index.md shows them (``studies/claims/report.py`` prints them; a test
holds the docs equal to what the records give), built from :mod:`diloco.studies.claims`' tables."""

from __future__ import annotations

from diloco.studies.claims import (
    BRACKET_SEED,
    SLOPE_CHECKS,
    STAGE_SEEDS,
    ablation_table,
    against_dp,
    batch_table,
    check_table,
)
from diloco.studies.claims_common import COMMON_EVAL, common_table

#: how the docs name the ablation's points and the bracket's methods
POINT_LABELS = {
    "streaming-fp4": "Streaming FP4 (the reference: P = 3, τ = 1, FP4 E3M0, α = 0.5, outer 0.7 / 0.9)",
    "P1": "P = 3 → 1",
    "tau0": "τ = 1 → 0",
    "fp32": "FP4 → fp32",
    "alpha0": "α = 0.5 → 0",
    "alpha1": "α = 0.5 → 1",
    "diloco": "DiLoCo at Streaming's outer optimizer (0.7 / 0.9)",
    "diloco-tuned": "DiLoCo at its own best outer momentum (0.7 / 0.5)",
}
METHOD_LABELS = {"dp": "data-parallel", "diloco-m1": "DiLoCo M = 1", "diloco-m2": "DiLoCo M = 2"}


def _pct(v: float | None, se: float | None) -> str:
    if v is None:
        return "–"
    sign = "−" if v < 0 else "+"
    return f"{sign}{abs(v):.2f}" + (f" ± {se:.2f} %" if se is not None else " %")


def _loss(mean: float, se: float | None) -> str:
    return f"{mean:.4f}" + (f" ± {se:.4f}" if se is not None else "")


def ablation_markdown(rows: list[dict]) -> list[str]:
    """The ablation's table as the docs show it (``studies/claims/report.py`` prints it): one line per point."""
    lines = [
        "| point | seeds | eval loss (mean ± s.e.) | against Streaming FP4 | against DiLoCo tuned |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {POINT_LABELS[r['factor']]} | {len(r['seeds'])} | {_loss(r['mean'], r['se'])} | "
            f"{_pct(r['vs_streaming_pct'], r['vs_streaming_se_pct'])} | "
            f"{_pct(r['vs_diloco_tuned_pct'], r['vs_diloco_tuned_se_pct'])} |"
        )
    return lines


def _best_note(t: dict, batch: int) -> str:
    if batch != t["best_batch"]:
        return ""
    fitted, batches = t["fitted_best_batch"], sorted(t["batches"])
    where = (
        f", fitted {fitted:.0f}"
        if fitted is not None
        else " (the largest run)"
        if batch == batches[-1]
        else " (the smallest run)"
        if batch == batches[0]
        else ""
    )
    return f" **best batch{where}**"


def common_markdown(table: dict[str, dict]) -> list[str]:
    """Claim 3 on one validation set as the docs show it: per method and batch, the lr (chosen on the batch's own
    set), the loss at the bracket seed and the mean over ``STAGE_SEEDS`` on the common windows; the best batch
    marked, with the fitted one."""
    seeds = f"{STAGE_SEEDS[0]}–{STAGE_SEEDS[-1]}"
    lines = [
        f"| method | batch | inner lr | eval loss on the first {COMMON_EVAL} validation windows, seed {BRACKET_SEED} | "
        f"seeds {seeds} | mean ± s.e. |",
        "|---|---|---|---|---|---|",
    ]
    for name, t in table.items():
        for batch, b in t["batches"].items():
            lines.append(
                f"| {METHOD_LABELS[name]} | {batch} | {b['lr']:.3g} | {b['bracket_loss']:.4f} | {len(b['stage_seeds'])} | "
                f"{_loss(b['stage_mean'], b['stage_se'])}{_best_note(t, batch)} |"
            )
    return lines


def batch_markdown(table: dict[str, dict]) -> list[str]:
    """The batch bracket's table as the docs show it: per method and batch, the loss at each inner lr at the bracket
    seed, the best lr (and, where a tied runner-up has the lower mean over ``STAGE_SEEDS``, that one), and the mean
    over ``STAGE_SEEDS`` at it; the best batch marked, with the fitted one."""
    seeds = f"{STAGE_SEEDS[0]}–{STAGE_SEEDS[-1]}"
    lines = [
        f"| method | batch | eval loss per inner lr (seed {BRACKET_SEED}) | best inner lr | seeds {seeds} at it | "
        "eval loss at it (mean ± s.e.) |",
        "|---|---|---|---|---|---|",
    ]
    for name, t in table.items():
        for batch, b in t["batches"].items():
            lrs = ", ".join(f"{lr:.3g}: {b['losses'][lr][BRACKET_SEED]:.4f}" for lr in b["bracket_lrs"])
            edge = " (the bracket's edge)" if b["best_at_edge"] else ""
            if b["stage_lr"] != b["best_lr"]:
                edge += f"; by seeds {seeds}: {b['stage_lr']:.3g}"
            lines.append(
                f"| {METHOD_LABELS[name]} | {batch} | {lrs} | {b['best_lr']:.3g}{edge} | {len(b['stage_seeds'])} | "
                f"{_loss(b['stage_mean'], b['stage_se'])}{_best_note(t, batch)} |"
            )
    return lines


def against_dp_markdown(rows: list[dict]) -> list[str]:
    """Claim 2 with seeds, as the docs show it: each DiLoCo method against data-parallel at each batch both ran."""
    lines = ["| method | batch | seeds | against data-parallel (mean ± s.e.) |", "|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {METHOD_LABELS[r['method']]} | {r['batch']} | {len(r['seeds'])} | {_pct(r['pct'], r['se_pct'])} |"
        )
    return lines


def checks_markdown(rows: list[dict]) -> list[str]:
    """The slope checks as the docs show them: per method and batch, the loss (seed 0, best lr) in the bracket and
    with each check's setting, and the change."""
    heads = " | ".join(words for _setting, _value_at, words in SLOPE_CHECKS.values())
    lines = [
        f"| method | batch | inner lr | eval loss, the bracket (seed {BRACKET_SEED}) | {heads} |",
        "|---|---|---|---|" + "---|" * len(SLOPE_CHECKS),
    ]
    for r in rows:
        cells = []
        for check in SLOPE_CHECKS:
            c = r["checks"][check]
            if c is None:
                cells.append("not run yet")
            elif c["is_bracket"]:
                cells.append("the bracket's setting")
            else:
                change = _pct(100 * (c["loss"] - r["bracket"]) / r["bracket"], None)
                cells.append(f"{c['loss']:.4f} at {c['value']:.4g} ({change})")
        lines.append(
            f"| {METHOD_LABELS[r['method']]} | {r['batch']} | {r['inner_lr']:.3g} | {r['bracket']:.4f} | "
            + " | ".join(cells)
            + " |"
        )
    return lines


def docs_tables(records: list[dict], reeval: list[dict]) -> dict[str, list[str]]:
    """The study's five tables as docs/results/index.md shows them, from its records and its re-evaluations on one
    validation set, by title: the ablation, the batch bracket on one validation set and as run, claim 2 with seeds,
    and the slope checks."""
    table = batch_table(records)
    return {
        "Claim 1, the ablation": ablation_markdown(ablation_table(records)),
        "Claim 3, the batch bracket on one validation set": common_markdown(common_table(records, reeval)),
        "Claim 3, the batch bracket as run (each batch on its own validation windows)": batch_markdown(table),
        "Claim 2 with seeds, from the bracket": against_dp_markdown(against_dp(table)),
        "The slope checks (one setting changed at both ends of the bracket)": checks_markdown(check_table(records)),
    }
