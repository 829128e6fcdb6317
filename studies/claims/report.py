"""The claims study's tables from its records, as docs/results/index.md shows them (a test holds the two equal):
the ablation (each point's seed mean ± s.e. and its cost against the reference, Streaming FP4, and against tuned
DiLoCo, in percent, with the s.e. of the difference), the batch bracket (each method's loss at each inner lr and
batch, its best lr, and its best batch; as run, and on one validation set), claim 2 with seeds (DiLoCo against data-parallel at each batch) and the
slope checks (the loss at both ends of the bracket with one setting changed).

    .venv/bin/python studies/claims/report.py   # prints the tables; writes claims-summary.json, batch.png, checks.png
"""

from __future__ import annotations

import sys

from diloco.files import read_jsonl, write_json
from diloco.studies.claims import (
    BRACKET_SEED,
    HERE,
    SLOPE_CHECKS,
    ablation_table,
    against_dp,
    batch_table,
    check_table,
)
from diloco.studies.claims_common import COMMON_EVAL, REEVAL, common_table
from diloco.studies.claims_docs import METHOD_LABELS, docs_tables


def _curves(ax, batches: dict[str, dict], title: str) -> None:
    """Each method's loss at each batch's best lr: seed 0 (line), the mean ± s.e. of seeds 0-2 where it has them,
    and its best batch (star)."""
    for name, t in batches.items():
        xs = sorted(t["batches"])
        line = ax.plot(xs, [t["batches"][b]["bracket_loss"] for b in xs], "o-", label=f"{METHOD_LABELS[name]}, seed 0")
        seeded = [b for b in xs if len(t["batches"][b]["stage_seeds"]) > 1]
        if seeded:
            ax.errorbar(
                seeded,
                [t["batches"][b]["stage_mean"] for b in seeded],
                yerr=[t["batches"][b]["stage_se"] for b in seeded],
                fmt="s",
                mfc="none",
                color=line[0].get_color(),
                capsize=3,
                label=f"{METHOD_LABELS[name]}, seeds 0-2",
            )
        best = t["batches"][t["best_batch"]]
        star = best["stage_mean"] if len(best["stage_seeds"]) > 1 else best["bracket_loss"]
        ax.plot([t["best_batch"]], [star], "*", ms=14, color=line[0].get_color())
    ax.set_ylabel("eval loss at the batch's best inner lr")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=6)


def plot_batch(own: dict[str, dict], common: dict[str, dict], path) -> None:
    """The batch bracket at a glance: each method's loss against the batch as run (each batch on its own validation
    windows) and on one validation set, and each DiLoCo method against data-parallel on that set at seed 0."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, mid, gap) = plt.subplots(1, 3, figsize=(15, 4.4))
    _curves(left, own, "as run: each batch on its own validation windows (16 x batch)")
    _curves(mid, common, f"on one validation set: the first {COMMON_EVAL} windows (★ best batch)")
    dp = common.get("dp", {}).get("batches", {})
    for name, t in common.items():
        both = [b for b in sorted(t["batches"]) if b in dp and name != "dp"]
        if both:
            gap.plot(both, [100 * (t["batches"][b]["bracket_loss"] / dp[b]["bracket_loss"] - 1) for b in both], "o-",
                     label=METHOD_LABELS[name])  # fmt: skip
    for a in (left, mid, gap):
        a.set_xscale("log", base=2)
        a.set_xlabel("global batch (sequences of 128 tokens)")
        a.grid(alpha=0.3)
    gap.axhline(0, color="k", lw=0.8)
    gap.set_ylabel(f"against data-parallel at seed {BRACKET_SEED} (%)")
    gap.set_title("DiLoCo against data-parallel on one validation set", fontsize=9)
    gap.legend(fontsize=8)
    fig.suptitle("cpu-0.25m, 20 tokens per parameter, AdamW weight decay 0.1, warmup 120 steps", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_checks(rows: list[dict], path) -> None:
    """The slope checks at a glance: per method, the loss at the smallest and largest batch (seed 0, best lr) in the
    bracket and with each check's setting; a line that stays parallel to the bracket's leaves the slope as it was."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(dict.fromkeys(r["method"] for r in rows))
    fig, axes = plt.subplots(1, len(names), figsize=(5.2 * len(names), 4), squeeze=False)
    for ax, name in zip(axes[0], names):
        mine = sorted((r for r in rows if r["method"] == name), key=lambda r: r["batch"])
        xs = [r["batch"] for r in mine]
        ax.plot(xs, [r["bracket"] for r in mine], "o-", color="k", label="the bracket")
        for check, (_setting, _value_at, words) in SLOPE_CHECKS.items():
            pts = [(r["batch"], r["checks"][check]["loss"]) for r in mine if r["checks"][check] is not None]
            if pts:
                ax.plot(*zip(*pts), "s--", label=words)
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs, [str(x) for x in xs])
        ax.set_xlabel("global batch (sequences of 128 tokens)")
        ax.set_ylabel(f"eval loss, seed {BRACKET_SEED}, the batch's best inner lr")
        ax.set_title(METHOD_LABELS[name])
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("Why the loss falls with the batch: one setting changed at both ends (cpu-0.25m)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _json_table(table: dict[str, dict]) -> dict[str, dict]:
    """A batch table with string keys (strict JSON)."""
    return {
        name: {
            **t,
            "batches": {
                str(k): {**b, "losses": {str(lr): {str(s): x for s, x in v.items()} for lr, v in b["losses"].items()}}
                for k, b in t["batches"].items()
            },
        }
        for name, t in table.items()
    }


def main() -> int:
    path = HERE / "results.jsonl"
    records = read_jsonl(path) if path.exists() else []
    rows = ablation_table(records)
    batches = batch_table(records)
    reeval = read_jsonl(REEVAL) if REEVAL.exists() else []
    common = common_table(records, reeval)
    for title, lines in docs_tables(records, reeval).items():
        print(f"{title}:\n\n" + "\n".join(lines) + "\n")
    if batches:
        plot_batch(batches, common, HERE / "batch.png")
    checks = check_table(records)
    if checks:
        plot_checks(checks, HERE / "checks.png")
    write_json(
        HERE / "claims-summary.json",
        {
            "ablation": rows,
            "batch": _json_table(batches),
            "batch_on_one_validation_set": {
                "eval_sequences": COMMON_EVAL,
                **{
                    name: {
                        **t,
                        "batches": {
                            str(k): {**b, "losses": {str(s): x for s, x in b["losses"].items()}}
                            for k, b in t["batches"].items()
                        },
                    }
                    for name, t in common.items()
                },
            },
            "against_dp": against_dp(batches),
            "slope_checks": checks,
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
