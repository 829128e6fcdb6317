"""The inner learning rate at each step: linear warmup, then cosine decay (the papers' schedule)."""

from __future__ import annotations

import math

from diloco.train.config import TrainConfig

__all__ = ["lr_at"]


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warmup to inner_lr, then cosine decay to min_lr_ratio * inner_lr at the last step."""
    total = cfg.total_steps
    if cfg.warmup_steps > 0 and step <= cfg.warmup_steps:
        return cfg.inner_lr * step / cfg.warmup_steps
    span = max(1, total - cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / span)
    floor = cfg.min_lr_ratio
    return cfg.inner_lr * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress)))
