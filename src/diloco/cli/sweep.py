"""`diloco sweep`: run a grid of training jobs, resumably, into one JSONL results file.

    diloco sweep --grid grid.json --out results.jsonl                          # one run at a time, each its own process
    diloco sweep --grid grid.json --out results.jsonl --workers 4              # four at a time
    diloco sweep --grid a.json --grid b.json --out results.jsonl --workers 2   # several grids as one sweep
    diloco sweep --grid grid.json --out results.jsonl --executor slurm \\
                 --submitit-dir runs/slurm --slurm partition=gpu --slurm timeout_min=120 --slurm gpus_per_node=1
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from diloco.errors import ConfigError

EXECUTOR_CHOICES = ("inline", "local", "submitit-local", "slurm")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "sweep",
        help="run a resumable grid of runs (sizes x methods x hyperparameters) into a JSONL file",
        description="Expand the grid of a JSON file (see docs/guides/scaling-sweeps.md) and run every point that has no "
        "finished record in --out yet, appending one JSON line per run as it finishes. Interrupt it "
        "at any time and run the same command again to continue; no run is recorded twice.",
    )
    p.add_argument(
        "--grid",
        type=Path,
        required=True,
        action="append",
        help="grid JSON file (data only, never executed); repeat it to sweep several grids as one "
        "(a point two grids share runs once)",
    )
    p.add_argument("--out", type=Path, required=True, help="results JSONL file (appended to)")
    p.add_argument(
        "--runner",
        default=None,
        help="run function by name: 'train' (the trainer) or 'synthetic' (a known noisy law, "
        "for demos and tests); default: the grid's 'runner' field, else 'train'",
    )
    ex = p.add_argument_group("where runs execute")
    ex.add_argument(
        "--executor",
        choices=EXECUTOR_CHOICES,
        default=None,
        help="local: each run in a fresh process of its own, --workers at a time (the default for "
        "the trainer); inline: in this process, one after another (the default for the synthetic "
        "runner); slurm: each run a SLURM job through submitit; submitit-local: submitit's local "
        "executor (each run its own process; for trying the SLURM path without a cluster)",
    )
    ex.add_argument("--workers", type=int, default=1, help="with --executor local: runs at a time (default 1)")
    ex.add_argument(
        "--submitit-dir",
        type=Path,
        default=None,
        help="with slurm / submitit-local: folder for job scripts and logs (default: OUT's folder / submitit)",
    )
    ex.add_argument(
        "--slurm",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a submitit parameter for every job, e.g. partition=gpu, timeout_min=120, "
        "gpus_per_node=1, cpus_per_task=8 (repeatable; values parsed as JSON when they can be)",
    )
    p.add_argument(
        "--synthetic-delay",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="with the synthetic runner: sleep this long per run (to watch or interrupt a sweep)",
    )
    p.add_argument("--retry-failed", action="store_true", help="run again the points whose last record failed")
    p.add_argument("--dry-run", action="store_true", help="list the grid's runs and exit")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def delayed(config: dict, *, fn: Any, delay: float) -> dict:
    """A runner slowed down by ``delay`` seconds (module-level, so process executors can send it)."""
    time.sleep(delay)
    return fn(config)


@contextlib.contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """SIGTERM (``kill PID``, a scheduler's stop) interrupts the sweep as Ctrl-C does: the executor stops the runs
    in progress instead of leaving them training on, orphaned, into run folders no record will name."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _parameters(items: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--slurm {item!r}: give KEY=VALUE, e.g. --slurm partition=gpu")
        try:
            out[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            out[key.strip()] = value
    return out


def run(args: argparse.Namespace) -> int:
    import dataclasses

    from diloco.scaling.eval_sets import mixed_eval_sets
    from diloco.scaling.executors import make_executor
    from diloco.scaling.sweep import GridSpec, expand_grids, get_runner, read_results, run_sweep

    grids = [GridSpec.from_json(path) for path in args.grid]
    if args.runner is not None:
        grids = [dataclasses.replace(g, runner=args.runner) for g in grids]
    configs = expand_grids(grids)  # checks that the grids agree on the runner
    runner = grids[0].runner
    for line in mixed_eval_sets(configs):
        print(f"diloco sweep: warning: {line}", file=sys.stderr)
    if args.synthetic_delay < 0 or (args.synthetic_delay > 0 and runner != "synthetic"):
        raise ConfigError(
            f"--synthetic-delay={args.synthetic_delay}: only a non-negative delay, with the "
            f"synthetic runner (this sweep uses {runner!r})"
        )
    executor_name = args.executor or ("inline" if runner == "synthetic" else "local")
    if args.workers != 1 and executor_name != "local":
        raise ConfigError(f"--workers={args.workers} goes with --executor local (this sweep uses {executor_name})")
    if args.slurm and executor_name not in ("slurm", "submitit-local"):
        raise ConfigError(f"--slurm goes with --executor slurm or submitit-local (this sweep uses {executor_name})")
    run_fn = get_runner(runner)
    parameters = _parameters(args.slurm)
    folder = args.submitit_dir or args.out.parent / "submitit"
    executor = make_executor(executor_name, workers=args.workers, folder=folder, parameters=parameters)
    if args.dry_run:
        done = {r.get("run_id") for r in read_results(args.out) if r.get("status") == "ok"}
        for c in configs:
            mark = "done" if c["run_id"] in done else "todo"
            print(
                f"{c['run_id']}  {mark}  {c['size']:>6}  {c['method']:<9} M={c['replicas']}  "
                f"lr={c['inner_lr']:.4g}  B={c['global_batch']}  outer_lr={c['outer_lr']}  H={c['sync_every']}  "
                f"tokens={c['tokens']}"
            )
        print(
            f"{len(configs)} runs, {sum(c['run_id'] in done for c in configs)} already done; executor {executor.name}"
        )
        return 0
    if args.synthetic_delay > 0:
        run_fn = functools.partial(delayed, fn=run_fn, delay=args.synthetic_delay)
    with sigterm_interrupts():
        summary = run_sweep(
            grids,
            results_path=args.out,
            run_fn=run_fn,
            progress=not args.no_progress,
            retry_failed=args.retry_failed,
            executor=executor,
        )
    print(json.dumps(dataclasses.asdict(summary)))
    return 0
