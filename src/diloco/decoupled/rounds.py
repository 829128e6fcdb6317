"""The syncer's small parts: an open merge round of one fragment, and which parameters are embeddings."""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import nn

from diloco.decoupled.messages import Report


def embedding_names(model: nn.Module) -> set[str]:
    """Names of the trainable parameters that belong to an ``nn.Embedding`` (tied aliases included)."""
    ids = {id(p) for m in model.modules() if isinstance(m, nn.Embedding) for p in m.parameters()}
    return {n for n, p in model.named_parameters() if id(p) in ids}


@dataclass
class Round:
    reports: dict[int, Report] = field(default_factory=dict)
    excused: set[int] = field(default_factory=set)  # learners that joined again while it was open: not waited for
    opened_at: float = 0.0
    quorum_at: float | None = None
    window: float = 0.0


__all__ = ["Round", "embedding_names"]
