"""`diloco plan`: which method and settings to run over a given link, and what it will cost.

    diloco plan --size 10B --workers 2 --tokens-per-step 4e6 --bandwidth 10 1 0.1
    diloco plan --params 1.3e9 --layers 24 --chips 64 --peak-flops 989e12 --mfu 0.4 \\
                --tokens-per-step 4e6 --tokens 26e9 --workers 4 --bandwidth 1 --loss-law my.fit.json

For each bandwidth: every candidate (DP; DiLoCo over H and codec; Streaming DiLoCo over H,
fragments, tau and codec, the codecs including stat4 / stat2 / topk with error feedback; eager
updates, tau = H) with predicted utilization, wall-clock, bytes, peak bandwidth and eval
loss, and the recommendation (the fastest within ``--tolerance`` of DP's loss). With --mtbf-hours or
--chip-mtbi-years, also goodput under chip failures per method (diloco.sim.goodput). The settings
whose loss cost is this project's laptop-scale measurement are marked "m" and listed with their
measured gaps and the file they come from. Writes plan.json,
plan.md and plan.png (loss vs wall-clock) to --out. Imports no torch (unless --model-config).
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from diloco.cli.plan_report import (
    format_goodput,
    format_measured,
    format_plan,
    format_sources,
    format_syncer,
    markdown,
    plot_plan,
)
from diloco.cli.simulate import (
    add_link_args,
    add_model_args,
    add_run_args,
    bandwidths_bps,
    resolve_exchange,
    resolve_model,
)
from diloco.errors import ConfigError
from diloco.outer_steps import MIN_OUTER_STEPS, recommended_sync_every
from diloco.sim.goodput import HOURS_PER_YEAR, METHOD_LABELS, FailureModel, goodput_by_method
from diloco.sim.hardware import ModelSpec
from diloco.sim.loss import MEASURED_CODECS, MEASURED_MARK
from diloco.sim.planner import (
    DEFAULT_CODECS,
    DEFAULT_OVERLAP,
    DEFAULT_SYNC_EVERY,
    DEFAULT_TOLERANCE,
    Setup,
    candidates,
    evaluate,
)
from diloco.sim.syncer_cost import SYNCER_COSTS, SyncerPlan, plan_syncer


def _ints(text: str, what: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise ConfigError(f"--{what} {text!r}: give comma-separated whole numbers, e.g. 30,100") from None
    if not values:
        raise ConfigError(f"--{what} is empty")
    return values


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "plan",
        help="recommend a method and settings for a model, hardware, workers, link and token budget",
        description="Predict utilization, wall-clock, bytes, peak bandwidth and eval loss of data-parallel, DiLoCo "
        "and Streaming DiLoCo settings at each link bandwidth, and recommend the fastest whose predicted "
        "loss is within --tolerance of data-parallel. Every number says where it comes from.",
    )
    add_model_args(p)
    p.add_argument(
        "--model-config",
        type=Path,
        default=None,
        help="a JSON model config (diloco.models.ModelConfig fields): parameters and layers counted "
        "from it (imports torch)",
    )
    add_run_args(p)
    add_link_args(p, default_bandwidths=False)
    c = p.add_argument_group("candidates and the loss model")
    c.add_argument(
        "--sync-every",
        default=DEFAULT_SYNC_EVERY_ARG,
        help=f"H values to consider, comma-separated (default {DEFAULT_SYNC_EVERY_ARG}, and the largest H "
        f"that gives {MIN_OUTER_STEPS} outer steps over the run where it is smaller: studies/outer-steps)",
    )
    c.add_argument(
        "--overlap", default=",".join(map(str, DEFAULT_OVERLAP)), help="tau values for Streaming DiLoCo (default 0,1,5)"
    )
    c.add_argument("--fragment-layers", default="3", help="blocks per Streaming fragment (default 3)")
    c.add_argument(
        "--codecs",
        default=",".join(DEFAULT_CODECS),
        help=f"codecs (default {','.join(DEFAULT_CODECS)}; {', '.join(MEASURED_CODECS)} are sent with "
        f"error feedback, Streaming DiLoCo only, their loss cost {MEASURED_MARK})",
    )
    c.add_argument(
        "--no-eager",
        action="store_true",
        help=f"leave out eager updates (tau = H: an exchange may take a whole outer step; loss cost {MEASURED_MARK})",
    )
    c.add_argument(
        "--tolerance",
        type=float,
        default=DEFAULT_TOLERANCE * 100,
        help="loss tolerance relative to data-parallel, in %% (default 0.5)",
    )
    c.add_argument(
        "--loss-law",
        type=Path,
        default=None,
        help="a `diloco fit` JSON to predict loss from (default: the Scaling Laws paper's Table 4, "
        "fitted by diloco fit and shipped with the package)",
    )
    c.add_argument(
        "--ablations",
        choices=("paper", "project"),
        default="paper",
        help="costs of H, fragments, tau and bits: the papers' ablations (default) or this project's "
        "measured laptop-scale runs",
    )
    d = p.add_argument_group("Decoupled DiLoCo's syncer (diloco.sim.syncer_cost)")
    d.add_argument(
        "--method",
        choices=("decoupled",),
        default=None,
        help="decoupled: also charge the syncer (M = --workers learners, fragments of --fragment-layers blocks, "
        "tau = the largest --overlap, H = the smallest --sync-every): its merge time per fragment and per H steps, "
        "memory and the shards it needs",
    )
    d.add_argument(
        "--syncer-codec",
        choices=tuple(SYNCER_COSTS),
        default="fp4_e3m0",
        help="the syncer's reply codec (default fp4_e3m0; the figures measured for each by benchmarks/syncer_merge.py)",
    )
    g = p.add_argument_group(
        "goodput under chip failures (diloco.sim.goodput; the defaults fit Decoupled DiLoCo's Table 1)"
    )
    g.add_argument(
        "--mtbf-hours",
        type=float,
        default=None,
        help="the cluster's mean time between failures, in hours: adds goodput per method (DP, elastic "
        "DP, synchronous and decoupled M = --workers); chips from --chips, else 1 year per chip / H",
    )
    g.add_argument(
        "--chip-mtbi-years",
        type=float,
        default=None,
        help="mean time between interruptions of one chip, in years (the paper: 1), with --chips: "
        "adds goodput per method",
    )
    p.add_argument("--top", type=int, default=12, help="candidates printed per bandwidth (default 12; all in files)")
    p.add_argument("--out", type=Path, default=None, help="output directory (default runs/plan-<model>)")
    p.add_argument("--no-plot", action="store_true", help="do not write plan.png")
    p.set_defaults(func=run)


def _model(args: argparse.Namespace) -> tuple[ModelSpec, str]:
    if args.model_config is None:
        return resolve_model(args)
    if args.size is not None or args.params is not None or args.layers is not None:
        raise ConfigError("give --model-config or --size or --params/--layers, not several")
    from diloco.files import read_json
    from diloco.models.transformer import ModelConfig, count_params, flops_per_token

    data = read_json(args.model_config)
    if not isinstance(data, dict):
        raise ConfigError(f"{args.model_config}: expected a JSON object of ModelConfig fields")
    try:
        config = ModelConfig(**data)
    except TypeError as exc:
        raise ConfigError(f"{args.model_config}: {exc}") from None
    total = count_params(config)
    blocks = count_params(config, embeddings=False) - config.d_model  # the non-embedding count holds the final norm
    args.params, args.layers, args.non_block_params = float(total), config.n_layers, float(total - blocks)
    model, source = resolve_model(args)
    per_token = flops_per_token(config)
    return ModelSpec(
        model.num_layers, model.num_params, model.step_time_s, model.non_block_params, name=args.model_config.stem
    ), source + f" (model: {args.model_config}, {per_token:.3g} FLOPs/token)"


#: --sync-every's default: the planner's H values (with it, the rule's largest H is tried as well).
DEFAULT_SYNC_EVERY_ARG = ",".join(map(str, DEFAULT_SYNC_EVERY))


def syncer_setting(
    args: argparse.Namespace, model: ModelSpec, step_source: str, *, sync_every: tuple[int, ...]
) -> SyncerPlan:
    """The syncer of a decoupled run with this plan's model and settings (diloco.sim.syncer_cost): tau the largest
    --overlap, H the smallest of the plan's H values (the most merges per step)."""
    return plan_syncer(
        num_params=model.num_params,
        non_block_params=model.non_block_params,
        num_layers=model.num_layers,
        fragment_layers=_ints(args.fragment_layers, "fragment-layers")[0],
        learners=args.workers,
        tau=max(_ints(args.overlap, "overlap")),
        sync_every=min(sync_every),
        step_time_s=model.step_time_s,
        step_time_source=step_source,
        codec=args.syncer_codec,
    )


def failure_setting(args: argparse.Namespace) -> tuple[float, FailureModel] | None:
    """Chips and failure model from --mtbf-hours / --chip-mtbi-years, or None if neither is given."""
    if args.mtbf_hours is None and args.chip_mtbi_years is None:
        return None
    if args.mtbf_hours is not None and args.chip_mtbi_years is not None:
        raise ConfigError("give --mtbf-hours (the cluster's) or --chip-mtbi-years (one chip's, with --chips), not both")
    value = args.mtbf_hours if args.mtbf_hours is not None else args.chip_mtbi_years
    name = "--mtbf-hours" if args.mtbf_hours is not None else "--chip-mtbi-years"
    if not (math.isfinite(value) and value > 0):
        raise ConfigError(f"{name}={value}: give a positive number, e.g. {name} {0.06 if 'mtbf' in name else 1}")
    if args.chip_mtbi_years is not None:
        if args.chips is None:
            raise ConfigError(
                "--chip-mtbi-years needs --chips N (all chips of the run); or give the cluster's --mtbf-hours instead"
            )
        return float(args.chips), FailureModel(chip_mtbi_hours=args.chip_mtbi_years * HOURS_PER_YEAR)
    if args.chips is not None:
        return float(args.chips), FailureModel(chip_mtbi_hours=args.mtbf_hours * args.chips)
    return HOURS_PER_YEAR / args.mtbf_hours, FailureModel()


def goodput_report(chips: float, learners: int, model: FailureModel) -> dict:
    """Goodput per method for plan.json, with the assumptions it rests on."""
    values = goodput_by_method(chips=chips, learners=learners, model=model)
    return {
        "chips": chips,
        "learners": learners,
        "cluster_mtbf_hours": model.chip_mtbi_hours / chips,
        "goodput": values,
        "labels": METHOD_LABELS,
        "model": model.to_dict(),
        "source": "diloco.sim.goodput: Poisson chip failures, renewal-reward closed forms; constants fitted to "
        "Decoupled DiLoCo's Table 1 (docs/explanations/goodput.md)",
    }


def run(args: argparse.Namespace) -> int:
    from diloco.files import atomic_write_bytes, write_json
    from diloco.sim.loss import LossModel

    model, step_source = _model(args)
    exchange = resolve_exchange(args)
    bws = bandwidths_bps(args.bandwidth)
    if bws is None:
        raise ConfigError("give the link: --bandwidth GBPS [GBPS ...] (e.g. --bandwidth 10 1 0.1)")
    if args.tokens_per_step is None:
        raise ConfigError("give --tokens-per-step (the global batch in tokens): wall-clock counts steps")
    if not args.tokens_per_step > 0:
        raise ConfigError(f"--tokens-per-step={args.tokens_per_step}: must be > 0")
    if args.steps is not None:
        raise ConfigError("diloco plan takes --tokens (the token budget), not --steps")
    tokens = args.tokens if args.tokens is not None else 20.0 * model.num_params
    if not (tokens > 0 and math.isfinite(tokens)):
        raise ConfigError(f"--tokens={args.tokens}: give a positive token budget")
    if not (math.isfinite(args.tolerance) and args.tolerance >= 0):
        raise ConfigError(f"--tolerance={args.tolerance}: give a percentage >= 0, e.g. 0.5")
    if args.top < 1:
        raise ConfigError(f"--top={args.top}: must be >= 1")
    failures = failure_setting(args)
    sync_every = _ints(args.sync_every, "sync-every")
    if args.sync_every == DEFAULT_SYNC_EVERY_ARG:  # the defaults, and the largest H the outer-steps rule allows
        h = recommended_sync_every(total_steps=int(tokens // args.tokens_per_step))
        sync_every = tuple(sorted({*sync_every, h})) if h < max(sync_every) else sync_every
    cands = candidates(
        model.num_layers,
        sync_every=sync_every,
        overlap=_ints(args.overlap, "overlap"),
        fragment_layers=_ints(args.fragment_layers, "fragment-layers"),
        codecs=tuple(c.strip() for c in args.codecs.split(",") if c.strip()),
        num_workers=args.workers,
        eager=not args.no_eager,
    )
    loss_model = (
        LossModel.paper(ablations=args.ablations)
        if args.loss_law is None
        else LossModel.from_fit_file(args.loss_law, ablations=args.ablations)
    )
    setup = Setup(
        model,
        step_source,
        args.workers,
        tokens,
        args.tokens_per_step,
        args.latency,
        exchange,
        args.release == "per-layer",
    )
    plan = evaluate(setup, cands, bws, loss_model, tolerance=args.tolerance / 100)
    syncer = syncer_setting(args, model, step_source, sync_every=sync_every) if args.method == "decoupled" else None
    if syncer is not None:
        plan.sources.update({k: v for k, v in syncer.sources.items() if k.startswith("syncer_")})

    print(
        f"model {model.name}: {model.num_params:.4g} params, {model.num_layers} layers; step {model.step_time_s:.4g} s "
        f"({step_source}); M = {args.workers}; {tokens:.4g} tokens"
        + (" (20 per parameter, the default)" if args.tokens is None else "")
        + f", {args.tokens_per_step:.4g} per step; {len(cands)} candidates; tolerance {args.tolerance:g} % of DP"
    )
    print(format_plan(plan, args.top))
    if "measured" in plan.sources:
        print()
        print(format_measured(plan.measured))
    if syncer is not None:
        print()
        print(format_syncer(syncer, bws))
    print()
    print(format_sources(plan))
    data, md = plan.to_dict(), markdown(plan)
    if syncer is not None:
        data["syncer"] = syncer.to_dict()
        md += "\n## Decoupled DiLoCo's syncer\n\n```\n" + format_syncer(syncer, bws) + "\n```\n"
    if failures is not None:
        report = goodput_report(failures[0], args.workers, failures[1])
        print()
        print(format_goodput(report))
        data["goodput"] = report
        md += "\n## Goodput under failures\n\n```\n" + format_goodput(report) + "\n```\n"

    out = args.out or Path("runs") / f"plan-{model.name.replace(' ', '_')}"
    write_json(out / "plan.json", data)
    atomic_write_bytes(out / "plan.md", md.encode("utf-8"))
    written = [out / "plan.json", out / "plan.md"]
    if not args.no_plot:
        written.append(plot_plan(plan, out / "plan.png"))
    print("wrote " + ", ".join(str(w) for w in written))
    return 0
