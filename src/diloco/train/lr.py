"""The inner learning rate at each step: linear warmup, then cosine decay (the papers' schedule)."""

from __future__ import annotations

import math

from diloco.train.config import TrainConfig

__all__ = ["cosine_lr", "lr_at"]


def cosine_lr(step: int, *, peak: float, warmup_steps: int, total_steps: int, min_lr_ratio: float) -> float:
    """Linear warmup to ``peak`` over ``warmup_steps``, then cosine decay to ``min_lr_ratio * peak`` at
    ``total_steps`` (held there after)."""
    if warmup_steps > 0 and step <= warmup_steps:
        return peak * step / warmup_steps
    span = max(1, total_steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / span)
    return peak * (min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def lr_at(step: int, cfg: TrainConfig) -> float:
    """The config's schedule: :func:`cosine_lr` with ``inner_lr``, ``warmup_steps``, ``min_lr_ratio`` and the
    run's total steps."""
    return cosine_lr(
        step,
        peak=cfg.inner_lr,
        warmup_steps=cfg.warmup_steps,
        total_steps=cfg.total_steps,
        min_lr_ratio=cfg.min_lr_ratio,
    )
