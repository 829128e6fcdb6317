"""The outer-steps study's tables, summary and plot, from its records and the frontier's DP records (the report
of studies/outer-steps, run as its report.py):

    .venv/bin/python studies/outer-steps/report.py            # prints the tables, writes outer-steps-summary.json
                                                              # and outer-steps.png beside this file

Every gap is a loss over data-parallel's at its best (global batch 128, inner lr 1.6e-2, the mean of the
frontier's five GPU seeds), minus 1, in %. A point's seed-0 loss chooses the best (H, momentum, outer lr) at
each batch, as the frontier chose its lrs; the final rows compare seed means (3-5 seeds) with the standard
error of the difference of the two means. Beside each gap stand both fits of the papers' law for DiLoCo M = 2
at this N: the per-method power laws of the scaling-laws paper (its Table 7 coefficients) and this project's
fit to their Table 4 (:func:`diloco.scaling.paper_gap.paper_law_gaps`).
"""

from __future__ import annotations

import json
import math
import statistics
from collections import defaultdict
from pathlib import Path

from diloco.files import atomic_write_bytes
from diloco.scaling.paper_gap import paper_law_gaps
from diloco.scaling.records import paper_table4
from diloco.seed_stats import mean_se
from diloco.studies.outer_steps_grids import BATCHES, FRONTIER, HERE, INNER_LR, SIZE, load, method_of, point

LABELS = {"streaming-fp4-tau1": "Streaming FP4 (P 3, tau 1)", "diloco-m2": "DiLoCo M = 2 (fp32)"}
DP_BATCH = 128


def table7_gap(num_params: float) -> float:
    """DiLoCo M = 2 over DP, minus 1, in %, from the paper's own Table 7 power laws (A N^alpha per method)."""
    table = paper_table4()["expected"]["table7_independent"]
    law = {m: table[m]["A"] * num_params ** table[m]["alpha"] for m in ("dp", "diloco-m2")}
    return 100.0 * (law["diloco-m2"] / law["dp"] - 1.0)


def dp_records() -> list[dict]:
    out = []
    for line in (FRONTIER / "results-gpu.jsonl").read_text().splitlines():
        r = json.loads(line)
        b = r["base"]
        if (
            r.get("status") == "ok"
            and r["method"] == "dp"
            and r["size"] == SIZE
            and r["global_batch"] == DP_BATCH
            and r["inner_lr"] == INNER_LR
            and b.get("device") == "cuda"
            and b.get("inner_optimizer", "adamw") == "adamw"
        ):
            out.append(r)
    return out


def stats(losses: list[float]) -> dict:
    mean, se = mean_se(losses)
    sd = statistics.stdev(losses) if len(losses) > 1 else float("nan")
    return {"mean": mean, "sd": sd, "se": float("nan") if se is None else se, "n": len(losses)}


def gap_pct(mean: float, se: float, dp: dict) -> tuple[float, float]:
    """(gap %, its standard error %): the ratio's first-order error from both means' standard errors."""
    ratio = mean / dp["mean"]
    return 100.0 * (ratio - 1.0), 100.0 * ratio * math.sqrt((se / mean) ** 2 + (dp["se"] / dp["mean"]) ** 2)


def inner_lr_bracket(path: Path) -> list[dict]:
    """Stage 4's runs at half and twice the frontier's inner lr, at each method's best point (seed 0)."""
    out = []
    for line in path.read_text().splitlines():
        r = json.loads(line)
        if r.get("status") == "ok" and r["inner_lr"] != INNER_LR and method_of(r):
            out.append(
                {
                    "method": method_of(r),
                    "batch": r["global_batch"],
                    "sync_every": r["sync_every"],
                    "outer_momentum": r["base"]["outer_momentum"],
                    "inner_lr": r["inner_lr"],
                    "loss_seed0": r["eval_loss"],
                }
            )
    return sorted(out, key=lambda row: (row["method"], row["inner_lr"]))


def summarize(records: list[dict], dp: list[dict], inner_lrs: list[dict] = ()) -> dict:
    dp_stats = stats([r["eval_loss"] for r in dp])
    num_params = dp[0]["num_params"]
    steps = {r["global_batch"]: r["steps"] for r in records}
    by_point: dict[tuple, dict[int, float]] = defaultdict(dict)
    for r in records:
        if r["global_batch"] in BATCHES:
            by_point[point(r)][r.get("seed", 0)] = r["eval_loss"]
    methods = {}
    for method in LABELS:
        pts = {p: s for p, s in by_point.items() if p[0] == method}
        seed0 = {p: s[0] for p, s in pts.items() if 0 in s}
        grid = [
            {
                "batch": p[1],
                "sync_every": p[2],
                "outer_momentum": p[3],
                "outer_lr": p[4],
                "outer_steps": steps[p[1]] // p[2],
                "loss_seed0": loss,
                "gap_seed0_pct": 100.0 * (loss / dp_stats["mean"] - 1.0),
            }
            for p, loss in sorted(seed0.items())
        ]
        seeded = []
        for p, s in pts.items():
            if len(s) >= 3:
                st = stats(list(s.values()))
                gap, se = gap_pct(st["mean"], st["se"], dp_stats)
                seeded.append(
                    {
                        "batch": p[1],
                        "sync_every": p[2],
                        "outer_momentum": p[3],
                        "outer_lr": p[4],
                        "outer_steps": steps[p[1]] // p[2],
                        "seeds": sorted(s),
                        **st,
                        "gap_pct": gap,
                        "gap_se_pct": se,
                    }
                )
        # each batch's best: by seed mean where that batch has points with 3+ seeds, else by seed 0
        best_per_batch = {}
        for batch in sorted({p[1] for p in seed0}):
            means = {
                (m, batch, r["sync_every"], r["outer_momentum"], r["outer_lr"]): r["mean"]
                for r in seeded
                if r["batch"] == batch
                for m in [method]
            }
            pool = means or {q: seed0[q] for q in seed0 if q[1] == batch}
            p = min(pool, key=pool.get)
            best_per_batch[str(batch)] = {
                "sync_every": p[2],
                "outer_momentum": p[3],
                "outer_lr": p[4],
                "outer_steps": steps[batch] // p[2],
                "loss": pool[p],
                "by": "seed mean" if means else "seed 0",
            }
        seeded.sort(key=lambda row: row["mean"])
        methods[method] = {
            "label": LABELS[method],
            "grid_seed0": grid,
            "best_per_batch": best_per_batch,
            "inner_lr_bracket": [row for row in inner_lrs if row["method"] == method],
            "seeded": seeded,
            "best": seeded[0] if seeded else None,
        }
    best_outer_steps = [row["outer_steps"] for m in methods.values() for row in m["best_per_batch"].values()]
    return {
        "size": SIZE,
        "num_params": num_params,
        "inner_lr": INNER_LR,
        "steps_per_batch": {str(k): v for k, v in steps.items()},
        "dp": {"batch": DP_BATCH, "inner_lr": INNER_LR, "seeds": sorted(r.get("seed", 0) for r in dp), **dp_stats},
        "law_m2_gap_pct": {
            "table7_power_laws": table7_gap(num_params),
            "project_fit_table4": paper_law_gaps(num_params)[2],
        },
        "methods": methods,
        "rule": {
            "min_outer_steps": min(best_outer_steps),
            "outer_momentum": {
                "diloco": methods["diloco-m2"]["best"]["outer_momentum"],
                "streaming": methods["streaming-fp4-tau1"]["best"]["outer_momentum"],
            },
            "best_sync_every": {
                m: sorted({row["sync_every"] for row in v["best_per_batch"].values()}) for m, v in methods.items()
            },
        },
    }


def print_tables(s: dict) -> None:
    dp = s["dp"]
    law = s["law_m2_gap_pct"]
    print(
        f"DP at batch {dp['batch']}, inner lr {dp['inner_lr']:g}: {dp['mean']:.4f} +- {dp['sd']:.4f} (sd, "
        f"{dp['n']} seeds); papers' law M = 2 at N = {s['num_params'] / 1e6:.2f}M: "
        f"{law['table7_power_laws']:+.2f} % (Table 7) / {law['project_fit_table4']:+.2f} % (fit to Table 4)"
    )
    for m in s["methods"].values():
        print(f"\n{m['label']}: seed-0 loss (gap to DP's seed mean), outer lr 0.7")
        rows = {(r["batch"], r["sync_every"], r["outer_momentum"]): r for r in m["grid_seed0"] if r["outer_lr"] == 0.7}
        hs = sorted({k[1] for k in rows})
        for batch in sorted({k[0] for k in rows}):
            for mom in sorted({k[2] for k in rows if k[0] == batch}):
                cells = [rows.get((batch, h, mom)) for h in hs]
                print(
                    f"  B {batch:>3} mom {mom}: "
                    + "  ".join(
                        f"H {h:>2} {c['loss_seed0']:.4f} ({c['gap_seed0_pct']:+.2f} %)" if c else f"H {h:>2}   -   "
                        for h, c in zip(hs, cells)
                    )
                )
        others = [r for r in m["grid_seed0"] if r["outer_lr"] != 0.7]
        for r in others:
            print(
                f"  B {r['batch']} H {r['sync_every']} mom {r['outer_momentum']} outer lr {r['outer_lr']}: "
                f"{r['loss_seed0']:.4f}"
            )
        for r in m["inner_lr_bracket"]:
            print(
                f"  B {r['batch']} H {r['sync_every']} mom {r['outer_momentum']} inner lr {r['inner_lr']:g}: "
                f"{r['loss_seed0']:.4f}"
            )
        print("  seed means:")
        for r in m["seeded"]:
            print(
                f"  B {r['batch']} H {r['sync_every']:>2} mom {r['outer_momentum']} ({r['outer_steps']} outer steps): "
                f"{r['mean']:.4f} +- {r['sd']:.4f} ({r['n']} seeds), gap {r['gap_pct']:+.2f} +- {r['gap_se_pct']:.2f} %"
            )
    print(f"\nrule: {json.dumps(s['rule'])}")


def plot(s: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    law = s["law_m2_gap_pct"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for ax, m in zip(axes, s["methods"].values()):
        for batch, color in (("64", "tab:blue"), ("128", "tab:orange")):
            rows = [r for r in m["grid_seed0"] if str(r["batch"]) == batch and r["outer_lr"] == 0.7]
            best_at_h = {}
            for r in rows:
                if r["sync_every"] not in best_at_h or r["loss_seed0"] < best_at_h[r["sync_every"]]["loss_seed0"]:
                    best_at_h[r["sync_every"]] = r
            xs = sorted(best_at_h.values(), key=lambda r: r["outer_steps"])
            ax.plot(
                [r["outer_steps"] for r in xs],
                [r["gap_seed0_pct"] for r in xs],
                "o-",
                color=color,
                label=f"batch {batch}, seed 0 (best momentum at each H)",
            )
            for r in xs:
                ax.annotate(
                    f"H {r['sync_every']}",
                    (r["outer_steps"], r["gap_seed0_pct"]),
                    fontsize=7,
                    textcoords="offset points",
                    xytext=(3, 4),
                )
            seeded = [r for r in m["seeded"] if str(r["batch"]) == batch]
            if seeded:
                ax.errorbar(
                    [r["outer_steps"] for r in seeded],
                    [r["gap_pct"] for r in seeded],
                    yerr=[r["gap_se_pct"] for r in seeded],
                    fmt="s",
                    color=color,
                    mfc="white",
                    capsize=3,
                    label=f"batch {batch}, seed mean +- s.e.",
                )
        lo, hi = sorted(law.values())
        ax.axhspan(lo, hi, color="gray", alpha=0.25, label=f"papers' law, M = 2 ({lo:+.2f} to {hi:+.2f} %)")
        ax.axhline(0, color="black", lw=0.6)
        ax.set_xscale("log")
        ax.set_xticks([20, 40, 80, 120, 240], labels=["20", "40", "80", "120", "240"])
        ax.minorticks_off()
        ax.set_xlabel("outer steps per run (inner steps / H)")
        ax.set_title(m["label"], fontsize=10)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel(f"gap to data-parallel's best (%), {s['size']}")
    axes[0].legend(fontsize=7, loc="upper right")
    fig.suptitle(
        f"{s['size']} on one GPU, 20 tokens per parameter: the gap against the number of outer steps", fontsize=10
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> int:
    records = load([HERE / "results-gpu.jsonl", FRONTIER / "results-gpu.jsonl"])
    summary = summarize(records, dp_records(), inner_lr_bracket(HERE / "results-gpu.jsonl"))
    print_tables(summary)
    atomic_write_bytes(
        HERE / "outer-steps-summary.json", (json.dumps(summary, indent=1, allow_nan=False) + "\n").encode()
    )
    plot(summary, HERE / "outer-steps.png")
    return 0
