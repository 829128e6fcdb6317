"""`diloco sweep`: run a grid of training jobs, resumably, into one JSONL results file."""

from __future__ import annotations

import argparse
import time
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "sweep", help="run a resumable grid of runs (sizes x methods x hyperparameters) into a JSONL file",
        description="Expand the grid of a JSON file (see docs/scaling.md) and run every point that has no "
                    "finished record in --out yet, appending one JSON line per run. Interrupt it at any "
                    "time and run the same command again to continue.",
    )
    p.add_argument("--grid", type=Path, required=True, help="grid JSON file (data only, never executed)")
    p.add_argument("--out", type=Path, required=True, help="results JSONL file (appended to)")
    p.add_argument("--runner", default=None,
                   help="run function by name: 'train' (the trainer) or 'synthetic' (a known noisy law, "
                        "for demos and tests); default: the grid's 'runner' field, else 'train'")
    p.add_argument("--synthetic-delay", type=float, default=0.0, metavar="SECONDS",
                   help="with the synthetic runner: sleep this long per run (to watch or interrupt a sweep)")
    p.add_argument("--retry-failed", action="store_true", help="run again the points whose last record failed")
    p.add_argument("--dry-run", action="store_true", help="list the grid's runs and exit")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import dataclasses
    import json

    from diloco.scaling.sweep import GridSpec, expand, get_runner, read_results, run_sweep

    grid = GridSpec.from_json(args.grid)
    if args.runner is not None:
        grid = dataclasses.replace(grid, runner=args.runner)
    if args.synthetic_delay < 0 or (args.synthetic_delay > 0 and grid.runner != "synthetic"):
        raise ValueError(f"--synthetic-delay={args.synthetic_delay}: only a non-negative delay, with the "
                         f"synthetic runner (this sweep uses {grid.runner!r})")
    if args.dry_run:
        done = {r.get("run_id") for r in read_results(args.out) if r.get("status") == "ok"}
        configs = expand(grid)
        for c in configs:
            mark = "done" if c["run_id"] in done else "todo"
            print(f"{c['run_id']}  {mark}  {c['size']:>6}  {c['method']:<9} M={c['replicas']}  "
                  f"lr={c['inner_lr']:.4g}  B={c['global_batch']}  outer_lr={c['outer_lr']}  H={c['sync_every']}  "
                  f"tokens={c['tokens']}")
        print(f"{len(configs)} runs, {sum(c['run_id'] in done for c in configs)} already done")
        return 0
    run_fn = get_runner(grid.runner)
    if args.synthetic_delay > 0:
        inner, delay = run_fn, args.synthetic_delay

        def run_fn(config: dict) -> dict:  # noqa: F811 - the same runner, slowed down
            time.sleep(delay)
            return inner(config)

    summary = run_sweep(grid, results_path=args.out, run_fn=run_fn, progress=not args.no_progress,
                        retry_failed=args.retry_failed)
    print(json.dumps(dataclasses.asdict(summary)))
    return 0
