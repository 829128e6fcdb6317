"""The bandwidth frontier's plot, frontier.png (:mod:`diloco.studies.frontier_report` writes the tables and the
summary, and calls this)."""

from __future__ import annotations

from pathlib import Path

from diloco.studies.frontier_report import best_over_batches

#: What the plot shows: the study's methods at each size's best batch and lr (the other top-k ideas stay in the
#: table; they would crowd it out).
PLOTTED = (
    "streaming-fp4-tau1",
    "eager-fp4-mom0.5",
    "stat4-ef0.9",
    "stat2-ef0.9",
    "topk-sparseloco",
    "topk-d32",
    "topk-chunk-d32",
    "muon-stat4-ef0.9",
)
SIZE_MARKERS = ("o", "s", "^", "D")


def plot_frontier(rows: list[dict], path: Path) -> None:
    """The frontier's two panels (gap to DP against bits per parameter per sync, and against the latency an
    exchange may take) for each size at its best batch and inner lr, written to ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.ticker import FuncFormatter, LogLocator

    sizes = sorted({r["size"] for r in rows}, key=lambda z: min(r["num_params"] for r in rows if r["size"] == z))
    # each size's most complete set: the device with the most rows there (the two sets are never mixed)
    device = {
        z: max(
            sorted({r.get("device", "cpu") for r in rows if r["size"] == z}),
            key=lambda d: sum(r["size"] == z and r.get("device", "cpu") == d for r in rows),
        )
        for z in sizes
    }
    colors = {m: plt.get_cmap("tab10")(i) for i, m in enumerate(PLOTTED)}
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.6))
    for k, size in enumerate(sizes):
        for name, r in best_over_batches(rows, size, device[size]).items():
            if name not in colors or r["gap_pct"] is None:
                continue
            style = dict(
                color=colors[name],
                marker=SIZE_MARKERS[k % len(SIZE_MARKERS)],
                s=42,
                edgecolor="black",
                linewidth=0.4,
                zorder=3,
            )
            # one standard deviation of the seeds' losses, as a share of DP's loss (seed 0's spread unknown: none)
            err = 100 * r["eval_loss_sd"] / (r["eval_loss"] / (1 + r["gap_pct"] / 100)) if r.get("seeds") else 0
            for ax, x in ((axes[0], r["bits_per_param_per_sync"]), (axes[1], max(r["tolerated_steps"], 0.5))):
                if x:
                    ax.scatter(x, r["gap_pct"], **style)
                    if err:
                        ax.errorbar(x, r["gap_pct"], yerr=err, color=colors[name], lw=1, capsize=2, zorder=2)
    for ax in axes:
        ax.set_xscale("log")
        ax.xaxis.set_major_locator(LogLocator(base=10))
        ax.xaxis.set_minor_formatter(FuncFormatter(lambda *_: ""))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        for size, law in sorted({(r["size"], r["papers_law_m2_gap_pct"]) for r in rows}):
            ax.axhline(law, ls="--", lw=0.8, color="gray")
            ax.text(
                0.01,
                law,
                f" papers' law, M = 2 ({size})",
                fontsize=7,
                va="bottom",
                color="gray",
                transform=ax.get_yaxis_transform(),
            )
        ax.axhline(0, lw=0.8, color="black")
        ax.set_ylabel("final eval loss gap to DP (%)")
        ax.grid(alpha=0.3)
    axes[0].set_xlabel("bits per parameter per sync (log)")
    axes[1].set_xlabel("latency an exchange may take (inner steps, log)")
    handles = [
        Line2D([], [], ls="", marker="o", color=c, label=m)
        for m, c in colors.items()
        if any(r["method"] == m for r in rows)
    ]
    handles += [
        Line2D(
            [],
            [],
            ls="",
            marker=SIZE_MARKERS[k % len(SIZE_MARKERS)],
            color="white",
            markeredgecolor="black",
            label=f"{size} ({'GPU' if device[size] == 'cuda' else 'CPU'})",
        )
        for k, size in enumerate(sizes)
    ]
    fig.legend(handles=handles, loc="center right", fontsize=8, frameon=False)
    fig.suptitle(
        "The bandwidth frontier at laptop scale: each method at its best batch and inner lr\n"
        "(20 tokens per parameter; gap to DP at its best on the same device; bars: one s.d. over seeds)"
    )
    fig.tight_layout(rect=(0, 0, 0.82, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)
