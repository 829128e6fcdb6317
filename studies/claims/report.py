"""The claims study's tables from its records, as docs/results/index.md shows them (a test holds the two equal):
the ablation (each point's seed mean ± s.e. and its cost against the reference, Streaming FP4, and against tuned
DiLoCo, in percent, with the s.e. of the difference), the batch bracket (each method's loss at each inner lr and
batch, its best lr, and its best batch) and claim 2 with seeds (DiLoCo against data-parallel at each batch).

    .venv/bin/python studies/claims/report.py      # prints the tables, writes claims-summary.json
"""

from __future__ import annotations

import sys

from diloco.files import read_jsonl, write_json
from diloco.studies.claims import (
    HERE,
    ablation_markdown,
    ablation_table,
    against_dp,
    against_dp_markdown,
    batch_markdown,
    batch_table,
)


def main() -> int:
    path = HERE / "results.jsonl"
    records = read_jsonl(path) if path.exists() else []
    rows = ablation_table(records)
    batches = batch_table(records)
    vs_dp = against_dp(batches)
    print("Claim 1, the ablation:\n")
    print("\n".join(ablation_markdown(rows)))
    print("\nClaim 3, the batch bracket:\n")
    print("\n".join(batch_markdown(batches)))
    print("\nClaim 2 with seeds, from the bracket:\n")
    print("\n".join(against_dp_markdown(vs_dp)))
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
    write_json(HERE / "claims-summary.json", {"ablation": rows, "batch": summary, "against_dp": vs_dp})
    return 0


if __name__ == "__main__":
    sys.exit(main())
