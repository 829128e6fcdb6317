"""The claims study's tables from its records: the ablation (each factor's seed mean ± s.e. and its cost against
the reference, Streaming FP4, and against DiLoCo, in percent, with the s.e. of the difference) and the batch
bracket (each method's best inner lr and loss at each batch, and its best batch).

    .venv/bin/python studies/claims/report.py      # prints the table, writes claims-summary.json
"""

from __future__ import annotations

import sys

from diloco.files import read_jsonl, write_json
from diloco.studies.claims import BRACKET_SEED, HERE, ablation_table, batch_table


def _pct(v, se) -> str:
    return "–" if v is None else f"{v:+.2f} ± {se:.2f} %" if se is not None else f"{v:+.2f} %"


def main() -> int:
    path = HERE / "results.jsonl"
    records = read_jsonl(path) if path.exists() else []
    rows = ablation_table(records)
    print(
        "| factor | seeds | eval loss (mean ± s.e.) | against Streaming FP4 | against DiLoCo (0.7 / 0.9) "
        "| against DiLoCo tuned (0.7 / 0.5) |"
    )
    print("|---|---|---|---|---|---|")
    for r in rows:
        se = f" ± {r['se']:.4f}" if r["se"] is not None else ""
        print(
            f"| {r['factor']} | {len(r['seeds'])} | {r['mean']:.4f}{se} | "
            f"{_pct(r['vs_streaming_pct'], r['vs_streaming_se_pct'])} | {_pct(r['vs_diloco_pct'], r['vs_diloco_se_pct'])} | "
            f"{_pct(r['vs_diloco_tuned_pct'], r['vs_diloco_tuned_se_pct'])} |"
        )
    batches = batch_table(records)
    print(
        f"\n| method | batch | eval loss at seed {BRACKET_SEED} per inner lr | best inner lr | seeds | "
        "eval loss at it (mean ± s.e.) |"
    )
    print("|---|---|---|---|---|---|")
    for name, t in batches.items():
        for batch, b in t["batches"].items():
            bracket = ", ".join(f"{lr:g}: {b['losses'][lr][BRACKET_SEED]:.4f}" for lr in b["bracket_lrs"])
            edge = " (bracket's edge)" if b["best_at_edge"] else ""
            se = f" ± {b['best_se']:.4f}" if b["best_se"] is not None else ""
            best = " **best batch**" if batch == t["best_batch"] else ""
            print(
                f"| {name} | {batch} | {bracket} | {b['best_lr']:g}{edge} | {len(b['seeds'])} | "
                f"{b['best_mean']:.4f}{se}{best} |"
            )
    summary = {
        name: {
            **t,
            "batches": {
                str(k): {**b, "losses": {str(lr): {str(s): x for s, x in v.items()} for lr, v in b["losses"].items()}}
                for k, b in t["batches"].items()
            },
        }
        for name, t in batches.items()
    }
    write_json(HERE / "claims-summary.json", {"ablation": rows, "batch": summary})
    return 0


if __name__ == "__main__":
    sys.exit(main())
