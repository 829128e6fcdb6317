"""Where does DiLoCo's laptop-scale gap to DP come from? One factor at a time, at a fixed token budget.

Starts from benchmarks/quality.py's setting (cpu-1m, vocab 4096, demo preset) and each method's best
inner lr found there (read from benchmarks/results/quality.json), then changes one thing at a time
for DiLoCo M=2: the outer learning rate, H, and the global batch (DP is rerun at the same batch, so
every gap is against DP at equal tokens and batch). Finished runs are reused.

    .venv/bin/python benchmarks/gap_ablation.py                 # ~12 min on 2 idle cores (1M tokens)

Prints the gap of each variant to DP and writes benchmarks/results/gap_ablation.json.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from diloco.bench import write_result
from diloco.compare import run_compare
from diloco.files import default_cache_dir
from diloco.train.config import TrainConfig, load_preset

RESULTS = Path(__file__).parent / "results"

#: (name, what changes for DiLoCo M=2, what changes for the DP it is compared with)
VARIANTS = [
    ("reference (H=30, outer lr 0.7, batch 16)", {}, {}),
    ("outer lr 0.4", {"outer_lr": 0.4}, {}),
    ("outer lr 1.0", {"outer_lr": 1.0}, {}),
    ("H=10", {"sync_every": 10}, {}),
    ("global batch 32", {"global_batch": 32}, {"global_batch": 32}),
]


def run_name(method: str, lr: float, tokens: int, change: dict) -> str:
    """quality.py's names for the reference runs (so its budget runs are reused), plus the change."""
    return f"{method}@lr{lr:g}@{tokens // 1000}k" + "".join(f"+{k}{v:g}" for k, v in change.items())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=1_000_000)
    ap.add_argument("--threads", type=int, default=0, help="torch threads per replica (0: cores // replicas)")
    ap.add_argument(
        "--quality",
        type=Path,
        default=RESULTS / "quality.json",
        help="quality.py's results: the best inner lr of dp and diloco",
    )
    ap.add_argument(
        "--runs",
        type=Path,
        default=Path("runs/quality/budgets"),
        help="run directory (default: quality.py's budget runs, whose reference runs are reused)",
    )
    ap.add_argument("--cache-dir", type=Path, default=default_cache_dir())
    ap.add_argument("--out", type=Path, default=RESULTS / "gap_ablation.json")
    args = ap.parse_args()
    if not args.quality.exists():
        raise SystemExit(f"{args.quality} not found: run benchmarks/quality.py first (it picks the inner lrs)")
    best = {r["name"]: r["inner_lr"] for r in json.loads(args.quality.read_text())["best"]}
    base = {
        **load_preset("demo")["base"],
        "steps": 0,
        "tokens": args.tokens,
        "eval_every": 100,
        "warmup_steps": 50,
        "threads": args.threads,
    }
    configs, pairs = {}, []
    for name, diloco_kw, dp_kw in VARIANTS:
        dp_name = run_name("dp", best["dp"], args.tokens, dp_kw)
        dl_name = run_name("diloco", best["diloco"], args.tokens, diloco_kw)
        configs[dp_name] = TrainConfig.from_dict({**base, "method": "dp", "inner_lr": best["dp"], **dp_kw})
        configs[dl_name] = TrainConfig.from_dict({**base, "method": "diloco", "inner_lr": best["diloco"], **diloco_kw})
        pairs.append((name, dp_name, dl_name))
    runs = {n: r for n, r in zip(configs, run_compare(configs, args.runs, cache_dir=args.cache_dir, progress=True))}
    rows = []
    for name, dp_name, dl_name in pairs:
        dp, dl = runs[dp_name], runs[dl_name]
        rows.append(
            {
                "variant": name,
                "diloco_eval_loss": dl["final_eval_loss"],
                "dp_eval_loss": dp["final_eval_loss"],
                "gap_pct": 100 * (dl["final_eval_loss"] / dp["final_eval_loss"] - 1),
                "outer_steps": dl["config"]["tokens"]
                // (dl["config"]["global_batch"] * dl["config"]["seq_len"])
                // dl["config"]["sync_every"],
            }
        )
    print(f"\nDiLoCo M=2 against DP, {args.tokens:,} tokens, inner lr DP {best['dp']:g} / DiLoCo {best['diloco']:g}:")
    print(f"  {'variant':<42} {'DiLoCo':>8} {'DP':>8} {'gap':>8} {'outer steps':>12}")
    for r in rows:
        print(
            f"  {r['variant']:<42} {r['diloco_eval_loss']:8.4f} {r['dp_eval_loss']:8.4f} {r['gap_pct']:+7.2f}% "
            f"{r['outer_steps']:>12}"
        )
    write_result("gap_ablation", {"tokens": args.tokens, "inner_lr": best, "rows": rows}, out=args.out)


if __name__ == "__main__":
    main()
