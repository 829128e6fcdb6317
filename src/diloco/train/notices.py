"""What the trainer tells the user on stderr before a run: run-directory notices, costly settings, speed hints."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from diloco.train.speed import tcmalloc_notice

if TYPE_CHECKING:
    import torch

    from diloco.train.config import TrainConfig


def tell(notices: Sequence[str]) -> None:
    """What the user must know about their run directory (a skipped checkpoint, a finished run)."""
    for line in notices:
        print(f"diloco: {line}", file=sys.stderr, flush=True)


def warning_notices(cfg: TrainConfig) -> list[str]:
    """Settings that run but were measured costly (:attr:`TrainConfig.warnings`)."""
    return [f"warning: {w}" for w in cfg.warnings]


def speed_notices(device: torch.device) -> list[str]:
    notice = tcmalloc_notice(device)
    return [notice] if notice else []


__all__ = ["speed_notices", "tell", "warning_notices"]
