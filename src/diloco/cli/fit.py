"""`diloco fit`: fit the scaling laws to a sweep's results; print the coefficients, write JSON."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def add_input_args(p: argparse.ArgumentParser) -> None:
    """Where the records come from and how the best point per size is chosen (shared with `report`)."""
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--results", type=Path, help="sweep results JSONL (from `diloco sweep`)")
    src.add_argument("--paper-table4", action="store_true",
                     help="use the scaling-laws paper's Table 4 losses (arXiv 2503.09799), shipped with the package")
    p.add_argument("--smooth-by", choices=("global_batch", "inner_lr"), default=None,
                   help="best loss per size from a quadratic fit in log of this hyperparameter "
                        "(the paper does it for the batch size); default: the best run")
    p.add_argument("--max-inits", type=int, default=64, help="L-BFGS starts per law (default: 64)")


def load_fit(args: argparse.Namespace) -> tuple[Any, str]:
    """(ScalingFit, a one-line description of the data's source)."""
    from diloco.scaling.fit import fit_scaling, load_records, paper_table4, paper_table4_records

    if args.max_inits < 1:
        raise ValueError(f"--max-inits={args.max_inits}: need at least 1")
    if args.paper_table4:
        records, source = paper_table4_records(), paper_table4()["source"]
    else:
        records = load_records(args.results)
        source = str(args.results)
        if any(r.get("synthetic") for r in records):
            source += " (SYNTHETIC runner: a known noisy law, not training measurements)"
    return fit_scaling(records, smooth_by=args.smooth_by, max_inits=args.max_inits), source


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "fit", help="fit power laws to sweep results (loss, optimal lr and batch; held-out check)",
        description="Best loss per method and size, then A*N^alpha per method, A*N^alpha*M^beta and the "
                    "paper's Table 13 forms over DiLoCo's M, and power laws for the optimal inner lr and "
                    "batch; each also refitted without the largest size to measure the extrapolation error.",
    )
    add_input_args(p)
    p.add_argument("--json", type=Path, default=None,
                   help="where to write the fit (default: RESULTS with suffix .fit.json, or "
                        "paper_table4.fit.json with --paper-table4)")
    p.add_argument("--predict", type=float, action="append", default=[], metavar="N",
                   help="also print predictions at N parameters (repeatable)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from diloco.scaling.fit import split_key

    fit, source = load_fit(args)
    print(f"source: {source}\n")
    print(fit.coefficient_table())
    print("\nheld-out (largest size) mean |log y - log yhat|:")
    for (target, law), value in sorted(fit.mean_holdout().items()):
        print(f"  {target:<13} {law:<9} {value:.4f}")
    for n in args.predict:
        if not n > 0:
            raise ValueError(f"--predict {n}: give a positive parameter count, e.g. --predict 4e9")
        print(f"\npredictions at N = {n:.3g}:")
        for key in fit.loss_laws:
            method, m = split_key(key)
            print("  " + json.dumps(fit.predict(n, method=method, replicas=m).to_dict()))
    out = args.json or (Path("paper_table4.fit.json") if args.paper_table4 else args.results.with_suffix(".fit.json"))
    out.write_text(json.dumps({"source": source, **fit.to_dict()}, indent=2) + "\n")
    print(f"\nwrote {out}")
    return 0
