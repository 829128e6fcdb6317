"""The trainer: one configuration (DP, DiLoCo, Streaming DiLoCo) on one model, data set and budget.

``train_model(cfg, out_dir, cache_dir=...)`` trains one :class:`TrainConfig`; :class:`Trainer` is the
same with its steps exposed (``diloco train`` under torchrun runs :meth:`Trainer.run_replica`).
"""

from diloco._lazy import lazy_exports

_EXPORTS = {
    "TrainConfig": ".config",
    "Trainer": ".trainer",
    "RunResult": ".result",
    "train_model": ".trainer",
}

__getattr__, __dir__, __all__ = lazy_exports(__name__, _EXPORTS, globals())
