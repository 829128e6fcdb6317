"""What the training config's wire settings cannot be: the checks :class:`~diloco.train.config.TrainConfig`
collects for ``codec``, ``dp_codec``, ``ef_decay``, ``topk_density`` and ``topk_tables``.

Takes the config as ``Any``: :mod:`diloco.wire` is a leaf package and imports no ``diloco.train``.
"""

from __future__ import annotations

from typing import Any

from diloco.wire.sizes import TOPK_TABLES


def codec_errors(cfg: Any) -> list[str]:
    """What is wrong with the config's codec settings (each message names the value and the fix)."""
    from diloco.wire.registry import ALL_CODEC_NAMES, CODEC_NAMES  # torch: only when a config is checked

    errors = []
    if cfg.topk_tables not in TOPK_TABLES:
        errors.append(f"topk_tables={cfg.topk_tables!r}: choose one of {', '.join(TOPK_TABLES)}")
    if cfg.codec not in ALL_CODEC_NAMES:
        errors.append(f"codec={cfg.codec!r}: choose one of {', '.join(ALL_CODEC_NAMES)}")
    if not 0.0 <= cfg.ef_decay <= 1.0:
        errors.append(
            f"ef_decay={cfg.ef_decay}: need 0 <= beta <= 1 (0 = no error feedback; SparseLoCo 0.95, MuLoCo 0.9)"
        )
    if not 0.0 < cfg.topk_density <= 1.0:
        errors.append(
            f"topk_density={cfg.topk_density}: need 0 < density <= 1 (the share of each chunk sent, e.g. 0.015625)"
        )
    if cfg.dp_codec not in CODEC_NAMES:
        errors.append(f"dp_codec={cfg.dp_codec!r}: choose one of {', '.join(CODEC_NAMES)}")
    return errors


__all__ = ["codec_errors"]
