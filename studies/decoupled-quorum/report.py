"""The table of studies/decoupled-quorum: final loss per (M, K, merge, outer_scale, tau), seed mean +- standard
error, against K = M (same M, merge, tau) and against data-parallel; and what a divergence guard would see.

    python studies/decoupled-quorum/report.py [results-cpu2.jsonl]     # prints Markdown
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from collections import defaultdict
from pathlib import Path

from diloco.seed_stats import mean_se as seed_mean_se

HERE = Path(__file__).resolve().parent
DIVERGED = 10.0  # a final loss above this (ln 512 = 6.24 is a model that learnt nothing) counts as diverged


def mean_se(xs: list[float]) -> tuple[float, float]:
    """The mean and its standard error (NaN for one value: what :func:`fmt` prints without an error)."""
    m, se = seed_mean_se(xs)
    return m, float("nan") if se is None else se


def fmt(m: float, se: float) -> str:
    if m > DIVERGED:
        return f"diverged ({m:.2g})"
    return f"{m:.4f}" if math.isnan(se) else f"{m:.4f} ± {se:.4f}"


def main() -> None:
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else HERE / "results-cpu2.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    rows = [r for r in rows if r.get("final_eval_loss") is not None]
    groups: dict[tuple, list[float]] = defaultdict(list)
    for r in rows:
        groups[(r["method"], r["M"], r["K"], r["merge"], r["scale"], r["tau"])].append(r["final_eval_loss"])
    dp = [x for k, v in groups.items() if k[0] == "dp" for x in v]
    dp_m, dp_se = mean_se(dp)
    print(f"Data-parallel (M = 4, same tokens): {fmt(dp_m, dp_se)} over {len(dp)} seeds\n")
    print("| M | K | merge | outer_scale | τ | seeds | final loss (mean ± s.e.) | vs K = M | vs DP |")
    print("|---|---|---|---|---|---|---|---|---|")
    keys = sorted(
        (k for k in groups if k[0] == "decoupled"),
        key=lambda k: (k[5], k[1], k[3], -k[2], ["share", "sqrt-share", "none"].index(k[4])),
    )
    for k in keys:
        _, M, K, merge, scale, tau = k
        xs = groups[k]
        m, se = mean_se(xs)
        ref = groups.get(("decoupled", M, M, merge, "share", tau))
        vs_k = "—" if K == M or not ref or m > DIVERGED else f"{100 * (m / statistics.fmean(ref) - 1):+.2f} %"
        vs_dp = "—" if m > DIVERGED else f"{100 * (m / dp_m - 1):+.2f} %"
        print(
            f"| {M} | {K} | {merge} | {scale if K < M else '(any)'} | {tau} | {len(xs)} | {fmt(m, se)} | {vs_k} | "
            f"{vs_dp} |"
        )
    # what the divergence guard (diverge_factor 3, reference min(first eval, ln 512)) would have done
    ln_v = math.log(512)

    def ratio(r: dict) -> float:
        return r["max_eval"] / min(r["first_eval"], ln_v)

    scaled = [r for r in rows if r["scale"] != "none"]
    old = [r for r in rows if r["scale"] == "none"]
    tripped = [r for r in rows if ratio(r) > 3]
    print(
        f"\nThe divergence guard (stop above 3 x min(first evaluation, ln 512)): the {len(scaled)} runs of DP, K = M "
        f"and the scaled rules (share, sqrt-share) have a largest evaluation of at most "
        f"{max(map(ratio, scaled)):.3f} x that reference (none above 3); of the {len(old)} runs with a whole step "
        f"per merge (none), {len(tripped)} pass 3 (all {sum(r['final_eval_loss'] > DIVERGED for r in tripped)} end "
        f"above {DIVERGED:g}), the others reach at most "
        f"{max(ratio(r) for r in old if ratio(r) <= 3):.2f} x."
    )


if __name__ == "__main__":
    main()
