"""Reproduce Decoupled DiLoCo's Table 1 (goodput under chip failures) with `diloco.sim.goodput`.

    .venv/bin/python benchmarks/goodput_table1.py            # ~2 s

Prints our Table 1 beside the paper's (ours / paper, and the difference in goodput points), the
Monte-Carlo of every cell (mean ± standard error), the fit of the two constants, and the rule of
thumb (decoupled M on N chips against elastic DP on N / M chips) in the paper's own numbers.
Writes benchmarks/results/goodput_table1.json and benchmarks/results/goodput_table1.png
(goodput against chips: ours as lines, the paper's as points).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from diloco.bench import write_result
from diloco.files import atomic_write_with
from diloco.sim.goodput import FailureModel, cluster_mtbf_hours, goodput_table
from diloco.sim.goodput_mc import simulate_goodput
from diloco.sim.goodput_paper import (
    TABLE1_CHIPS,
    TABLE1_LEARNERS,
    TABLE1_PAPER,
    fit_table1,
    reproduce_table1,
    rule_of_thumb_gap,
)

RESULTS = Path(__file__).resolve().parent / "results"


def _chips(n: int) -> str:
    return f"{n / 1e6:g}M" if n >= 1e6 else f"{n / 1e3:g}k"


def _method(row: str) -> tuple[str, int]:
    if row.startswith("decoupled_M"):
        return "decoupled", int(row.removeprefix("decoupled_M"))
    return row, 1


def monte_carlo(model: FailureModel, *, failures_per_unit: float, num_runs: int, seed: int) -> dict[str, list]:
    out = {}
    for i, row in enumerate(TABLE1_PAPER):
        method, learners = _method(row)
        out[row] = [
            simulate_goodput(
                method,
                chips=n,
                learners=learners,
                model=model,
                failures_per_unit=failures_per_unit,
                num_runs=num_runs,
                seed=seed + 10 * i + j,
            )
            for j, n in enumerate(TABLE1_CHIPS)
        ]
    return out


def plot(result: dict, model: FailureModel, path: Path) -> Path:
    import numpy as np
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7.0, 4.6), dpi=120)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    chips = [c / 1e3 for c in result["chips"]]
    dense = np.geomspace(result["chips"][0] / 1.3, result["chips"][-1] * 1.3, 60)
    curves = goodput_table(dense, TABLE1_LEARNERS, model)
    for i, row in enumerate(result["rows"]):
        color = f"C{i}"
        ax.plot(dense / 1e3, [100 * g for g in curves[row["row"]]], color=color, lw=1.6, label=f"{row['label']} (ours)")
        ax.scatter(chips, row["paper"], color=color, marker="o", s=28, edgecolor="k", linewidth=0.5, zorder=5)
    ax.scatter([], [], color="0.6", marker="o", edgecolor="k", linewidth=0.5, label="the paper's Table 1 (points)")
    ax.set_xscale("log")
    ax.set_xticks(chips, [_chips(c) for c in result["chips"]])
    ax.minorticks_off()
    ax.set_xlabel("chips (MTBI per chip 1 year)")
    ax.set_ylabel("goodput (%)")
    ax.set_ylim(0, 100)
    ax.set_title(
        "Goodput under chip failures: diloco.sim.goodput (lines) vs Decoupled DiLoCo Table 1 (points)", fontsize=8
    )
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_with(path, lambda fh: fig.savefig(fh, format="png"))
    return path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--failures", type=float, default=400, help="Monte-Carlo: failures per unit per run (400)")
    ap.add_argument("--runs", type=int, default=16, help="Monte-Carlo: independent runs per cell (16)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-plot", action="store_true")
    args = ap.parse_args()

    model = FailureModel()
    t0 = time.perf_counter()
    result = reproduce_table1(model)
    closed_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    mc = monte_carlo(model, failures_per_unit=args.failures, num_runs=args.runs, seed=args.seed)
    mc_s = time.perf_counter() - t0

    m = model
    print(
        f"model: chip MTBI {m.chip_mtbi_hours:g} h (1 year); recovery lognormal, median {m.recovery_median_s:g} s, "
        f"sigma {m.recovery_sigma:g} (mean {m.recovery_mean_s:.1f} s); checkpoint every "
        f"{m.checkpoint_interval_s:g} s of running (0: every step); re-scale {m.downscale_s:g} s down + "
        f"{m.upscale_s:g} s up; slice {m.slice_chips:g} chips"
    )
    print("cluster MTBF: " + ", ".join(f"{_chips(n)} {cluster_mtbf_hours(n) * 3600:.0f} s" for n in TABLE1_CHIPS))
    print("\nTable 1, goodput %: ours / paper (ours - paper); Monte-Carlo mean ± standard error below")
    print(f"{'':<30}" + "".join(f"{_chips(n):>20}" for n in TABLE1_CHIPS))
    worst_sigmas = 0.0
    for row in result["rows"]:
        print(
            f"{row['label']:<30}"
            + "".join(f"{o:>9.1f} / {p:<2d} ({d:+4.1f})" for o, p, d in zip(row["ours"], row["paper"], row["diff"]))
        )
        cells = mc[row["row"]]
        print(f"{'  Monte-Carlo':<30}" + "".join(f"{100 * c.mean:>12.1f} ± {100 * c.stderr:<5.2f}" for c in cells))
        row["monte_carlo"] = [{"mean": 100 * c.mean, "stderr": 100 * c.stderr} for c in cells]
        worst_sigmas = max(
            worst_sigmas, *(abs(100 * c.mean - o) / (100 * c.stderr) for c, o in zip(cells, row["ours"]))
        )
    print(
        f"\n{result['cells_within_tolerance']}/{result['cells']} cells within {result['tolerance_points']:g} points; "
        f"max |diff| {result['max_abs_diff']:.1f}, mean {result['mean_abs_diff']:.2f}. Monte-Carlo vs closed form: "
        f"largest gap {worst_sigmas:.1f} standard errors ({args.runs} runs x {args.failures:g} failures per unit)"
    )

    fit = fit_table1()
    print(
        f"\nfit (minimax, 0.5 s grid): mean recovery {fit['recovery_mean_s']:g} s on the DP row (worst "
        f"{fit['dp_row_max_abs_diff']:.1f} points); re-scale t_down + t_up {fit['rescale_s']:g} s on the elastic "
        f"and decoupled rows (worst {fit['elastic_rows_max_abs_diff']:.1f} points)"
    )
    for c in (0.0, 10.0, 30.0):
        r = reproduce_table1(model.with_(checkpoint_interval_s=c))
        print(
            f"  with checkpoints every {c:g} s (same recovery): DP row "
            + " ".join(f"{o:.1f}" for o in r["rows"][0]["ours"])
        )
    gaps = rule_of_thumb_gap(TABLE1_PAPER)
    print(
        "\nrule of thumb in the paper's numbers (decoupled M on N vs elastic DP on N/M): "
        + ", ".join(
            f"M={g['learners']} {_chips(g['chips'])}: {g['decoupled']:g} vs {g['elastic_dp_on_n_over_m']:g}"
            for g in gaps
        )
    )
    print(f"\nclosed form {closed_s * 1e3:.1f} ms; Monte-Carlo {mc_s:.2f} s")

    result.update(
        {
            "fit": fit,
            "rule_of_thumb_paper": gaps,
            "monte_carlo": {
                "failures_per_unit": args.failures,
                "runs": args.runs,
                "seed": args.seed,
                "max_gap_stderr": worst_sigmas,
            },
            "command": "python benchmarks/goodput_table1.py",
        }
    )
    write_result("goodput_table1", result, out=RESULTS / "goodput_table1.json", quiet=True)
    written = [RESULTS / "goodput_table1.json"]
    if not args.no_plot:
        written.append(plot(result, model, RESULTS / "goodput_table1.png"))
    print("wrote " + ", ".join(str(w.relative_to(RESULTS.parent.parent)) for w in written))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
