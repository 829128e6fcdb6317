"""A run's budget and batch split: the checks :class:`~diloco.train.config.TrainConfig` collects for
``replicas``, ``ranks_per_worker``, ``global_batch``, ``steps`` and ``tokens``.

Torch-free (the config imports it). Each step takes ``global_batch`` sequences, ``global_batch / replicas``
per worker, split evenly over its ``ranks_per_worker`` processes (:attr:`TrainConfig.batch_per_rank`);
the run lasts ``steps``, or ``tokens`` converted to steps of ``global_batch x seq_len``.
"""

from __future__ import annotations

from typing import Any


def budget_errors(cfg: Any) -> list[str]:
    """What is wrong with the config's workers, batch and budget (each message names the value and the fix)."""
    errors: list[str] = []

    def need(ok: bool, msg: str) -> None:
        if not ok:
            errors.append(msg)

    need(cfg.replicas >= 1, f"replicas={cfg.replicas}: need at least 1")
    need(cfg.ranks_per_worker >= 1, f"ranks_per_worker={cfg.ranks_per_worker}: need at least 1")
    ranks = cfg.replicas * max(1, cfg.ranks_per_worker)
    need(
        cfg.global_batch >= ranks and cfg.global_batch % ranks == 0,
        f"global_batch={cfg.global_batch} must be a positive multiple of replicas={cfg.replicas} x "
        f"ranks_per_worker={cfg.ranks_per_worker} (each replica gets global_batch / replicas sequences, "
        f"split evenly over its ranks)",
    )
    for name in ("steps", "tokens"):
        need(getattr(cfg, name) >= 0, f"{name}={getattr(cfg, name)}: must be >= 0")
    need(cfg.global_batch >= 1, f"global_batch={cfg.global_batch}: need at least 1 sequence per step")
    need(
        (cfg.steps > 0) != (cfg.tokens > 0),
        f"set exactly one of steps={cfg.steps} or tokens={cfg.tokens} to a positive value",
    )
    return errors


__all__ = ["budget_errors"]
