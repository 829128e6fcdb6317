"""Quality against bytes at laptop scale: the demo's methods with a meaningful token budget.

Every method gets the same model (cpu-1m), data, global batch and tokens, and its own best
inner learning rate from the same grid (tuned alike). Runs are reused when finished, so an
interrupted benchmark resumes where it stopped.

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4 \
        .venv/bin/python benchmarks/quality.py                # ~1 hour on 2 cores (idle)
    .venv/bin/python benchmarks/quality.py --tokens 500000 --lrs 2e-3   # quick look

Prints, per method, the best eval loss, % vs DP, bytes sent per replica and x fewer than DP,
and the gap to DP along training. Then each method is trained again with its best inner lr at
smaller token budgets (--budgets): the final gap to DP at each budget, and a fit
gap = a + b ln(tokens) that says at what budget the gap would reach +1 % and 0 %, if the trend
held. Writes benchmarks/results/quality.json and quality.png.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from diloco.bench import write_result
from diloco.compare import add_relative_columns, format_table, run_compare
from diloco.files import default_cache_dir, read_jsonl
from diloco.train.config import TrainConfig, load_preset

METHODS = {
    "dp": {"method": "dp"},
    "diloco": {"method": "diloco", "sync_every": 30},
    "streaming": {
        "method": "streaming",
        "sync_every": 30,
        "num_fragments": 3,
        "overlap_steps": 1,
        "merge_alpha": 0.5,
        "codec": "fp4_e3m0",
    },
    "streaming-h100": {
        "method": "streaming",
        "sync_every": 100,
        "num_fragments": 3,
        "overlap_steps": 1,
        "merge_alpha": 0.5,
        "codec": "fp4_e3m0",
    },
    "diloco-m1": {"method": "diloco", "replicas": 1, "sync_every": 30},
}


def eval_curve(run_dir: Path) -> list[tuple[int, float]]:
    return [(r["tokens_seen"], r["eval_loss"]) for r in read_jsonl(run_dir / "metrics.jsonl") if "eval_loss" in r]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=2_000_000)
    ap.add_argument("--lrs", default="2e-3,4e-3", help="inner learning-rate grid, the same for every method")
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--outer-lr", type=float, default=0.7)
    ap.add_argument("--threads", type=int, default=0, help="torch threads per replica (0: cores // replicas)")
    ap.add_argument(
        "--budgets",
        default="1000000",
        help="smaller token budgets for the final-gap-vs-budget curve, comma-separated ('' skips)",
    )
    ap.add_argument("--budget-methods", default="dp,diloco,streaming,diloco-m1")
    ap.add_argument("--runs", type=Path, default=Path("runs/quality"))
    ap.add_argument("--cache-dir", type=Path, default=default_cache_dir())
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "quality.json")
    args = ap.parse_args()
    base = {
        **load_preset("demo")["base"],
        "steps": 0,
        "tokens": args.tokens,
        "eval_every": 100,
        "warmup_steps": 50,
        "outer_lr": args.outer_lr,
        "threads": args.threads,
    }
    lrs = [float(x) for x in args.lrs.split(",")]
    names = args.methods.split(",")
    configs = {
        f"{m}@lr{lr:g}": TrainConfig.from_dict({**base, **METHODS[m], "inner_lr": lr}) for m in names for lr in lrs
    }
    rows = run_compare(configs, args.runs, cache_dir=args.cache_dir, progress=True)
    # each method's best inner learning rate
    best = {}
    for r in rows:
        m = r["name"].split("@")[0]
        if m not in best or r["final_eval_loss"] < best[m]["final_eval_loss"]:
            best[m] = r
    chosen = [dict(best[m], name=m, inner_lr=best[m]["config"]["inner_lr"]) for m in names]
    add_relative_columns(chosen)
    dp_curve = dict(eval_curve(Path(best["dp"]["out_dir"]))) if "dp" in best else {}
    for r in chosen:
        curve = eval_curve(Path(r["out_dir"]))
        r["gap_vs_tokens"] = [(t, 100 * (loss / dp_curve[t] - 1)) for t, loss in curve if t in dp_curve]
    print("\nall runs:\n" + format_table(rows))
    print(f"\nbest inner lr per method (grid {lrs}), {args.tokens:,} tokens, outer lr {args.outer_lr}:")
    print(format_table(chosen))
    for r in chosen:
        print(
            f"  {r['name']:<16} inner lr {r['inner_lr']:g}; gap vs DP along training: "
            + ", ".join(f"{t / 1e6:.1f}M {g:+.1f}%" for t, g in r["gap_vs_tokens"][::3])
        )
    budget_gaps = gap_vs_budget(args, base, best, [m for m in args.budget_methods.split(",") if m in best])
    write_result(
        "quality",
        {
            "tokens": args.tokens,
            "lrs": lrs,
            "outer_lr": args.outer_lr,
            "best": chosen,
            "all": rows,
            "gap_vs_budget": budget_gaps,
        },
        out=args.out,
        quiet=True,
    )
    plot(chosen, args.out.with_suffix(".png"), budget_gaps)
    print(f"written: {args.out}, {args.out.with_suffix('.png')}")


def gap_vs_budget(args, base: dict, best: dict, methods: list[str]) -> dict:
    """Final gap to DP of each method (at its best inner lr) at every token budget, and its log-linear trend."""
    import math

    import numpy as np

    budgets = sorted({int(float(b)) for b in args.budgets.split(",") if b.strip()} - {args.tokens})
    if not budgets or "dp" not in methods:
        return {}
    configs = {
        f"{m}@lr{best[m]['config']['inner_lr']:g}@{b // 1000}k": TrainConfig.from_dict(
            {**best[m]["config"], "tokens": b}
        )
        for b in budgets
        for m in methods
    }
    runs = {
        name: r
        for name, r in zip(
            configs, run_compare(configs, args.runs / "budgets", cache_dir=args.cache_dir, progress=True)
        )
    }
    loss = {
        (m, b): runs[f"{m}@lr{best[m]['config']['inner_lr']:g}@{b // 1000}k"]["final_eval_loss"]
        for b in budgets
        for m in methods
    }
    loss |= {(m, args.tokens): best[m]["final_eval_loss"] for m in methods}
    budgets.append(args.tokens)
    out = {}
    print("\nfinal eval loss gap vs DP by token budget (each method at its best inner lr):")
    print(
        f"  {'method':<16}" + "".join(f"{b / 1e6:>9.2f}M" for b in budgets) + "   trend per doubling   +1% at   0% at"
    )
    for m in methods:
        if m == "dp":
            continue
        gaps = [100 * (loss[(m, b)] / loss[("dp", b)] - 1) for b in budgets]
        slope, intercept = np.polyfit(np.log(budgets), gaps, 1)
        reach = {t: (math.exp((t - intercept) / slope) if slope < 0 else None) for t in (1.0, 0.0)}
        out[m] = {
            "budgets": budgets,
            "gap_pct": gaps,
            "slope_pct_per_doubling": slope * math.log(2),
            "tokens_for_gap_1pct": reach[1.0],
            "tokens_for_gap_0pct": reach[0.0],
        }

        def fmt(t):
            return "never" if t is None else ("now" if t <= budgets[-1] else f"{t / 1e6:.0f}M")

        print(
            f"  {m:<16}"
            + "".join(f"{g:>+9.2f}%" for g in gaps)
            + f"   {slope * math.log(2):+.2f} pts{'':>9}{fmt(reach[1.0]):>7}{fmt(reach[0.0]):>8}"
        )
    print(f"  (trend: least squares of gap on ln(tokens); an extrapolation from {len(budgets)} budgets, not a result)")
    return out


def plot(rows: list[dict], path: Path, budget_gaps: dict | None = None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    color = {r["name"]: f"C{i}" for i, r in enumerate(rows)}  # one colour per method in every panel
    fig, axes = plt.subplots(1, 3 if budget_gaps else 2, figsize=(16 if budget_gaps else 11, 4.2))
    a, b = axes[0], axes[1]
    if budget_gaps:
        c = axes[2]
        for m, g in budget_gaps.items():
            c.plot(g["budgets"], g["gap_pct"], marker="o", label=m, color=color[m])
        c.axhline(0, color="k", lw=0.8)
        c.axhline(1, color="k", lw=0.6, ls=":")
        c.set(
            xscale="log",
            xlabel="token budget",
            ylabel="final % eval loss vs DP",
            title="Final gap to DP by token budget",
        )
        c.grid(alpha=0.3)
        c.legend(fontsize=8)
    for r in rows:
        curve = eval_curve(Path(r["out_dir"]))
        a.plot(
            [t for t, _ in curve],
            [v for _, v in curve],
            marker="o",
            ms=2,
            label=f"{r['name']} (lr {r['inner_lr']:g})",
            color=color[r["name"]],
        )
        if r["name"] != "dp" and r["gap_vs_tokens"]:
            b.plot(
                [t for t, _ in r["gap_vs_tokens"]],
                [g for _, g in r["gap_vs_tokens"]],
                marker="o",
                ms=2,
                label=r["name"],
                color=color[r["name"]],
            )
    a.set(xlabel="tokens", ylabel="eval loss (global params)", title="Eval loss vs tokens")
    b.axhline(0, color="k", lw=0.8)
    b.set(xlabel="tokens", ylabel="% eval loss vs DP", title="Gap to data-parallel along training")
    for ax in (a, b):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
