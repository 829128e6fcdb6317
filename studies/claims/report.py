"""The claims study's ablation table from its records: each factor's seed mean ± s.e. and its cost against the
reference (Streaming FP4) and against DiLoCo, in percent, with the s.e. of the difference.

    .venv/bin/python studies/claims/report.py      # prints the table, writes claims-summary.json
"""

from __future__ import annotations

import sys

from diloco.files import read_jsonl, write_json
from diloco.studies.claims import HERE, ablation_table


def _pct(v, se) -> str:
    return "–" if v is None else f"{v:+.2f} ± {se:.2f} %" if se is not None else f"{v:+.2f} %"


def main() -> int:
    path = HERE / "results.jsonl"
    records = read_jsonl(path) if path.exists() else []
    rows = ablation_table(records)
    print("| factor | seeds | eval loss (mean ± s.e.) | against Streaming FP4 | against DiLoCo |")
    print("|---|---|---|---|---|")
    for r in rows:
        se = f" ± {r['se']:.4f}" if r["se"] is not None else ""
        print(
            f"| {r['factor']} | {len(r['seeds'])} | {r['mean']:.4f}{se} | "
            f"{_pct(r['vs_streaming_pct'], r['vs_streaming_se_pct'])} | {_pct(r['vs_diloco_pct'], r['vs_diloco_se_pct'])} |"
        )
    write_json(HERE / "claims-summary.json", {"ablation": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
