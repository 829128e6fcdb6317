"""chaos.py's rows that the Ray harness cannot run: the learners as threads of one ``diloco train`` process.

``learner_budget=tokens`` (the learners share the token budget, a fast one training past ``--steps``, a straggler
stopping early) is built for learners in one job: a site job (how :mod:`diloco.decoupled.ray_learners` runs each
learner) refuses it. These rows run ``diloco train --method decoupled`` (``decoupled_transport=threads``) on the
same config; a straggler is the config's ``slowdown`` (as on Ray) and no fault is injected. Figures from the
learners' logs (``learner-<m>.jsonl``) as for the Ray rows: wall from the first step's start to the last step's
end, goodput (:func:`diloco.decoupled.chaos_logs.goodput`), each learner's waiting share
(:func:`diloco.decoupled.chaos_logs.wait_shares`); the final eval loss of the global parameters.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from diloco.decoupled.chaos_logs import goodput, run_rows, wait_shares
from diloco.train.config import TrainConfig
from diloco.train.trainer import train_model


def threads_run(cfg: TrainConfig, *, out: Path, cache: Path, slowdown: tuple[float, ...]) -> dict[str, Any]:
    """Train ``cfg`` (a decoupled config) with its learners as threads, each slowed by its ``slowdown`` factor."""
    M = cfg.replicas
    cfg = TrainConfig.from_dict(
        {**cfg.to_dict(), "decoupled_transport": "threads", "slowdown": ",".join(str(f) for f in slowdown)}
    )
    shutil.rmtree(out, ignore_errors=True)
    result = train_model(cfg, out, cache_dir=cache, progress=False)
    rows = run_rows(out, M)
    steps = [r for r in rows if "step" in r]
    wall = max(r["t"] for r in steps) - min(r["t"] - r["dt"] for r in steps)
    return {
        "eval_loss": result.final_eval_loss,
        "wall_s": wall,
        "goodput": goodput(rows, num_learners=M, wall_s=wall).value,
        "lost_steps": 0,
        "wait_share": wait_shares(rows, num_learners=M),
        "steps": {str(m): sum(1 for r in steps if r["learner"] == m) for m in range(M)},
        "tokens": sum(int(r["tokens"]) for r in steps),
        "kills": [],
        "harness": "threads: one diloco train process",
    }


__all__ = ["threads_run"]
