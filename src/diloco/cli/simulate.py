"""`diloco simulate`: compute utilization and wall-clock vs cross-datacenter bandwidth, per method.

    diloco simulate --size 10B --bandwidth 10 1 0.1          # three links; stated step time 0.8 s
    diloco simulate --size 100B --step-time-scale 1.2        # Table 4's fitted calibration, said aloud
    diloco simulate --params 1.3e9 --layers 24 --chips 64 --peak-flops 989e12 --mfu 0.4 \\
                    --tokens-per-step 4e6 --tokens 26e9 --bandwidth 1 --workers 4 --exchange default

Prints utilization (and wall-clock) at each bandwidth; over a grid (``--grid``,
the default is the papers' 0.1-1000 Gbit/s), also the bandwidth each method
needs for 50/80/90/95/99 %. Writes ``simulate.json`` (and ``utilization.png``
over a grid) to ``--out``. Imports no torch.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np

from diloco.errors import ConfigError
from diloco.sim.hardware import GBIT, PAPER_EXCHANGE, PRESETS, ModelSpec, bandwidth_grid, step_time_from_hardware
from diloco.sim.utilization import TARGETS, SweepResult, paper_methods, sweep
from diloco.traffic import EXCHANGES, default_exchange

# Short names of the paper's five rows, in paper_methods' order.
METHODS = ("dp", "diloco", "streaming", "overlap", "lowbit")
ALIASES = {"data-parallel": "dp", "fp4": "lowbit", "streaming-overlap": "overlap"}


# -- arguments shared with `diloco plan` ----------------------------------------------------------
def add_model_args(p: argparse.ArgumentParser) -> None:
    model = p.add_argument_group("model (a named size, or --params and --layers)")
    model.add_argument(
        "--size",
        choices=sorted(PRESETS, key=len),
        default=None,
        help="Streaming DiLoCo's simulator models: 1B (24 layers, stated step 0.1 s), "
        "10B (48, 0.8 s), 100B (108, 4.9 s)",
    )
    model.add_argument("--params", type=float, default=None, help="trainable parameters N, e.g. 1.3e9")
    model.add_argument("--layers", type=int, default=None, help="number of repeated blocks L")
    model.add_argument(
        "--non-block-params",
        type=float,
        default=0.0,
        help="parameters outside the blocks (embeddings, head); default 0",
    )
    hw = p.add_argument_group(
        "step time: measured (--step-time), or from hardware (all of --chips, "
        "--peak-flops, --mfu, --tokens-per-step), or a named size's stated one"
    )
    hw.add_argument("--step-time", type=float, default=None, help="seconds of compute per inner step")
    hw.add_argument("--chips", type=float, default=None, help="R, accelerators over all workers")
    hw.add_argument("--peak-flops", type=float, default=None, help="Q, peak FLOP/s of one chip, e.g. 989e12")
    hw.add_argument("--mfu", type=float, default=None, help="model FLOP utilization, e.g. 0.4")
    hw.add_argument(
        "--step-time-scale",
        type=float,
        default=1.0,
        help="multiply the step time by this (default 1; Streaming DiLoCo Table 4's fitted "
        "calibration is 1.2, see docs/explanations/simulator.md). Always printed",
    )


def add_run_args(p: argparse.ArgumentParser) -> None:
    run = p.add_argument_group("run length (for wall-clock)")
    run.add_argument("--tokens-per-step", type=float, default=None, help="B, global batch in tokens")
    run.add_argument("--tokens", type=float, default=None, help="D, the token budget (needs --tokens-per-step)")
    run.add_argument("--steps", type=float, default=None, help="inner steps (instead of --tokens)")


def add_link_args(p: argparse.ArgumentParser, *, default_bandwidths: bool) -> None:
    net = p.add_argument_group("link and workers")
    net.add_argument(
        "--bandwidth",
        type=float,
        nargs="+",
        default=None,
        metavar="GBPS",
        help="one or more cross-datacenter bandwidths per worker, Gbit/s (e.g. 10 1 0.1)"
        + ("; default: the papers' grid" if default_bandwidths else ""),
    )
    net.add_argument(
        "--latency",
        type=float,
        default=0.0,
        help="seconds per hop (default 0); an exchange among M workers pays 2(M-1) hops "
        "(reduce_scatter) or M-1 (all_gather), pipelined",
    )
    net.add_argument("--workers", type=int, default=2, help="M, number of workers (default 2)")
    net.add_argument(
        "--exchange",
        choices=(*EXCHANGES, "default"),
        default=PAPER_EXCHANGE,
        help="how payloads are reduced: reduce_scatter (an all-reduce at 2(M-1)/M of the payload "
        "per link: the papers' assumption; the default), all_gather ((M-1) payloads), or "
        "default (what this project's communicator runs: all_gather for M <= 2, else "
        "reduce_scatter). Same bytes at M = 2",
    )
    net.add_argument(
        "--release",
        choices=("per-layer", "after-step"),
        default="per-layer",
        help="per-layer: each layer's reduction starts when its gradient is ready (the papers' "
        "simulator, bucketed DDP; default); after-step: whole payloads after the step, as "
        "this project's DataParallel and StreamingDiLoCo exchange",
    )


def resolve_model(args: argparse.Namespace) -> tuple[ModelSpec, str]:
    """The model with its step time, and a sentence saying where the step time comes from."""
    hardware = {"--chips": args.chips, "--peak-flops": args.peak_flops, "--mfu": args.mfu}
    hw_given = [k for k, v in hardware.items() if v is not None]
    if args.size is not None:
        if args.params is not None or args.layers is not None:
            raise ConfigError("give either --size or --params/--layers, not both")
        base = PRESETS[args.size]
        num_params, num_layers, name = base.num_params, base.num_layers, base.name
    else:
        missing = [k for k, v in (("--params", args.params), ("--layers", args.layers)) if v is None]
        if missing:
            raise ConfigError(f"without --size, give --params and --layers (missing {', '.join(missing)})")
        num_params, num_layers, name = args.params, args.layers, f"{args.params:.3g} params"
    if hw_given and args.step_time is not None:
        raise ConfigError("give either --step-time or the hardware (--chips, --peak-flops, --mfu), not both")
    if hw_given:
        missing = [k for k, v in hardware.items() if v is None]
        if args.tokens_per_step is None:
            missing.append("--tokens-per-step")
        if missing:
            raise ConfigError(
                f"a step time from hardware needs --chips, --peak-flops, --mfu and --tokens-per-step "
                f"(missing {', '.join(missing)})"
            )
        step = step_time_from_hardware(
            num_params=num_params,
            tokens_per_step=args.tokens_per_step,
            num_chips=args.chips,
            peak_flops=args.peak_flops,
            mfu=args.mfu,
        )
        source = (
            f"6 N B / (R Q MFU) = 6 x {num_params:.3g} x {args.tokens_per_step:.3g} / "
            f"({args.chips:g} x {args.peak_flops:.3g} x {args.mfu:g}) = {step:.4g} s"
        )
    elif args.step_time is not None:
        step, source = args.step_time, f"measured/given {args.step_time:g} s"
    elif args.size is not None:
        step, source = PRESETS[args.size].step_time_s, f"Streaming DiLoCo's stated {PRESETS[args.size].step_time_s:g} s"
    else:
        raise ConfigError(
            "give the step time: --step-time SECONDS, or --chips, --peak-flops, --mfu and --tokens-per-step"
        )
    if not (math.isfinite(args.step_time_scale) and args.step_time_scale > 0):
        raise ConfigError(f"--step-time-scale={args.step_time_scale}: must be > 0")
    if args.step_time_scale != 1.0:
        source += f", x {args.step_time_scale:g} (--step-time-scale) = {step * args.step_time_scale:.4g} s"
    model = ModelSpec(
        num_layers, float(num_params), float(step) * args.step_time_scale, float(args.non_block_params), name=name
    )
    return model, source


def resolve_steps(args: argparse.Namespace) -> float | None:
    """Inner steps of the run, from --steps or --tokens / --tokens-per-step; None if not given."""
    if args.steps is not None and args.tokens is not None:
        raise ConfigError("give either --steps or --tokens, not both")
    if args.steps is not None:
        if not args.steps > 0:
            raise ConfigError(f"--steps={args.steps}: must be > 0")
        return float(args.steps)
    if args.tokens is not None:
        if args.tokens_per_step is None:
            raise ConfigError("--tokens needs --tokens-per-step (the global batch in tokens) to count steps")
        if not (args.tokens > 0 and args.tokens_per_step > 0):
            raise ConfigError(f"--tokens={args.tokens} and --tokens-per-step={args.tokens_per_step} must be > 0")
        return args.tokens / args.tokens_per_step
    return None


def resolve_exchange(args: argparse.Namespace) -> str:
    if args.workers < 1:
        raise ConfigError(f"--workers={args.workers}: need at least 1")
    return default_exchange(args.workers) if args.exchange == "default" else args.exchange


def bandwidths_bps(values: list[float] | None) -> np.ndarray | None:
    if values is None:
        return None
    bad = [v for v in values if not (math.isfinite(v) and v > 0)]
    if bad:
        raise ConfigError(f"--bandwidth {bad}: every bandwidth must be a positive number of Gbit/s")
    return np.array(sorted(set(values)), dtype=float) * GBIT


def format_duration(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "-"
    for unit, size in (("d", 86400.0), ("h", 3600.0), ("min", 60.0)):
        if seconds >= size:
            return f"{seconds / size:.3g} {unit}"
    return f"{seconds:.3g} s"


def format_gbps(bps: float) -> str:
    g = bps / GBIT
    return f"{g:g} Gbit/s" if g >= 1 else f"{g * 1e3:g} Mbit/s"


# -- the command ------------------------------------------------------------------------------------
def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "simulate",
        help="compute utilization and wall-clock vs bandwidth (data-parallel, DiLoCo, Streaming DiLoCo)",
        description="Simulate the per-layer compute/communication DAG of one worker and report compute utilization "
        "and wall-clock at each given bandwidth; over a grid, also the bandwidth each method needs for "
        "50/80/90/95/99%% utilization. Writes simulate.json (and utilization.png) to --out.",
    )
    add_model_args(p)
    add_run_args(p)
    algo = p.add_argument_group("methods")
    algo.add_argument(
        "--methods", default=",".join(METHODS), help=f"comma-separated subset of {','.join(METHODS)} (default: all)"
    )
    algo.add_argument("--sync-every", type=int, default=100, help="H, inner steps per sync (default 100)")
    algo.add_argument(
        "--fragment-layers",
        type=int,
        default=3,
        help="blocks per Streaming fragment (default 3); plus one non-block fragment",
    )
    algo.add_argument("--overlap", type=int, default=1, help="tau of the overlap methods (default 1)")
    algo.add_argument("--bits", type=float, default=4.0, help="bits per parameter of the lowbit method (default 4)")
    algo.add_argument(
        "--wire-bits", type=float, default=16.0, help="bits per parameter of the other methods (default 16)"
    )
    add_link_args(p, default_bandwidths=True)
    p.add_argument(
        "--grid",
        type=float,
        nargs=3,
        default=None,
        metavar=("LOW", "HIGH", "NUM"),
        help="a log grid of Gbit/s instead of --bandwidth (default 0.1 1000 50, the papers' grid)",
    )
    p.add_argument("--out", type=Path, default=None, help="output directory (default runs/simulate-<model>)")
    p.add_argument("--no-plot", action="store_true", help="do not write utilization.png")
    p.set_defaults(func=run)


def _methods(args: argparse.Namespace, num_layers: int):
    names = [ALIASES.get(n.strip().lower(), n.strip().lower()) for n in args.methods.split(",") if n.strip()]
    unknown = [n for n in names if n not in METHODS]
    if unknown or not names:
        raise ConfigError(f"unknown method(s) {unknown or args.methods!r}; choose from {', '.join(METHODS)}")
    specs = paper_methods(
        num_layers,
        sync_every=args.sync_every,
        fragment_layers=args.fragment_layers,
        overlap_steps=args.overlap,
        bits=args.wire_bits,
        low_bits=args.bits,
    )
    by_name = dict(zip(METHODS, specs))
    return [by_name[n] for n in dict.fromkeys(names)]


def format_needed(result: SweepResult) -> str:
    head = f"{'method':<22}" + "".join(f"{f'{q:.0%}':>10}" for q in result.targets)
    lines = [
        "bandwidth (Gbit/s) needed for each compute utilization (smallest grid point reaching it; "
        "'>' = not reached on the grid)",
        head,
    ]
    top = result.bandwidth_bps[-1] / GBIT
    for label, needed in result.needed_bps.items():
        cells = "".join(f"{'>' + format(top, '.4g'):>10}" if np.isnan(x) else f"{x / GBIT:>10.2f}" for x in needed)
        lines.append(f"{label:<22}{cells}")
    return "\n".join(lines)


def format_at(result: SweepResult, steps: float | None) -> str:
    """Utilization and wall-clock of each method at each bandwidth of the result."""
    T = result.model.step_time_s
    what = f"wall-clock of {steps:.4g} steps" if steps else "seconds per step"
    lines = [f"{'bandwidth':>14}  {'method':<22}{'utilization':>12}  {what}"]
    for i, bw in enumerate(result.bandwidth_bps):
        for label, cu in result.curves.items():
            wall = (steps or 1.0) * T / cu[i]
            shown = format_duration(wall) if steps else f"{wall:.4g} s"
            lines.append(f"{format_gbps(bw):>14}  {label:<22}{cu[i]:>12.1%}  {shown}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from diloco.files import write_json

    model, step_source = resolve_model(args)
    steps = resolve_steps(args)
    exchange = resolve_exchange(args)
    methods = _methods(args, model.num_layers)
    given = bandwidths_bps(args.bandwidth)
    if given is not None and args.grid is not None:
        raise ConfigError("give either --bandwidth (one or more values) or --grid LOW HIGH NUM, not both")
    if given is None:
        low, high, num = args.grid or (0.1, 1000.0, 50)
        if num != int(num):
            raise ConfigError(f"--grid NUM must be an integer, got {num}")
        bw = bandwidth_grid(low, high, int(num))
    else:
        bw = given
    result = sweep(
        model,
        methods,
        bw,
        latency_s=args.latency,
        num_workers=args.workers,
        targets=TARGETS,
        overlap_backward=args.release == "per-layer",
        exchange=exchange,
    )

    print(
        f"model {model.name}: {model.num_layers} layers, {model.num_params:.4g} params "
        f"({model.non_block_params:.4g} outside blocks); step time {model.step_time_s:.4g} s ({step_source})"
    )
    print(
        f"H={args.sync_every}, {args.fragment_layers}-layer fragments, tau={args.overlap}, "
        f"{args.wire_bits:g}/{args.bits:g} bits, M={args.workers}, exchange {exchange}, release {args.release}, "
        f"latency {args.latency:g} s per hop"
    )
    if len(bw) <= 12:
        print(format_at(result, steps))
    if len(bw) >= 2 and given is None:
        print(format_needed(result))

    out = args.out or Path("runs") / f"simulate-{model.name.replace(' ', '_')}"
    config = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k != "func"}
    payload = {
        "config": config,
        "exchange": exchange,
        "step_time_source": step_source,
        "steps": steps,
        "methods": [m.label for m in methods],
        **result.to_dict(),
    }
    if steps:
        payload["wall_clock_s"] = {
            k: [steps * model.step_time_s / float(x) for x in v] for k, v in result.curves.items()
        }
    write_json(out / "simulate.json", payload)
    written = [out / "simulate.json"]
    if len(bw) >= 2 and not args.no_plot:
        from diloco.sim.plot import plot_sweep

        written.append(plot_sweep(result, out / "utilization.png"))
    print("wrote " + " and ".join(str(w) for w in written))
    return 0
