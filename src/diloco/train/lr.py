"""The inner learning rate at each step: linear warmup, then cosine decay (the papers' schedule), and the
optimizers' numeric settings the config checks (:func:`optimizer_errors`; torch-free, as the config is)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from diloco.train.config import TrainConfig

__all__ = ["cosine_lr", "lr_at", "optimizer_errors"]


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


def optimizer_errors(cfg: Any) -> list[str]:
    """What is wrong with the inner and outer optimizers' numbers (each message names the value and the fix)."""
    errors: list[str] = []

    def need(ok: bool, msg: str) -> None:
        if not ok:
            errors.append(msg)

    need(cfg.warmup_steps >= 0, f"warmup_steps={cfg.warmup_steps}: must be >= 0")
    for name in ("weight_decay", "grad_clip", "z_loss"):
        need(getattr(cfg, name) >= 0, f"{name}={getattr(cfg, name)}: must be >= 0 (0 turns it off)")
    for name in ("beta1", "beta2", "outer_momentum"):
        need(0.0 <= getattr(cfg, name) < 1.0, f"{name}={getattr(cfg, name)}: need 0 <= {name} < 1")
    need(cfg.inner_lr > 0, f"inner_lr={cfg.inner_lr}: must be > 0")
    need(cfg.outer_lr > 0, f"outer_lr={cfg.outer_lr}: must be > 0")
    need(0.0 <= cfg.min_lr_ratio <= 1.0, f"min_lr_ratio={cfg.min_lr_ratio}: need 0..1")
    return errors
