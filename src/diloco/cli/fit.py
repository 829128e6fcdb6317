"""`diloco fit`: fit the scaling laws to a sweep's results; print the coefficients, write JSON."""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path
from typing import Any

from diloco.errors import ConfigError


def add_input_args(p: argparse.ArgumentParser) -> None:
    """Where the records come from and how the best point per size is chosen (shared with `report`)."""
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--results", type=Path, help="sweep results JSONL (from `diloco sweep`)")
    src.add_argument(
        "--paper-table4",
        action="store_true",
        help="use the scaling-laws paper's Table 4 losses (arXiv 2503.09799), shipped with the package",
    )
    p.add_argument(
        "--smooth-by",
        choices=("global_batch", "inner_lr"),
        default=None,
        help="best loss per size from a quadratic fit in log of this hyperparameter "
        "(the paper does it for the batch size); default: the best run",
    )
    p.add_argument("--max-inits", type=int, default=64, help="L-BFGS starts per law (default: 64)")


def load_fit(args: argparse.Namespace) -> tuple[Any, str]:
    """(ScalingFit, a one-line description of the data's source)."""
    from diloco.scaling.fit import fit_scaling
    from diloco.scaling.records import load_records, paper_table4, paper_table4_records

    if args.max_inits < 1:
        raise ConfigError(f"--max-inits={args.max_inits}: need at least 1")
    if args.paper_table4:
        records, source = paper_table4_records(), paper_table4()["source"]
    else:
        records = load_records(args.results)
        source = str(args.results)
        if any(r.get("synthetic") for r in records):
            source += " (SYNTHETIC runner: a known noisy law, not training measurements)"
    bootstrap = getattr(args, "bootstrap", 0)  # `diloco report` draws no intervals
    if bootstrap < 0:
        raise ConfigError(f"--bootstrap={bootstrap}: give a number of refits >= 0")
    fit = fit_scaling(records, smooth_by=args.smooth_by, max_inits=args.max_inits, bootstrap=bootstrap)
    for message in fit.warnings:
        print(f"warning: {message}", file=sys.stderr)
    return fit, source


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "fit",
        help="fit power laws to sweep results (loss, optimal lr and batch; held-out check)",
        description="Best loss per method and size, then A*N^alpha per method, A*N^alpha*M^beta and the "
        "paper's Table 13 forms over DiLoCo's M, and power laws for the optimal inner lr and "
        "batch; each also refitted without the largest size to measure the extrapolation error.",
    )
    add_input_args(p)
    p.add_argument(
        "--bootstrap",
        type=int,
        default=100,
        metavar="K",
        help="residual-bootstrap refits of every loss law, for 90%% prediction intervals "
        "(default 100; 0: no intervals)",
    )
    p.add_argument(
        "--json",
        type=Path,
        default=None,
        help="where to write the fit (default: RESULTS with suffix .fit.json, or "
        "paper_table4.fit.json with --paper-table4)",
    )
    p.add_argument(
        "--predict",
        type=float,
        action="append",
        default=[],
        metavar="N",
        help="also print predictions at N parameters (repeatable)",
    )
    p.add_argument(
        "--tokens",
        type=float,
        default=None,
        metavar="D",
        help="with --predict: the token budget (default: the sweep's tokens per parameter x N); "
        "another budget is an extrapolation by Chinchilla's data term, and says so",
    )
    p.add_argument(
        "--replicas",
        type=int,
        action="append",
        default=[],
        metavar="M",
        help="with --predict: also predict DiLoCo at these M (repeatable; an M without its own law "
        "uses the joint law over M, and says so)",
    )
    p.set_defaults(func=run)


def _format_prediction(pr) -> str:
    span = (
        "" if pr.loss_interval is None else f" (90 % interval {pr.loss_interval[0]:.4f} .. {pr.loss_interval[1]:.4f})"
    )
    label = "dp" if pr.method == "dp" else f"{pr.method} M={pr.replicas}"
    lines = [f"  {label:<14} loss {pr.loss:.4f}{span}  [{pr.loss_law}]"]
    hp = {k: getattr(pr, k) for k in ("inner_lr", "global_batch_rounded", "outer_lr", "sync_every")}
    if any(v is not None for v in hp.values()):
        lines.append("                 " + ", ".join(f"{k} {v:.4g}" for k, v in hp.items() if v is not None))
    lines += [f"                 note: {n}" for n in pr.notes]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from diloco.files import write_json
    from diloco.scaling.records import split_key

    for n in args.predict:
        if not n > 0:
            raise ConfigError(f"--predict {n}: give a positive parameter count, e.g. --predict 4e9")
    if (args.tokens is not None or args.replicas) and not args.predict:
        raise ConfigError("--tokens and --replicas go with --predict N")
    if args.tokens is not None and not args.tokens > 0:
        raise ConfigError(f"--tokens {args.tokens}: give a positive token budget, e.g. --tokens 2e11")
    bad_m = [m for m in args.replicas if m < 1]
    if bad_m:
        raise ConfigError(f"--replicas {bad_m}: every M must be >= 1")
    out = args.json or (Path("paper_table4.fit.json") if args.paper_table4 else args.results.with_suffix(".fit.json"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit, source = load_fit(args)
    for w in caught:
        print(f"warning: {w.message}", file=sys.stderr)
    print(f"source: {source}\n")
    print(fit.coefficient_table())
    print("\nheld-out (largest size) mean |log y - log yhat|:")
    for (target, law), value in sorted(fit.mean_holdout().items()):
        print(f"  {target:<13} {law:<9} {value:.4f}")
    predictions = []
    for n in args.predict:
        tokens = f", {args.tokens:.3g} tokens" if args.tokens is not None else ""
        print(f"\npredictions at N = {n:.3g}{tokens}:")
        groups = [split_key(key) for key in fit.loss_laws]
        groups += [("diloco", m) for m in args.replicas if ("diloco", m) not in groups]
        for method, m in groups:
            pr = fit.predict(n, method=method, replicas=m, tokens=args.tokens)
            predictions.append(pr.to_dict())
            print(_format_prediction(pr))
    write_json(out, {"source": source, **fit.to_dict(), "predictions": predictions})
    print(f"\nwrote {out}")
    return 0
