"""`diloco simulate`: compute utilization vs cross-datacenter bandwidth, per method.

    diloco simulate --size 100B                       # Streaming DiLoCo Table 4's 100B column
    diloco simulate --layers 24 --params 1.3e9 --step-time 0.35 --methods dp,diloco --sync-every 30

Prints the bandwidth each method needs for 50/80/90/95/99 % utilization and
writes ``simulate.json`` and ``utilization.png`` to ``--out``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from diloco.sim.hardware import GBIT, PRESETS, ModelSpec, bandwidth_grid, preset
from diloco.sim.paper import PAPER_STEP_TIME_SCALE
from diloco.sim.utilization import TARGETS, SweepResult, paper_methods, sweep

# Short names of the paper's five rows, in paper_methods' order.
METHODS = ("dp", "diloco", "streaming", "overlap", "lowbit")
ALIASES = {"data-parallel": "dp", "fp4": "lowbit", "streaming-overlap": "overlap"}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "simulate", help="compute utilization vs bandwidth (data-parallel, DiLoCo, Streaming DiLoCo)",
        description="Simulate the per-layer compute/communication DAG of a training run across workers and report the "
                    "cross-datacenter bandwidth each method needs for 50/80/90/95/99% compute utilization. "
                    "Writes simulate.json and utilization.png to --out.",
    )
    model = p.add_argument_group("model (a named size, or all of --layers/--params/--step-time)")
    model.add_argument("--size", choices=sorted(PRESETS, key=len), default=None,
                       help="Streaming DiLoCo's simulator presets: 1B (24 layers, 0.1 s), 10B (48, 0.8 s), "
                            "100B (108, 4.9 s)")
    model.add_argument("--layers", type=int, default=None, help="number of repeated blocks L")
    model.add_argument("--params", type=float, default=None, help="trainable parameters N, e.g. 1.3e9")
    model.add_argument("--non-block-params", type=float, default=0.0,
                       help="parameters outside the blocks (embeddings, head); default 0")
    model.add_argument("--step-time", type=float, default=None, help="seconds of compute per inner step")
    model.add_argument("--step-time-scale", type=float, default=None,
                       help=f"multiply the step time by this (default: {PAPER_STEP_TIME_SCALE} for a named size, "
                            f"the paper calibration; 1 for --step-time)")
    algo = p.add_argument_group("methods")
    algo.add_argument("--methods", default=",".join(METHODS),
                      help=f"comma-separated subset of {','.join(METHODS)} (default: all)")
    algo.add_argument("--sync-every", type=int, default=100, help="H, inner steps per sync (default 100)")
    algo.add_argument("--fragment-layers", type=int, default=3,
                      help="blocks per Streaming fragment (default 3); plus one non-block fragment")
    algo.add_argument("--overlap", type=int, default=1, help="tau of the overlap methods (default 1)")
    algo.add_argument("--bits", type=float, default=4.0, help="bits per parameter of the lowbit method (default 4)")
    algo.add_argument("--wire-bits", type=float, default=16.0,
                      help="bits per parameter of the other methods (default 16)")
    net = p.add_argument_group("network")
    net.add_argument("--bandwidth", type=float, nargs=3, default=(0.1, 1000.0, 50), metavar=("LOW", "HIGH", "NUM"),
                     help="log grid of Gbit/s per worker (default 0.1 1000 50, the papers' grid)")
    net.add_argument("--latency", type=float, default=0.0, help="seconds per reduction message (default 0)")
    net.add_argument("--workers", type=int, default=2, help="M, number of workers (default 2)")
    p.add_argument("--out", type=Path, default=None, help="output directory (default runs/simulate-<model>)")
    p.set_defaults(func=run)


def _model(args: argparse.Namespace) -> tuple[ModelSpec, float]:
    """The model with its step time scaled, and the scale used."""
    custom = {"--layers": args.layers, "--params": args.params, "--step-time": args.step_time}
    given = [k for k, v in custom.items() if v is not None]
    if args.size is not None:
        if given:
            raise ValueError(f"give either --size or {'/'.join(custom)}, not both (got --size and {', '.join(given)})")
        model = preset(args.size)
        scale = PAPER_STEP_TIME_SCALE if args.step_time_scale is None else args.step_time_scale
        if args.non_block_params:
            model = ModelSpec(model.num_layers, model.num_params, model.step_time_s, args.non_block_params, model.name)
    else:
        if len(given) != 3:
            missing = [k for k in custom if k not in given]
            raise ValueError(f"without --size, give all of --layers, --params and --step-time (missing {', '.join(missing)})")
        model = ModelSpec(args.layers, args.params, args.step_time, args.non_block_params,
                          name=f"{args.params:.3g} params")
        scale = 1.0 if args.step_time_scale is None else args.step_time_scale
    return model.scaled(scale), scale


def _methods(args: argparse.Namespace, num_layers: int):
    names = [ALIASES.get(n.strip().lower(), n.strip().lower()) for n in args.methods.split(",") if n.strip()]
    unknown = [n for n in names if n not in METHODS]
    if unknown or not names:
        raise ValueError(f"unknown method(s) {unknown or args.methods!r}; choose from {', '.join(METHODS)}")
    specs = paper_methods(num_layers, sync_every=args.sync_every, fragment_layers=args.fragment_layers,
                          overlap_steps=args.overlap, bits=args.wire_bits, low_bits=args.bits)
    by_name = dict(zip(METHODS, specs))
    return [by_name[n] for n in dict.fromkeys(names)]


def format_needed(result: SweepResult) -> str:
    head = f"{'method':<22}" + "".join(f"{f'{q:.0%}':>10}" for q in result.targets)
    lines = [f"bandwidth (Gbit/s) needed for each compute utilization; '>' = not reached on the grid", head]
    top = result.bandwidth_bps[-1] / GBIT
    for label, needed in result.needed_bps.items():
        cells = "".join(f"{'>' + format(top, '.4g'):>10}" if np.isnan(x) else f"{x / GBIT:>10.2f}" for x in needed)
        lines.append(f"{label:<22}{cells}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from diloco.sim.plot import plot_sweep

    model, scale = _model(args)
    methods = _methods(args, model.num_layers)
    low, high, num = args.bandwidth
    if num != int(num):
        raise ValueError(f"--bandwidth NUM must be an integer, got {num}")
    grid = bandwidth_grid(low, high, int(num))
    result = sweep(model, methods, grid, latency_s=args.latency, num_workers=args.workers, targets=TARGETS)

    out = args.out or Path("runs") / f"simulate-{model.name.replace(' ', '_')}"
    out.mkdir(parents=True, exist_ok=True)
    print(f"model {model.name}: {model.num_layers} layers, {model.num_params:.4g} params "
          f"({model.non_block_params:.4g} outside blocks), step {model.step_time_s:.4g} s "
          f"(= stated x {scale:g}); "
          f"H={args.sync_every}, {args.fragment_layers}-layer fragments, tau={args.overlap}, "
          f"{args.wire_bits:g}/{args.bits:g} bits, M={args.workers}, latency {args.latency:g} s")
    print(format_needed(result))
    config = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k != "func"}
    payload = {"config": config, "methods": [m.label for m in methods], **result.to_dict()}
    (out / "simulate.json").write_text(json.dumps(payload, indent=2))
    png = plot_sweep(result, out / "utilization.png")
    print(f"wrote {out / 'simulate.json'} and {png}")
    return 0
