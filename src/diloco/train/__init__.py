"""The trainer: one configuration (DP, DiLoCo, Streaming DiLoCo) on one model, data set and budget.

This package is also the function that trains: ``diloco.train(cfg, out_dir, cache_dir=...)`` is
:func:`diloco.train.trainer.train` (the package is callable), so ``from diloco import train``
gives the same callable whether or not ``diloco.train.config`` was imported before.
"""

import sys
import types
from typing import Any

from diloco._lazy import lazy_exports

_EXPORTS = {
    "TrainConfig": ".config",
    "Trainer": ".trainer",
    "RunResult": ".result",
    "train": ".trainer",
}

__getattr__, __dir__, __all__ = lazy_exports(__name__, _EXPORTS, globals())


class _TrainPackage(types.ModuleType):
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Train one configuration: ``train(cfg, out_dir, *, cache_dir, resume=False, progress=True, device="cpu")``."""
        from diloco.train.trainer import train

        return train(*args, **kwargs)


sys.modules[__name__].__class__ = _TrainPackage
