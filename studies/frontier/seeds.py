"""How far the seed moves a run at cpu-1m: each method's eval loss over the run at its best point, every seed.

    .venv/bin/python studies/frontier/seeds.py            # seeds.png from eval-curves-gpu.json
    .venv/bin/python studies/frontier/seeds.py --collect  # first rebuild eval-curves-gpu.json from the run folders

``--collect`` reads the eval losses of every GPU run (runs/frontier-gpu/SIZE/RUN/metrics.jsonl, the folders
gpu_sweep.sh brings back) into eval-curves-gpu.json, keyed by run_id, so that the plot needs no run folder.
The plot: data-parallel, Streaming FP4 tau = 1 and eager tau = H at batch 128 and inner lr 1.6e-2, each seed a
line, against the tokens seen; an inset of the last quarter, where the gaps are read.
"""

from __future__ import annotations

import json
import sys

from diloco.files import read_jsonl, write_json
from diloco.studies.frontier import HERE, method_name

ROOT = HERE.parents[1]


CURVES = HERE / "eval-curves-gpu.json"
SHOWN = {
    "dp": "data-parallel (AdamW)",
    "streaming-fp4-tau1": "Streaming FP4, tau = 1",
    "eager-fp4-mom0.5": "eager FP4, tau = H",
}


def collect() -> dict[str, list[list[float]]]:
    curves = {}
    for rec in read_jsonl(HERE / "results-gpu.jsonl"):
        path = ROOT / "runs" / "frontier-gpu" / rec["size"] / rec["run_id"] / "metrics.jsonl"
        if rec.get("status") == "ok" and path.exists():
            curves[rec["run_id"]] = [[r["tokens_seen"], r["eval_loss"]] for r in read_jsonl(path) if "eval_loss" in r]
    write_json(
        CURVES,
        {
            "_comment": "Eval loss over tokens seen of every GPU run of results-gpu.jsonl, by run_id "
            "(studies/frontier/seeds.py --collect).",
            "curves": curves,
        },
    )
    return curves


def main() -> int:
    curves = collect() if "--collect" in sys.argv[1:] else json.loads(CURVES.read_text())["curves"]
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = [
        r
        for r in read_jsonl(HERE / "results-gpu.jsonl")
        if r.get("status") == "ok" and r["global_batch"] == 128 and r["inner_lr"] == 0.016 and r["run_id"] in curves
    ]
    fig, ax = plt.subplots(figsize=(8, 4.8))
    inset = ax.inset_axes((0.42, 0.38, 0.55, 0.55))
    colors = dict(zip(SHOWN, ("black", "tab:blue", "tab:orange")))
    for name, label in SHOWN.items():
        runs = sorted((r for r in records if method_name(r) == name), key=lambda r: r["seed"])
        finals = [r["eval_loss"] for r in runs]
        for k, r in enumerate(runs):
            xs, ys = zip(*curves[r["run_id"]])
            xs = [x / 1e6 for x in xs]
            kw = dict(
                color=colors[name],
                lw=1,
                alpha=0.8,
                label=f"{label}: {len(runs)} seeds, final {min(finals):.3f}-{max(finals):.3f}" if k == 0 else None,
            )
            ax.plot(xs, ys, **kw)
            inset.plot(xs, ys, marker=".", **{**kw, "label": None})
    inset.set_xlim(14.5, 20)
    inset.set_ylim(3.2, 3.75)
    inset.grid(alpha=0.3)
    inset.tick_params(labelsize=7)
    ax.set_xlabel("tokens seen (millions)")
    ax.set_ylabel("eval loss")
    ax.set_ylim(3.1, 6.2)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower left", fontsize=8, frameon=True, framealpha=0.9)
    ax.set_title(
        "cpu-1m, batch 128, inner lr 1.6e-2, on one GPU: every seed (the gaps are read at the end)", fontsize=9
    )
    fig.tight_layout()
    fig.savefig(HERE / "seeds.png", dpi=120)
    plt.close(fig)
    print(f"wrote {HERE / 'seeds.png'} ({len(records)} runs at batch 128, lr 1.6e-2)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
