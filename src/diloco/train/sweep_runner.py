"""The real trainer as a sweep run function (``diloco sweep --runner train``).

A sweep record's config (see :mod:`diloco.scaling.sweep`) becomes a :class:`TrainConfig`:
the grid's ``base`` mapping holds the fixed settings (e.g. ``vocab_size``, ``seq_len``,
``warmup_steps``, and for streaming runs ``num_fragments`` / ``overlap_steps``) plus two keys of the
runner itself: ``runs_dir`` (where each run's own directory goes, default ``runs/sweep``) and
``cache_dir`` (tokenizer and token cache, default ``$DILOCO_CACHE`` or ``~/.cache/diloco``) and
``device`` (what each run trains on, ``cpu`` by default, e.g. ``cuda``). The three are part of the record's
config, so the same point on another device or in another folder is another run with its own ``run_id``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from diloco.errors import ConfigError
from diloco.files import default_cache_dir
from diloco.train.config import TrainConfig
from diloco.train.trainer import train_model

#: Settings of Streaming DiLoCo alone: a grid's ``base`` may hold them for its streaming runs; the
#: data-parallel and DiLoCo runs of the same grid leave them at their defaults (P = 1, tau = 0).
STREAMING_ONLY = ("num_fragments", "overlap_steps", "fragment_pattern", "merge_alpha")


#: Keys of a grid's ``base`` that the runner takes for itself (they are not TrainConfig fields).
RUNNER_KEYS = ("runs_dir", "cache_dir", "device")


def config_from_record(config: dict[str, Any]) -> tuple[TrainConfig, Path, Path]:
    """The :class:`TrainConfig` of a sweep record, its run directory and the cache folder.

    The record's ``method`` ("dp", "diloco" or "streaming") is the trainer's method; the
    streaming-only settings of the grid's ``base`` apply to its streaming runs only.
    """
    base = dict(config.get("base", {}))
    runs_dir = Path(base.pop("runs_dir", "runs/sweep"))
    cache_dir = Path(base.pop("cache_dir", None) or default_cache_dir())
    for key in RUNNER_KEYS:  # the device: see device_of
        base.pop(key, None)
    method = config["method"]
    if method != "streaming":
        for key in STREAMING_ONLY:
            base.pop(key, None)
    fields = {
        **base,
        "size": config["size"],
        "replicas": config["replicas"],
        "inner_lr": config["inner_lr"],
        "global_batch": config["global_batch"],
        "tokens": config["tokens"],
        "steps": 0,
        "seed": config.get("seed", 0),
        "method": method,
    }
    if method != "dp":
        fields |= {"outer_lr": config["outer_lr"], "sync_every": config["sync_every"]}
    return TrainConfig.from_dict(fields), runs_dir / config["run_id"], cache_dir


def device_of(config: dict[str, Any]) -> str:
    """The device a sweep record's run trains on: its grid's ``base["device"]``, ``cpu`` when unset."""
    device = config.get("base", {}).get("device") or "cpu"
    if not isinstance(device, str):
        raise ConfigError(f'base.device={device!r}: a device name, e.g. "cpu" or "cuda"')
    return device


def run_config(config: dict[str, Any]) -> dict[str, Any]:
    """Train one grid point; return what the sweep records (non-embedding N, final eval loss, wall time, the
    SHA-256 of the token ids it trained on: two sweeps' losses are comparable only on the same data; and, so
    that the record alone tells what the run cost, every parameter, steps and bytes each replica sent)."""
    from diloco.models import count_params, make_config

    cfg, run_dir, cache_dir = config_from_record(config)
    # reuse: a sweep restarted after a kill finds this run's folder holding the run it was training;
    # it resumes from its last checkpoint (or takes a finished one as it is) instead of failing on it.
    result = train_model(cfg, run_dir, cache_dir=cache_dir, progress=False, reuse=True, device=device_of(config))
    mc = make_config(cfg.size, vocab_size=cfg.vocab_size, seq_len=cfg.seq_len)
    return {
        "eval_loss": result.final_eval_loss,
        "num_params": count_params(mc, embeddings=False),
        "wall_time_s": result.wall_time_s,
        "run_dir": str(run_dir),
        "data_sha256": result.data_sha256,
        "total_params": result.num_params,
        "steps": result.steps,
        "bytes_sent_per_replica": result.bytes_sent_per_replica,
    }
