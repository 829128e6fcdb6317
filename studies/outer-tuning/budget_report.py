"""The gap against tokens per parameter from finished runs: each run's cosine schedule completes at
its own budget, so its final gap is what a user training for that many tokens gets (the gap read off a long
run's curve mid-way is not: its lr is still high there).

    .venv/bin/python studies/outer-tuning/budget_report.py write      # budget-* grids into grids.jsonl
    TC=/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4
    LD_PRELOAD=$TC .venv/bin/python -m diloco sweep $(.venv/bin/python studies/outer-tuning/stages.py grids \
        budget- | sed 's/^/--grid /') --out studies/outer-tuning/results-cpu.jsonl --workers 2
    .venv/bin/python studies/outer-tuning/budget_report.py            # table, budget-summary.json, budget.png

The settings are the cpu-0.25m long runs' at inner lr 8e-3, DP and Streaming alike, and DP also at 1.6e-2 (its best
at 20 tokens per parameter; grids `budget-*-dp-lr0.016-*`): each Streaming run is reported against DP at
the same lr and against DP at its best lr at that budget;
the 20 tokens-per-parameter point is those long runs (their records in results-cpu.jsonl / long-summary.json).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from diloco.studies.grid_files import append_grids, read_grids
from diloco.studies.outer_tuning import GRIDS, HERE, records

SIZE = "cpu-0.25m"
BUDGETS = (5.0, 10.0, 40.0)  # tokens per parameter, beside the long runs' 20
SOURCES = {  # method key -> the long run's grid whose settings every budget takes
    "dp": f"long-{SIZE}-dp-lr0.008-seed0",
    "streaming-m2-h30-fp4_e3m0": f"long-{SIZE}-streaming-m2-h30-fp4_e3m0-paper-lr0.008-seed0",
    "streaming-m2-h100-fp4_e3m0": f"long-{SIZE}-streaming-m2-h100-fp4_e3m0-lr0.008-seed0",
}
SUMMARY = HERE / "budget-summary.json"
TARGETS = {"streaming-m2-h30-fp4_e3m0": 1.0, "streaming-m2-h100-fp4_e3m0": 1.5}  # the study's loss targets, % vs DP


def write() -> list[str]:
    have, todo = read_grids(GRIDS), {}
    for key, src in SOURCES.items():
        grid = have[src]
        for tpp in BUDGETS:
            todo[f"budget-{SIZE}-{key}-tpp{tpp:g}"] = {
                **grid,
                "_comment": f"Gap against the token budget: {src}'s settings at {tpp:g} tokens per "
                "parameter (the cosine schedule completes at this budget).",
                "tokens_per_param": tpp,
                "base": {**grid["base"], "runs_dir": f"runs/outer-tuning/budget-{SIZE}"},
            }
    return append_grids(GRIDS, todo)  # a grid a sweep ran is a record: never rewritten


def _key(rec: dict) -> str | None:
    """The method key of a result line, for the settings this study compares (None for any other run)."""
    if rec.get("status") != "ok" or rec.get("size") != SIZE:
        return None
    base = rec.get("base", {})
    if rec["method"] == "dp":  # DP at every lr: the reference at the same lr (8e-3) and DP's best
        return "dp" if rec["inner_lr"] == 0.008 else "dp-other-lr"
    if rec.get("inner_lr") != 0.008:
        return None
    if rec["method"] == "streaming" and base.get("codec") == "fp4_e3m0" and base.get("outer_momentum") == 0.9:
        if rec["sync_every"] == 30 and rec["outer_lr"] == 0.7:
            return "streaming-m2-h30-fp4_e3m0"
        if rec["sync_every"] == 100 and rec["outer_lr"] == 1.0:
            return "streaming-m2-h100-fp4_e3m0"
    return None


def collect() -> dict[str, dict[float, list[float]]]:
    """{method key: {tokens per parameter: final eval losses (one per run)}} from the budget runs, the long runs
    and the corpus check (every run but the staged search's)."""
    out: dict[str, dict[float, list[float]]] = {}
    for rec in records("budget", "corpus-check", "long"):
        key = _key(rec)
        if key is None or rec.get("eval_loss") is None:
            continue
        tpp = round(rec["tokens"] / rec["num_params"], 1)
        out.setdefault(key, {}).setdefault(tpp, []).append(rec["eval_loss"])
    return out


def gaps(runs: dict[str, dict[float, list[float]]]) -> list[dict]:
    """Per method and budget with a finished DP run at the same budget: the final gap to DP (%)."""
    rows = []
    dp, other = runs.get("dp", {}), runs.get("dp-other-lr", {})
    for key in sorted(k for k in runs if not k.startswith("dp")):
        for tpp in sorted(runs[key]):
            if tpp not in dp:
                continue
            ref = min(dp[tpp])
            best = min(dp[tpp] + other.get(tpp, []))  # DP at its best lr among those run at this budget
            for loss in runs[key][tpp]:
                rows.append(
                    {
                        "key": key,
                        "tokens_per_param": tpp,
                        "eval_loss": loss,
                        "dp_eval_loss": ref,
                        "gap_pct": 100 * (loss / ref - 1),
                        "best_dp_eval_loss": best,
                        "gap_best_dp_pct": 100 * (loss / best - 1),
                    }
                )
    return rows


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for i, key in enumerate(sorted({r["key"] for r in rows})):
        mine = [r for r in rows if r["key"] == key]
        ax.plot(
            [r["tokens_per_param"] for r in mine], [r["gap_pct"] for r in mine], "o", color=f"C{i}", alpha=0.5, ms=4
        )  # every seed
        by: dict[float, list[float]] = {}
        for r in mine:
            by.setdefault(r["tokens_per_param"], []).append(r["gap_pct"])
        tpp = sorted(by)
        ax.plot(tpp, [sum(by[t]) / len(by[t]) for t in tpp], "o-", color=f"C{i}", label=f"{key} (mean over seeds)")
        best: dict[float, list[float]] = {}
        for r in mine:
            best.setdefault(r["tokens_per_param"], []).append(r["gap_best_dp_pct"])
        ax.plot(
            tpp,
            [sum(best[t]) / len(best[t]) for t in tpp],
            "s--",
            color=f"C{i}",
            ms=4,
            alpha=0.8,
            label=f"{key}, against DP at its best lr",
        )
        if key in TARGETS:
            ax.axhline(TARGETS[key], color=f"C{i}", ls=":", lw=1, label=f"target for {key}")
    ax.axhline(0, color="k", lw=0.8)
    ax.axvline(20, color="grey", ls="--", lw=0.8, label="the papers' budget (20)")
    budgets = sorted({r["tokens_per_param"] for r in rows})
    ax.set_xscale("log")
    ax.set_xticks(budgets, [f"{b:g}" for b in budgets])
    ax.minorticks_off()
    ax.set(
        xlabel="tokens per parameter (each run's schedule completes there)",
        ylabel="final eval loss vs DP (%)",
        title=f"{SIZE}: the gap against the token budget (Streaming at inner lr 8e-3)",
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str]) -> int:
    if argv == ["write"]:
        written = write()
        print("wrote " + (", ".join(written) if written else "nothing (every grid exists)"))
        return 0
    if argv:
        print(f"unknown arguments {argv}: use no argument (the report) or 'write' (the grids)", file=sys.stderr)
        return 2
    runs = collect()
    rows = gaps(runs)
    if not rows:
        print("no finished budget runs yet (budget_report.py write; then the sweep in this file's docstring)")
        return 1
    print(f"{SIZE}: final eval loss against DP at the same token budget (each run's schedule completes there)")
    print(
        f"{'method':<28} {'tokens/param':>12} {'eval loss':>9} {'DP 8e-3':>8} {'vs DP':>8} {'best DP':>8} "
        f"{'vs best':>8}  (one line per run)"
    )
    for r in rows:
        print(
            f"{r['key']:<28} {r['tokens_per_param']:>12g} {r['eval_loss']:>9.4f} {r['dp_eval_loss']:>8.4f} "
            f"{r['gap_pct']:>+7.2f}% {r['best_dp_eval_loss']:>8.4f} {r['gap_best_dp_pct']:>+7.2f}%"
        )
    SUMMARY.write_text(json.dumps({"size": SIZE, "rows": rows}, indent=1, allow_nan=False) + "\n")
    plot(rows, HERE / "budget.png")
    print(f"\nwrote {SUMMARY} and {HERE / 'budget.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
