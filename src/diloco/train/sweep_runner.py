"""The real trainer as a sweep run function (``diloco sweep --runner train``).

A sweep record's config (see :mod:`diloco.scaling.sweep`) becomes a :class:`TrainConfig`:
the grid's ``base`` mapping holds the fixed settings (e.g. ``vocab_size``, ``seq_len``,
``warmup_steps``) plus two keys of the runner itself: ``runs_dir`` (where each run's own
directory goes, default ``runs/sweep``) and ``cache_dir`` (tokenizer and token cache,
default ``~/.cache/diloco``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from diloco.train.config import TrainConfig
from diloco.train.trainer import train


def config_from_record(config: dict[str, Any]) -> tuple[TrainConfig, Path, Path]:
    base = dict(config.get("base", {}))
    runs_dir = Path(base.pop("runs_dir", "runs/sweep"))
    cache_dir = Path(base.pop("cache_dir", Path.home() / ".cache" / "diloco"))
    method = config["method"]
    fields = {**base, "size": config["size"], "replicas": config["replicas"], "inner_lr": config["inner_lr"],
              "global_batch": config["global_batch"], "tokens": config["tokens"], "steps": 0,
              "seed": config.get("seed", 0), "method": "dp" if method == "dp" else "diloco"}
    if method != "dp":
        fields |= {"outer_lr": config["outer_lr"], "sync_every": config["sync_every"]}
    return TrainConfig.from_dict(fields), runs_dir / config["run_id"], cache_dir


def run_config(config: dict[str, Any]) -> dict[str, Any]:
    """Train one grid point; return what the sweep records (non-embedding N, final eval loss, wall time)."""
    from diloco.models import count_params, make_config

    cfg, run_dir, cache_dir = config_from_record(config)
    result = train(cfg, run_dir, cache_dir=cache_dir, progress=False)
    mc = make_config(cfg.size, vocab_size=cfg.vocab_size, seq_len=cfg.seq_len)
    return {"eval_loss": result.final_eval_loss, "num_params": count_params(mc, embeddings=False),
            "wall_time_s": result.wall_time_s, "run_dir": str(run_dir)}
