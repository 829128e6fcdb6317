"""`diloco chaos`: Decoupled DiLoCo's learners as processes on Ray, under a fault schedule of your choosing."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from diloco.cli._common import add_config_args, cache_dir, load_preset, overrides, resolve
from diloco.errors import ConfigError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "chaos",
        help="run Decoupled DiLoCo's learners as Ray processes and inject faults (kills, stragglers)",
        description="Train method=decoupled with each learner a process of its own (a Ray actor that Ray restarts "
        "when it dies) and the syncer a checkpointed Ray actor, on a local Ray instance (or the cluster "
        "at --set ray_address=...), while killing learners and the syncer with SIGKILL at the times "
        "given. Each learner runs the trainer's loop of `diloco train` as a site job (--set learner=m "
        "syncer=NAME@ADDRESS), so every trainer setting holds (inner_optimizer, bf16, compile, z_loss, "
        "grad_clip, the lr schedule, evaluation); a restarted learner waits --downtime, then resumes its "
        "newest checkpoint if it has one, else starts again, taking the syncer's current parameters. "
        "Writes into --out (new or empty): learner-<m>/ (each learner's run folder: config, metrics, "
        "summary, learner-<m>.jsonl with a row per step and a joined row per process), merges.jsonl, "
        "syncer/ (checkpoints, events.jsonl), chaos.json (the faults as carried out) and summary.json "
        "(eval loss of the syncer's parameters, goodput, per fault what it cost). Learners use one torch "
        "thread each unless --set threads=N.",
    )
    add_config_args(p, default_preset="tiny")
    p.add_argument("--out", type=Path, required=True, help="output folder (new or empty)")
    p.add_argument(
        "--kill",
        default="",
        metavar="S:M[,S:M...]",
        help="SIGKILL learner M at S seconds after the start, e.g. 5:1,12:0",
    )
    p.add_argument(
        "--kill-rate",
        type=float,
        default=0.0,
        help="also kill learners at random: kills per learner per minute (a Poisson process from --seed)",
    )
    p.add_argument(
        "--downtime",
        type=float,
        default=0.0,
        help="seconds a killed learner stays down before Ray's "
        "restart joins again (default 0: as soon as Ray restarts it)",
    )
    p.add_argument(
        "--slowdown",
        default="",
        metavar="F,F,...",
        help="per learner, its step time multiplied by F (stragglers), e.g. 1,1,3 (the config's slowdown: "
        "`diloco train --set slowdown=1,1,3` gives a threads run the same stragglers)",
    )
    p.add_argument(
        "--syncer-kill",
        default="",
        metavar="S[,S...]",
        help="SIGKILL the syncer at these seconds after the start (it restarts from its checkpoint; with syncer_shards "
        "S, the i-th kill is shard i mod S's)",
    )
    p.add_argument(
        "--corrupt",
        default="",
        metavar="S:M[:SCALE[:DURATION]],...",
        help="learner M sends a finite, wrong outer gradient from S seconds after the start for DURATION "
        "seconds (default 5): SCALE x its own, or N(0, 1) values without SCALE, e.g. 12:1:1e4. "
        "The syncer's contribution guard (--set guard=drop|clip|off) decides what counts; its events "
        "are in merges.jsonl (guard) and summary.json (guard_events)",
    )
    p.add_argument(
        "--step-time",
        type=float,
        default=0.0,
        help="pad each step to this many seconds (an accelerator's step on a CPU machine; default 0: off; "
        "the config's step_time)",
    )
    p.add_argument(
        "--max-seconds",
        type=float,
        default=3600.0,
        help="learners stop this many seconds after the start even before `steps`: each flushes and leaves the "
        "syncer (default 3600)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from diloco.decoupled.chaos import Chaos, parse_corrupt, parse_floats, parse_kills
    from diloco.decoupled.trainer import chaos_run

    cfg = resolve(load_preset(args.preset), None, {**overrides(args), "method": "decoupled"})
    chaos = Chaos(
        kills=parse_kills(args.kill),
        kill_rate=args.kill_rate,
        downtime_s=args.downtime,
        slowdown=parse_floats(args.slowdown, "--slowdown"),
        syncer_kills=parse_floats(args.syncer_kill, "--syncer-kill"),
        corrupt=parse_corrupt(args.corrupt),
        seed=cfg.seed,
    )
    for name, value in (("--step-time", args.step_time), ("--max-seconds", args.max_seconds)):
        if value < 0:
            raise ConfigError(f"{name}={value}: give seconds >= 0")
    summary = chaos_run(
        cfg, args.out, chaos=chaos, cache_dir=cache_dir(args), step_time_s=args.step_time, max_seconds=args.max_seconds
    )
    print(json.dumps(summary, indent=2))
    return 0
