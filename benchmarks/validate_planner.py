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

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from diloco.files import write_json
from diloco.scaling.fit import fit_scaling
from diloco.scaling.records import load_records
from diloco.sim.hardware import ModelSpec
from diloco.sim.loss import LossModel
from diloco.sim.planner import Candidate, Setup, codec_bits, evaluate

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def candidate_of(row: dict) -> Candidate:
    codec = row["codec"]
    if row["kind"] == "dp":
        return Candidate("dp", codec=codec)
    if row["kind"] == "diloco":
        return Candidate("diloco", sync_every=row["H"], codec=codec)
    return Candidate("streaming", sync_every=row["H"], num_fragments=row["P"], overlap_steps=row["tau"], codec=codec)


def validate_link(path: Path, loss_model: LossModel) -> dict:
    data = json.loads(path.read_text())
    rows = []
    for r in data["rows"]:
        model = ModelSpec(
            r["num_layers"],
            float(r["num_params"]),
            r["compute_s_per_step"],
            float(r["non_block_params"]),
            name="cpu-1m",
        )
        cand = candidate_of(r)
        out = {
            "method": r["method"],
            "mbps": r["mbps"],
            "effective_mbps": r["effective_mbps"],
            "measured_utilization": r["utilization"],
            "measured_s_per_step": r["s_per_step"],
            "compute_s_per_step": r["compute_s_per_step"],
        }
        workers, exchange = r.get("workers", 2), r.get("exchange", "all_gather")  # what the run did
        out.update(workers=workers, exchange=exchange)
        for key, mbps in (("configured", r["mbps"]), ("delivered", r["effective_mbps"])):
            setup = Setup(
                model,
                "measured compute time per step (link.json)",
                workers,
                r["steps"] * 16 * 128,
                16 * 128,
                exchange=exchange,
                overlap_backward=False,
            )
            plan = evaluate(setup, [Candidate("dp"), cand] if cand.method != "dp" else [cand], [mbps * 1e6], loss_model)
            ev = next(e for e in plan.rows[mbps * 1e6] if e.candidate == cand)
            out[f"predicted_utilization_{key}"] = ev.utilization
            out[f"predicted_s_per_step_{key}"] = ev.wall_clock_s / setup.steps
            out[f"error_points_{key}"] = 100 * (ev.utilization - r["utilization"])
            out[f"s_per_step_error_pct_{key}"] = 100 * (ev.wall_clock_s / setup.steps / r["s_per_step"] - 1)
        rows.append(out)
    summary = {}
    for key in ("configured", "delivered"):
        errs = [abs(r[f"error_points_{key}"]) for r in rows]
        wall = [abs(r[f"s_per_step_error_pct_{key}"]) for r in rows]
        summary[key] = {
            "mean_abs_points": statistics.mean(errs),
            "max_abs_points": max(errs),
            "within_5_points": sum(e <= 5 for e in errs),
            "cells": len(errs),
            "mean_abs_s_per_step_pct": statistics.mean(wall),
            "max_abs_s_per_step_pct": max(wall),
        }
    return {"rows": rows, "summary": summary}


def validate_quality(quality_path: Path, laptop_results: Path) -> dict:
    from diloco.models import count_params, make_config

    q = json.loads(quality_path.read_text())
    best = {b["name"]: b for b in q["best"]}
    cfg0 = best["dp"]["config"]
    n = count_params(
        make_config(cfg0["size"], vocab_size=cfg0["vocab_size"], seq_len=cfg0["seq_len"]), embeddings=False
    )
    laptop_fit = fit_scaling(load_records(laptop_results), max_inits=32, alternatives=())
    models = {
        ("laptop", "paper"): LossModel(laptop_fit, source=str(laptop_results), ablations="paper"),
        ("laptop", "project"): LossModel(laptop_fit, source=str(laptop_results), ablations="project"),
        ("paper", "paper"): LossModel.paper(ablations="paper"),
    }
    out_rows = []
    for name, b in best.items():
        c = b["config"]
        method, m = c["method"], c["replicas"]
        bits = codec_bits(c["codec"], n)  # the codec's exact bytes for n values x 8 / n
        row = {
            "run": name,
            "method": method,
            "replicas": m,
            "H": c["sync_every"],
            "P": c["num_fragments"],
            "tau": c["overlap_steps"],
            "codec": c["codec"],
            "measured": b["final_eval_loss"],
            "measured_vs_dp_pct": b["loss_vs_dp_pct"],
            "non_embedding_params": n,
            "tokens": b["tokens"],
        }
        for (law, abl), lm in models.items():
            est = lm.estimate(
                method=method,
                num_params=n,
                replicas=m,
                tokens=b["tokens"],
                sync_every=c["sync_every"],
                num_fragments=c["num_fragments"],
                fragment_layers=None,
                overlap_steps=c["overlap_steps"],
                bits=bits,
            )
            row[f"{law}/{abl}"] = est.loss
        out_rows.append(row)
    dp = next(r for r in out_rows if r["run"] == "dp")
    summary = {}
    for key in (f"{law}/{abl}" for law, abl in models):
        loss_err = [100 * (r[key] / r["measured"] - 1) for r in out_rows]
        gap_err = [100 * (r[key] / dp[key] - 1) - r["measured_vs_dp_pct"] for r in out_rows if r["run"] != "dp"]
        for r, e in zip(out_rows, loss_err):
            r[f"{key} error_pct"] = e
        summary[key] = {
            "mean_abs_loss_error_pct": statistics.mean(abs(e) for e in loss_err),
            "max_abs_loss_error_pct": max(abs(e) for e in loss_err),
            "mean_abs_gap_error_points": statistics.mean(abs(e) for e in gap_err),
        }
    return {
        "rows": out_rows,
        "summary": summary,
        "laptop_fit_laws": {k: v.coef for k, v in laptop_fit.loss_laws_c.items()},
        "notes": [
            "laws fitted at 20 tokens/param (laptop study) or the paper's; these runs use ~2 tokens per "
            "non-embedding parameter: the token budget is moved by Chinchilla's data term (extrapolation)",
            "the 'project' ablation costs are measured on these very runs (in-sample)",
        ],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--link", type=Path, default=RESULTS / "link.json")
    ap.add_argument("--quality", type=Path, default=RESULTS / "quality.json")
    ap.add_argument("--laptop", type=Path, default=ROOT / "studies" / "laptop" / "results.jsonl")
    ap.add_argument("--out", type=Path, default=RESULTS / "validate_planner.json")
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
    write_json(args.out, {"link": link, "quality": quality})
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
