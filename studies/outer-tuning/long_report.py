"""Point 4 of issue 15: the long runs against DP, beside the targets; curves and gaps as JSON and a plot.

    .venv/bin/python studies/outer-tuning/long_report.py      # reads results-long.jsonl and the run folders

Writes long-summary.json (every run's eval-loss curve, final loss, bytes per replica) and long-curves.png
(eval loss against tokens, and each method's gap to DP against tokens per parameter, per size). A run
still in progress shows its curve so far (from its metrics.jsonl) and no final loss.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
from stages import method_key  # noqa: E402

from diloco.scaling.sweep import _model_zoo_params  # noqa: E402 - N as the sweep counts it
from diloco.traffic import exchange_bytes  # noqa: E402


def dp_bytes_at_m2(summary: dict) -> float | None:
    """What DP over M = 2 replicas sends per replica (fp32 gradients every step: the trainer's DP exchange
    at M = 2), from a DP run's summary; the sweep runs DP with one replica, which sends nothing."""
    if not summary.get("num_params") or not summary.get("steps"):
        return None
    return summary["steps"] * exchange_bytes(payload_bytes=4 * summary["num_params"], num_replicas=2,
                                             exchange="all_gather")

TARGETS = {  # method key -> (max final loss / DP's, min DP bytes / the method's), from issue 15
    "streaming-m2-h30-fp4_e3m0": (1.01, 200.0), "streaming-m2-h100-fp4_e3m0": (1.015, 600.0),
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
    """One entry per long run: finished ones from results-long.jsonl, unfinished ones from runs/."""
    runs = {}
    for rec in _rows(HERE / "results-long.jsonl"):
        runs[rec["run_id"]] = rec
    for cfg in sorted((ROOT / "runs" / "outer-tuning").glob("long-*/*/config.json")):
        run_id = cfg.parent.name
        if run_id not in runs:
            runs[run_id] = {"run_id": run_id, "run_dir": str(cfg.parent.relative_to(ROOT)), "status": "running"}
    out = []
    for run_id, rec in runs.items():
        run_dir = ROOT / rec["run_dir"]
        config = json.loads((run_dir / "config.json").read_text()) if (run_dir / "config.json").exists() else {}
        metrics = _rows(run_dir / "metrics.jsonl")
        curve = [(m["tokens_seen"], m["eval_loss"]) for m in metrics if "eval_loss" in m and m["eval_loss"] is not None]
        summary = json.loads((run_dir / "summary.json").read_text()) if (run_dir / "summary.json").exists() else {}
        outer = (config.get("outer_lr"), config.get("outer_momentum")) if config.get("method") != "dp" else None
        if "method" in rec:
            key, seed, size, n = method_key(rec), rec["seed"], rec["size"], rec["num_params"]
        else:  # unfinished: name it from its config
            pseudo = {"method": config.get("method"), "replicas": config.get("replicas"),
                      "sync_every": config.get("sync_every"), "base": {"codec": config.get("codec")}}
            key = method_key(pseudo) if pseudo["method"] else "?"
            seed, size = config.get("seed"), config.get("size")
            n = _model_zoo_params(size, config) if size else None
        out.append({"run_id": run_id, "key": key, "seed": seed, "size": size, "num_params": n, "outer": outer,
                    "inner_lr": config.get("inner_lr"), "warmup_steps": config.get("warmup_steps"),
                    "status": rec.get("status"), "final_eval_loss": summary.get("final_eval_loss"),
                    "bytes_sent_per_replica": summary.get("bytes_sent_per_replica"),
                    "dp_bytes_at_m2": dp_bytes_at_m2(summary) if key == "dp" else None, "curve": curve})
    return sorted(out, key=lambda r: (str(r["size"]), r["key"], str(r["seed"])))


def report(runs: list[dict]) -> None:
    for size in sorted({str(r["size"]) for r in runs}):
        group = [r for r in runs if str(r["size"]) == size]
        dp = [r for r in group if r["key"] == "dp" and r["final_eval_loss"] is not None]
        dp_loss = dp[0]["final_eval_loss"] if dp else None
        dp_bytes = dp[0]["dp_bytes_at_m2"] if dp else None
        print(f"\n{size}: final eval loss of the global parameters; bytes sent per replica against DP's at M = 2 "
              f"(fp32 gradients every step, {dp_bytes / 1e9:.2f} GB)" if dp_bytes else f"\n{size}: (no DP run yet)")
        print(f"{'method':<28} {'seed':>4} {'inner lr':>8} {'outer':>9} {'eval loss':>9} {'/ DP':>7} "
              f"{'DP bytes / bytes':>16}  target")
        for r in group:
            loss = r["final_eval_loss"]
            ratio = loss / dp_loss if loss is not None and dp_loss else None
            fewer = dp_bytes / r["bytes_sent_per_replica"] if dp_bytes and r["bytes_sent_per_replica"] else None
            t = TARGETS.get(r["key"])
            verdict = "-"
            if t and ratio is not None:
                parts = [f"loss {'met' if ratio <= t[0] else 'MISSED'} (<= {t[0]:g} x DP)"]
                if t[1]:
                    parts.append(f"bytes {'met' if fewer is not None and fewer >= t[1] else 'MISSED'} (>= {t[1]:g}x fewer)")
                verdict = ", ".join(parts)
            shown = f"{loss:.4f}" if loss is not None else f"({len(r['curve'])} evals)"
            outer = "-" if not r["outer"] else f"{r['outer'][0]:g} / {r['outer'][1]:g}"
            print(f"{r['key']:<28} {str(r['seed']):>4} {r['inner_lr']!s:>8} {outer:>9} {shown:>9} {ratio if ratio is None else round(ratio, 4)!s:>7} "
                  f"{'-' if fewer is None else f'{fewer:,.0f}':>16}  {verdict}")


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
        dp = next((r for r in group if r["key"] == "dp"), None)
        for i, r in enumerate(group):
            color = f"C{i % 10}"  # the same run, the same colour in both panels
            t, loss = zip(*r["curve"], strict=True)
            label = f"{r['key']} s{r['seed']}" + ("" if not r["outer"] else f" outer {r['outer'][0]:g}/{r['outer'][1]:g}")
            axes[0][col].plot(t, loss, label=label, color=color)
            if dp is not None and r is not dp and r["num_params"]:
                ref = dict(dp["curve"])
                pts = [(tok / r["num_params"], 100 * (l_ / ref[tok] - 1)) for tok, l_ in r["curve"] if tok in ref]
                if pts:
                    axes[1][col].plot(*zip(*pts, strict=True), marker=".", label=label, color=color)
        axes[0][col].set(title=f"{size}: eval loss (global parameters)", xlabel="tokens", ylabel="eval loss")
        axes[0][col].set_ylim(top=min(6.0, axes[0][col].get_ylim()[1]))
        axes[1][col].axhline(0, color="k", lw=0.8)
        axes[1][col].set(title=f"{size}: gap to DP at the same tokens",
                         xlabel="tokens per parameter", ylabel="eval loss vs DP (%)")
        for ax in axes[:, col]:
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    runs = collect()
    if not runs:
        print("no long runs yet (studies/outer-tuning/stages.py write long; then run the long-*.json grids)")
        return 1
    report(runs)
    (HERE / "long-summary.json").write_text(json.dumps(runs, indent=1, allow_nan=False) + "\n")
    plot(runs, HERE / "long-curves.png")
    print(f"\nwrote {HERE / 'long-summary.json'} and {HERE / 'long-curves.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
