"""torchrun's entry for the data-parallel rows of ``benchmarks/chaos.py``: ``diloco``'s CLI, each inner step padded.

    torchrun --standalone --nproc-per-node M --max-restarts K benchmarks/_padded_train.py \\
        --log-dir DIR --step-time 0.1 [--slow-rank R --slowdown 3] -- train --preset tiny --method dp --elastic ...

Before the CLI runs, the trainer's inner step (:func:`diloco.train.inner_step.train_step`, as the trainer calls
it) is wrapped: the step is padded with a sleep to ``--step-time`` seconds (an accelerator's step, as the Ray
learners of chaos.py pad theirs) and one JSON row per step is appended to ``DIR/worker-<rank>.jsonl``:
``learner`` (the rank), ``incarnation`` (TorchElastic's restart count), ``step``, ``t`` (wall time at its end),
``dt`` (its seconds), ``compute_s`` (its forward, backward and optimizer time, padded: max of it and the step
time; the gradient all-reduce is not in it) and ``pid``. ``--slow-rank R --slowdown F``: rank R pads its steps to
F x the step time (a straggler). Event rows: ``spawned`` (the process started, before
its imports) and ``joined`` (its first step starts: built, restored, in the process group).

``DIR/worker-<rank>.pid`` holds the live process's pid (for the driver's SIGKILL). ``DIR/hold-<rank>``, if the
driver wrote it, holds a wall time before which this rank's process does not start (a killed machine held
down): it waits before importing anything. No product setting: all of it lives here.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path


def _options(argv: list[str]) -> tuple[Path, float, list[str]]:
    if "--" not in argv:
        raise SystemExit(
            "usage: _padded_train.py --log-dir DIR --step-time S [--slow-rank R --slowdown F] -- <diloco CLI arguments>"
        )
    cut = argv.index("--")
    mine, cli = argv[:cut], argv[cut + 1 :]
    opts = dict(zip(mine[::2], mine[1::2], strict=True))
    step_time = float(opts.get("--step-time", "0"))
    if int(os.environ["RANK"]) == int(opts.get("--slow-rank", "-1")):  # a straggler: its steps take this much longer
        step_time *= float(opts.get("--slowdown", "1"))
    return Path(opts["--log-dir"]), step_time, cli


def main() -> int:
    log_dir, step_time, cli = _options(sys.argv[1:])
    rank, incarnation = int(os.environ["RANK"]), int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    tmp = log_dir / f".worker-{rank}.pid.{os.getpid()}"
    tmp.write_text(str(os.getpid()))
    tmp.replace(log_dir / f"worker-{rank}.pid")
    log = open(log_dir / f"worker-{rank}.jsonl", "a", buffering=1)
    if log.tell() > 0:  # a predecessor killed mid-line leaves no newline: start on a line of our own
        log.write("\n")

    def write(row: dict) -> None:
        log.write(json.dumps({"learner": rank, "incarnation": incarnation, **row, "pid": os.getpid()}) + "\n")

    write({"event": "spawned", "t": time.time()})
    hold = log_dir / f"hold-{rank}"
    if hold.exists():
        time.sleep(max(0.0, float(hold.read_text()) - time.time()))

    import diloco.train.trainer as trainer
    from diloco.cli import main as cli_main

    inner = trainer.train_step
    joined = False

    def padded_step(rep, step, *, cfg, device):
        nonlocal joined
        t0 = time.perf_counter()
        if not joined:
            write({"event": "joined", "t": time.time()})
            joined = True
        out = inner(rep, step, cfg=cfg, device=device)
        time.sleep(max(0.0, t0 + step_time - time.perf_counter()))
        write(
            {
                "step": step,
                "t": time.time(),
                "dt": time.perf_counter() - t0,
                "compute_s": max(out.compute_time, step_time),
                "loss": out.loss,
            }
        )
        return out

    trainer.train_step = padded_step
    return cli_main(cli)


if __name__ == "__main__":
    sys.exit(main())
