"""Whether a sweep's runs are evaluated on one validation set: a run's set is ``eval_batches`` x ``global_batch``
windows unless ``eval_sequences`` fixes it, so a grid over batches compares them on different text."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def mixed_eval_sets(configs: Sequence[Mapping[str, Any]]) -> list[str]:
    """A warning per model size whose training runs span several global batches while each run's validation set
    follows its batch (``eval_sequences`` unset: ``eval_batches`` x ``global_batch`` windows): their eval losses
    are then measured on different text, and the differences between batches are partly the text's."""
    batches: dict[str, set[int]] = {}
    for c in configs:
        if c.get("runner") == "train" and not c.get("base", {}).get("eval_sequences"):
            batches.setdefault(c["size"], set()).add(int(c["global_batch"]))
    return [
        f"the runs of {size} at global batches {', '.join(map(str, sorted(b)))} are evaluated on different validation "
        f"windows (eval_batches x global_batch); set base.eval_sequences (e.g. 2048) in the grids to compare batches"
        for size, b in batches.items()
        if len(b) > 1
    ]


__all__ = ["mixed_eval_sets"]
