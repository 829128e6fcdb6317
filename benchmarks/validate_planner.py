"""The planner's predictions against this project's own measurements.

    .venv/bin/python benchmarks/validate_planner.py          # ~20 s; reads results, trains nothing

1. **Utilization and wall-clock** against ``benchmarks/results/link.json`` (two workers over an
   emulated link, ``benchmarks/link.py``: 3 bandwidths x 5 methods, with each run's measured compute
   time per step, utilization, seconds per step and the bandwidth an all-gather actually got). The
   planner (:func:`diloco.sim.planner.evaluate`) is given what a user would give it: the model
   (parameters, layers, non-block parameters), the measured compute step time, M = 2, this
   project's exchange (all-gather) and release (after the step), and either the configured link
   bandwidth or the delivered one. Error in utilization points and in seconds per step.
2. **Eval loss** against ``benchmarks/results/quality.json`` (cpu-1m, 2M tokens, M = 2, five
   methods at their best inner lr): the loss model (:class:`diloco.sim.loss.LossModel`) with the
   laws of this project's laptop study (``studies/laptop/results.jsonl`` through ``diloco fit``)
   or the paper's, and the papers' or this project's ablation costs. Error of the loss and of the
   gap to DP. (The project's ablation costs are measured on these very runs: in-sample.)

Prints both tables and writes benchmarks/results/validate_planner.json.
"""

import argparse
from pathlib import Path

from diloco.bench import RESULTS_DIR, add_out, write_result
from diloco.bench.planner_check import validate_link, validate_quality
from diloco.sim.loss import LossModel

ROOT = RESULTS_DIR.parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--link", type=Path, default=RESULTS_DIR / "link.json")
    ap.add_argument("--quality", type=Path, default=RESULTS_DIR / "quality.json")
    ap.add_argument("--laptop", type=Path, default=ROOT / "studies" / "laptop" / "results.jsonl")
    add_out(ap, "validate_planner")
    args = ap.parse_args()

    link = validate_link(args.link, LossModel.paper())
    print(
        "== utilization and seconds per step: planner vs measured (benchmarks/results/link.json; "
        "exchange all_gather, release after-step)"
    )
    print(
        f"{'Mbit/s':>7} {'method':<13} {'measured':>9} {'@config':>8} {'err':>6} {'@deliv':>7} {'err':>6}   "
        f"{'s/step':>7} {'pred@deliv':>10} {'err':>6}"
    )
    for r in link["rows"]:
        print(
            f"{r['mbps']:>7g} {r['method']:<13} {r['measured_utilization']:>9.1%} "
            f"{r['predicted_utilization_configured']:>8.1%} {r['error_points_configured']:>+6.1f} "
            f"{r['predicted_utilization_delivered']:>7.1%} {r['error_points_delivered']:>+6.1f}   "
            f"{r['measured_s_per_step']:>7.3f} {r['predicted_s_per_step_delivered']:>10.3f} "
            f"{r['s_per_step_error_pct_delivered']:>+5.1f}%"
        )
    for key, s in link["summary"].items():
        print(
            f"  at the {key} bandwidth: mean |error| {s['mean_abs_points']:.1f} points, max {s['max_abs_points']:.1f}, "
            f"{s['within_5_points']}/{s['cells']} within 5 points; s/step mean |error| "
            f"{s['mean_abs_s_per_step_pct']:.1f} %, max {s['max_abs_s_per_step_pct']:.1f} %"
        )

    quality = validate_quality(args.quality, args.laptop)
    keys = list(quality["summary"])
    print("\n== eval loss: loss model vs measured (benchmarks/results/quality.json; law / ablations)")
    print(f"{'run':<15} {'measured':>9} " + " ".join(f"{k:>22}" for k in keys))
    for r in quality["rows"]:
        cells = " ".join(f"{r[k]:>13.4f} ({r[k + ' error_pct']:+5.1f}%)" for k in keys)
        print(f"{r['run']:<15} {r['measured']:>9.4f} {cells}")
    for k, s in quality["summary"].items():
        print(
            f"  {k:<16} mean |loss error| {s['mean_abs_loss_error_pct']:.1f} % (max {s['max_abs_loss_error_pct']:.1f} %); "
            f"mean |error of the gap to DP| {s['mean_abs_gap_error_points']:.1f} points"
        )
    for note in quality["notes"]:
        print(f"  note: {note}")
    write_result("validate_planner", {"link": link, "quality": quality}, out=args.out)


if __name__ == "__main__":
    main()
