"""The long runs at 20 tokens per parameter against DP, beside the targets; curves and gaps as JSON and a plot.

    .venv/bin/python studies/outer-tuning/long_report.py      # reads the long runs of results-cpu.jsonl and the run folders
    .venv/bin/python studies/outer-tuning/long_report.py --markdown     # every setting's table (docs/results/tuning.md)
    .venv/bin/python studies/outer-tuning/long_report.py --best         # each method at its best (the README)

Writes long-summary.json (every run's eval-loss curve, final loss, bytes per replica; the gap against N),
long-curves.png (eval loss against tokens, and each method's gap to DP against tokens per parameter, per
size) and long-gap-vs-n.png (our final gaps beside the papers' at 35M and up, and their trend extended down). A run
still in progress shows its curve so far (from its metrics.jsonl) and no final loss.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from diloco.compare import human_bytes  # the byte counts as the demo's table prints them
from diloco.scaling.records import paper_table4
from diloco.scaling.sweep import model_zoo_params  # N as the sweep counts it
from diloco.studies.outer_tuning import HERE, method_key, records
from diloco.traffic import exchange_bytes

ROOT = HERE.parents[1]
SUMMARY = HERE / "long-summary.json"


def dp_bytes_at_m2(summary: dict) -> float | None:
    """What DP over M = 2 replicas sends per replica (fp32 gradients every step: the trainer's DP exchange
    at M = 2), from a DP run's summary; the sweep runs DP with one replica, which sends nothing."""
    if not summary.get("num_params") or not summary.get("steps"):
        return None
    return summary["steps"] * exchange_bytes(
        payload_bytes=4 * summary["num_params"], num_replicas=2, exchange="all_gather"
    )


TARGETS = {  # method key -> (max final loss / DP's, min DP bytes / the method's): the study's goals
    "streaming-m2-h30-fp4_e3m0": (1.01, 200.0),
    "streaming-m2-h100-fp4_e3m0": (1.015, 600.0),
    "diloco-m1-h30": (1.0, None),
}


def _rows(path: Path) -> list[dict]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:  # a line being written
            continue
    return out


def collect() -> list[dict]:
    """One entry per long run: finished ones from results-cpu.jsonl (the records of runs folders
    runs/outer-tuning/long-*), unfinished ones from runs/."""
    runs = {}
    for rec in records("long"):
        runs[rec["run_id"]] = rec
    for cfg in sorted((ROOT / "runs" / "outer-tuning").glob("long-*/*/config.json")):
        run_id = cfg.parent.name
        if run_id not in runs:
            runs[run_id] = {"run_id": run_id, "run_dir": str(cfg.parent.relative_to(ROOT)), "status": "running"}
    # run folders are not in git: a finished run whose folder is gone (another machine, a fresh clone) keeps the
    # entry the last report recorded for it in long-summary.json instead of losing its curve and settings
    recorded = {}
    if SUMMARY.exists():
        recorded = {r["run_id"]: r for r in json.loads(SUMMARY.read_text())["runs"]}
    out = []
    for run_id, rec in runs.items():
        run_dir = ROOT / rec["run_dir"]
        if not (run_dir / "config.json").exists() and run_id in recorded:
            out.append(recorded[run_id])
            continue
        config = json.loads((run_dir / "config.json").read_text()) if (run_dir / "config.json").exists() else {}
        metrics = _rows(run_dir / "metrics.jsonl")
        curve = [(m["tokens_seen"], m["eval_loss"]) for m in metrics if "eval_loss" in m and m["eval_loss"] is not None]
        summary = json.loads((run_dir / "summary.json").read_text()) if (run_dir / "summary.json").exists() else {}
        outer = (config.get("outer_lr"), config.get("outer_momentum")) if config.get("method") != "dp" else None
        if "method" in rec:
            key, seed, size, n = method_key(rec), rec["seed"], rec["size"], rec["num_params"]
        else:  # unfinished: name it from its config
            pseudo = {
                "method": config.get("method"),
                "replicas": config.get("replicas"),
                "sync_every": config.get("sync_every"),
                "base": {"codec": config.get("codec")},
            }
            key = method_key(pseudo) if pseudo["method"] else "?"
            seed, size = config.get("seed"), config.get("size")
            n = model_zoo_params(size, config) if size else None
        out.append(
            {
                "run_id": run_id,
                "key": key,
                "seed": seed,
                "size": size,
                "num_params": n,
                "outer": outer,
                "inner_lr": config.get("inner_lr"),
                "warmup_steps": config.get("warmup_steps"),
                "status": rec.get("status"),
                "final_eval_loss": summary.get("final_eval_loss"),
                "bytes_sent_per_replica": summary.get("bytes_sent_per_replica"),
                "dp_bytes_at_m2": dp_bytes_at_m2(summary) if key == "dp" else None,
                "curve": curve,
            }
        )
    return sorted(out, key=lambda r: (str(r["size"]), r["key"], str(r["seed"])))


def reference_dp(group: list[dict]) -> dict | None:
    """The DP run every gap of a size is measured against: the finished DP run with the lowest final loss (DP
    ran at more than one inner lr at some sizes; the better one is the honest reference)."""
    done = [r for r in group if r["key"] == "dp" and r["final_eval_loss"] is not None]
    return min(done, key=lambda r: r["final_eval_loss"]) if done else None


def report(runs: list[dict]) -> None:
    for size in sorted({str(r["size"]) for r in runs}):
        group = [r for r in runs if str(r["size"]) == size]
        dp = reference_dp(group)
        dp_loss = dp["final_eval_loss"] if dp else None
        dp_bytes = dp["dp_bytes_at_m2"] if dp else None
        print(
            f"\n{size}: final eval loss of the global parameters; bytes sent per replica against DP's at M = 2 "
            f"(fp32 gradients every step, {dp_bytes / 1e9:.2f} GB)"
            if dp_bytes
            else f"\n{size}: (no DP run yet)"
        )
        print(
            f"{'method':<28} {'seed':>4} {'inner lr':>8} {'outer':>9} {'eval loss':>9} {'/ DP':>7} "
            f"{'DP bytes / bytes':>16}  target"
        )
        for r in group:
            loss = r["final_eval_loss"]
            ratio = loss / dp_loss if loss is not None and dp_loss else None
            fewer = dp_bytes / r["bytes_sent_per_replica"] if dp_bytes and r["bytes_sent_per_replica"] else None
            t = TARGETS.get(r["key"])
            verdict = "-"
            if t and ratio is not None:
                parts = [f"loss {'met' if ratio <= t[0] else 'MISSED'} (<= {t[0]:g} x DP)"]
                if t[1]:
                    parts.append(
                        f"bytes {'met' if fewer is not None and fewer >= t[1] else 'MISSED'} (>= {t[1]:g}x fewer)"
                    )
                verdict = ", ".join(parts)
            shown = f"{loss:.4f}" if loss is not None else f"({len(r['curve'])} evals)"
            outer = "-" if not r["outer"] else f"{r['outer'][0]:g} / {r['outer'][1]:g}"
            print(
                f"{r['key']:<28} {str(r['seed']):>4} {r['inner_lr']!s:>8} {outer:>9} {shown:>9} {ratio if ratio is None else round(ratio, 4)!s:>7} "
                f"{'-' if fewer is None else f'{fewer:,.0f}':>16}  {verdict}"
            )


def plot(runs: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = sorted({str(r["size"]) for r in runs if r["curve"]})
    if not sizes:
        return
    fig, axes = plt.subplots(2, len(sizes), figsize=(6.5 * len(sizes), 8), squeeze=False)
    for col, size in enumerate(sizes):
        group = [r for r in runs if str(r["size"]) == size and r["curve"]]
        dp = reference_dp(group)
        # the gap panel is against the best DP at each token count (DP at a higher inner lr trails mid-run, leads
        # at the end)
        ref: dict[int, float] = {}
        for d in (x for x in group if x["key"] == "dp"):
            for tok, loss_ in d["curve"]:
                ref[tok] = min(ref.get(tok, loss_), loss_)
        for i, r in enumerate(group):
            color = plt.cm.tab20(i % 20)  # the same run, the same colour in both panels
            t, loss = zip(*r["curve"], strict=True)
            label = f"{r['key']} s{r['seed']} lr {r['inner_lr']:g}" + (
                "" if not r["outer"] else f" outer {r['outer'][0]:g}/{r['outer'][1]:g}"
            )
            axes[0][col].plot(t, loss, label=label, color=color)
            if dp is not None and r["key"] != "dp" and r["num_params"]:
                pts = [(tok / r["num_params"], 100 * (l_ / ref[tok] - 1)) for tok, l_ in r["curve"] if tok in ref]
                if pts:
                    axes[1][col].plot(*zip(*pts, strict=True), marker=".", label=label, color=color)
        axes[0][col].set(title=f"{size}: eval loss (global parameters)", xlabel="tokens", ylabel="eval loss")
        axes[0][col].set_ylim(top=min(6.0, axes[0][col].get_ylim()[1]))
        axes[1][col].axhline(0, color="k", lw=0.8)
        axes[1][col].set(
            title=f"{size}: gap to the best DP at the same tokens",
            xlabel="tokens per parameter",
            ylabel="eval loss vs DP (%)",
        )
        for ax in axes[:, col]:
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


NAMES = {
    "dp": "data-parallel (M = 2, fp32 gradients every step)",
    "diloco-m1-h30": "DiLoCo M = 1, H = 30",
    "diloco-m2-h30": "DiLoCo M = 2, H = 30",
    "streaming-m2-h30-fp4_e3m0": "Streaming M = 2, H = 30, FP4",
    "streaming-m2-h30-fp32": "Streaming M = 2, H = 30, FP32",
    "streaming-m2-h100-fp4_e3m0": "Streaming M = 2, H = 100, FP4",
}


def settings_by_size(runs: list[dict]):
    """Per size with a finished DP run: (size, DP's run, {(key, inner lr, outer, warmup): the finished runs, seeds})."""
    for size in sorted({str(r["size"]) for r in runs}):
        group = [r for r in runs if str(r["size"]) == size and r["final_eval_loss"] is not None]
        dp = reference_dp(group)
        if dp is None:
            continue
        by: dict[tuple, list[dict]] = {}
        for r in group:
            by.setdefault((r["key"], r["inner_lr"], tuple(r["outer"] or ()), r["warmup_steps"]), []).append(r)
        yield size, dp, by


def markdown(runs: list[dict]) -> None:
    """The README's table per size: finished runs, seeds averaged per setting, bytes against DP at M = 2."""
    for size, dp, by in settings_by_size(runs):
        print(f"\n{size} ({dp['num_params'] / 1e6:.2f}M parameters):\n")
        print(
            "| method | inner lr | outer lr / momentum | warmup | seeds | eval loss | vs DP | sent per replica | "
            "× fewer than DP |"
        )
        print("|---|---|---|---|---|---|---|---|---|")
        for (key, lr, outer, warm), rs in sorted(
            by.items(), key=lambda kv: (kv[0][0] != "dp", kv[0][0], -kv[0][1], kv[0][2], kv[0][3])
        ):
            loss = sum(r["final_eval_loss"] for r in rs) / len(rs)
            sent = dp["dp_bytes_at_m2"] if key == "dp" else rs[0]["bytes_sent_per_replica"]
            fewer = "1" if key == "dp" else ("–" if not sent else f"{dp['dp_bytes_at_m2'] / sent:,.0f}")
            gap = "–" if rs[0] is dp else f"{100 * (loss / dp['final_eval_loss'] - 1):+.2f} %"
            each = "" if len(rs) == 1 else " (" + " / ".join(f"{r['final_eval_loss']:.4f}" for r in rs) + ")"
            print(
                f"| {NAMES.get(key, key)} | {lr:g} | {'–' if not outer else f'{outer[0]:g} / {outer[1]:g}'} | {warm} | "
                f"{len(rs)} | {loss:.4f}{each} | {gap} | {human_bytes(sent) if sent else '0'} | {fewer} |"
            )


def markdown_best(runs: list[dict]) -> None:
    """One table for every size: each method at its best finished setting (mean over seeds), against DP at its
    best; the columns are the sizes (the README's summary; ``markdown`` has every setting)."""
    sizes, cells = [], {}
    for size, dp, by in settings_by_size(runs):
        sizes.append(f"`{size}` ({dp['num_params'] / 1e6:.2f}M)")
        best: dict[str, tuple[float, tuple, list[dict]]] = {}
        for (key, lr, outer, _warm), rs in by.items():
            loss = sum(r["final_eval_loss"] for r in rs) / len(rs)
            if key not in best or loss < best[key][0]:
                best[key] = (loss, (lr, outer), rs)
        for key, (loss, (lr, outer), rs) in best.items():
            gap = "–" if key == "dp" else f"{100 * (loss / dp['final_eval_loss'] - 1):+.2f} %"
            seeds = "" if len(rs) == 1 else f", {len(rs)} seeds"
            how = f"lr {lr:g}" + ("" if not outer else f", outer {outer[0]:g} / {outer[1]:g}") + seeds
            cells.setdefault(key, {})[size] = f"{loss:.4f} ({gap}; {how})"
    print("| method | " + " | ".join(sizes) + " |")
    print("|---|" + "---|" * len(sizes))
    order = [
        "dp",
        "diloco-m1-h30",
        "diloco-m2-h30",
        "streaming-m2-h30-fp4_e3m0",
        "streaming-m2-h30-fp32",
        "streaming-m2-h100-fp4_e3m0",
    ]
    for key in sorted(cells, key=lambda k: order.index(k) if k in order else len(order)):
        row = [cells[key].get(size, "–") for size, _, _ in settings_by_size(runs)]
        print(f"| {NAMES.get(key, key)} | " + " | ".join(row) + " |")


# -- the gap against N: ours beside the papers' ------------------------------------------------------------
def paper_gaps() -> dict[str, list[tuple[float, float]]]:
    """The papers' final gap to DP (%) against N, per method key of ours they correspond to.

    DiLoCo M = 1 and M = 2 (H = 30 there too): Scaling Laws Table 4; Streaming DiLoCo H = 30 and H = 100
    (P of 3 blocks, FP4, tau = 1 or more): Streaming DiLoCo Table 5. The papers count N with embeddings at
    nominal sizes (35M and up); ours are non-embedding parameters: the comparison is of trends, not rows."""
    import importlib.resources as resources

    t4 = paper_table4()
    cols = t4["columns"]
    out: dict[str, list[tuple[float, float]]] = {"diloco-m1-h30": [], "diloco-m2-h30": []}
    for row in t4["rows"]:
        _, n, *losses = row
        loss = dict(zip(cols[2:], losses, strict=True))
        out["diloco-m1-h30"].append((n, 100 * (loss["diloco-m1"] / loss["dp"] - 1)))
        out["diloco-m2-h30"].append((n, 100 * (loss["diloco-m2"] / loss["dp"] - 1)))
    abl = json.loads((resources.files("diloco.sim.data") / "ablations.json").read_text())["paper"]
    dp = dict((n, loss) for n, loss in abl["dp_table5"]["rows"])
    sd = {n: (h30, h100) for n, h30, h100 in abl["sync_every"]["rows"]}
    out["streaming-m2-h30"] = [(n, 100 * (sd[n][0] / dp[n] - 1)) for n in sorted(dp)]
    out["streaming-m2-h100"] = [(n, 100 * (sd[n][1] / dp[n] - 1)) for n in sorted(dp)]
    return out


def _series(key: str) -> str | None:
    """The papers' series a run of ours sits beside (FP4 and FP32 Streaming alike: the papers found no cost)."""
    for series in ("diloco-m1-h30", "diloco-m2-h30", "streaming-m2-h30", "streaming-m2-h100"):
        if key.startswith(series):
            return series
    return None


def gap_against_n(runs: list[dict]) -> list[dict]:
    """Per (size, method, outer settings): our final gap to DP (mean over seeds) and, at the same N, the papers'
    trend gap = a + b log10 N (least squares over their rows) extrapolated down to our size."""
    import numpy as np

    papers = paper_gaps()
    trend = {k: np.polyfit(np.log10([n for n, _ in v]), [g for _, g in v], 1) for k, v in papers.items()}
    rows = []
    for size, dp, by in settings_by_size(runs):
        for (key, inner_lr, outer, warm), rs in sorted(by.items()):
            if not _series(key):
                continue
            gaps = [100 * (r["final_eval_loss"] / dp["final_eval_loss"] - 1) for r in rs]
            b, a = trend[_series(key)]
            n = rs[0]["num_params"]
            rows.append(
                {
                    "size": size,
                    "num_params": n,
                    "key": key,
                    "outer": list(outer),
                    "inner_lr": inner_lr,
                    "warmup_steps": warm,
                    "seeds": len(rs),
                    "gap_pct": float(np.mean(gaps)),
                    "gap_pct_seeds": gaps,
                    "papers_trend_gap_pct": float(a + b * np.log10(n)),
                    "papers_gap_pct_at_smallest": papers[_series(key)][0][1],
                    "papers_smallest_n": papers[_series(key)][0][0],
                }
            )
    return rows


def report_gap_against_n(rows: list[dict]) -> None:
    print(
        "\nThe gap against N: ours (final, 20 tokens/param, mean over seeds) beside the papers' (also 20 tokens/param)."
    )
    print(
        "'papers' trend' extrapolates gap = a + b log10(N) from the papers' rows (35M and up) to our N: a "
        "direction, not a prediction."
    )
    print(
        f"{'size':<10} {'method':<28} {'inner lr':>8} {'outer':>9} {'warmup':>6} {'seeds':>5} {'ours':>7} {'papers trend':>12} "
        f"{'papers at 35M':>13}"
    )
    for r in rows:
        outer = "-" if not r["outer"] else f"{r['outer'][0]:g} / {r['outer'][1]:g}"
        print(
            f"{r['size']:<10} {r['key']:<28} {r['inner_lr']!s:>8} {outer:>9} {r['warmup_steps']!s:>6} {r['seeds']:>5} {r['gap_pct']:>+6.2f}% "
            f"{r['papers_trend_gap_pct']:>+11.2f}% {r['papers_gap_pct_at_smallest']:>+12.2f}%"
        )


def plot_gap_against_n(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    papers = paper_gaps()
    fig, axes = plt.subplots(1, len(papers), figsize=(4.2 * len(papers), 4), sharey=True)
    for ax, (series, pts) in zip(axes, papers.items(), strict=True):
        n, g = zip(*pts, strict=True)
        ax.plot(n, g, "ks", label="papers (20 tokens/param)")
        b, a = np.polyfit(np.log10(n), g, 1)
        xs = np.logspace(4.8, np.log10(max(n)), 50)  # down to the smallest of ours (cpu-0.1m, 97k)
        ax.plot(xs, a + b * np.log10(xs), "k--", lw=0.8, label="papers' trend, extrapolated")
        mine = [
            x
            for x in rows
            if _series(x["key"]) == series
            and x["key"] == series + ("-fp4_e3m0" if series.startswith("streaming") else "")
        ]
        for r in mine:  # every setting tried, faded: the spread over settings at each size
            ax.plot(
                [r["num_params"]] * len(r["gap_pct_seeds"]),
                r["gap_pct_seeds"],
                "o",
                color="C0",
                alpha=0.25,
                ms=4,
                label=None,
            )
        best = {}  # per size, the setting with the lowest mean gap
        for r in mine:
            if r["size"] not in best or r["gap_pct"] < best[r["size"]]["gap_pct"]:
                best[r["size"]] = r
        if best:
            ax.plot([], [], "o", color="C0", alpha=0.25, ms=4, label="ours, every setting tried")
            pts = sorted((r["num_params"], r["gap_pct"]) for r in best.values())
            ax.plot(*zip(*pts, strict=True), "o-", color="C3", ms=7, label="ours, best setting per size")
        ax.axhline(0, color="grey", lw=0.6)
        ax.set(xscale="log", title=series, xlabel="parameters N")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    axes[0].set_ylabel("final eval loss vs DP (%)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    runs = collect()
    if not runs:
        print(
            "no long runs yet (studies/outer-tuning/stages.py write long; then run the long-* grids: stages.py grids long-)"
        )
        return 1
    if sys.argv[1:] == ["--markdown"]:
        markdown(runs)
        return 0
    if sys.argv[1:] == ["--best"]:
        markdown_best(runs)
        return 0
    report(runs)
    gaps = gap_against_n(runs)
    report_gap_against_n(gaps)
    summary = {"runs": runs, "gap_against_n": gaps}
    SUMMARY.write_text(json.dumps(summary, indent=1, allow_nan=False) + "\n")
    plot(runs, HERE / "long-curves.png")
    plot_gap_against_n(gaps, HERE / "long-gap-vs-n.png")
    print(f"\nwrote {SUMMARY}, {HERE / 'long-curves.png'} and {HERE / 'long-gap-vs-n.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
