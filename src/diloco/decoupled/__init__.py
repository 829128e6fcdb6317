"""Decoupled DiLoCo: learners on their own clocks, a syncer that merges whoever has reported.

Transport-agnostic parts: :mod:`.merge` (token weights, RDA, mean: pure functions), :mod:`.grace`
(the adaptive grace window), :mod:`.syncer` (the syncer's state machine), :mod:`.learner` (a model's
side); :mod:`.local` runs them as threads in one process. The fragments, codecs, schedule and outer
optimizer are :mod:`diloco.algorithm`'s. Lazy: importing this package loads nothing heavy.
"""

from diloco._lazy import lazy_exports

_EXPORTS = {
    "Syncer": ".syncer",
    "Learner": ".learner",
    "Channel": ".learner",
    "Report": ".messages",
    "Reply": ".messages",
    "MergeRecord": ".messages",
    "LocalTransport": ".local",
    "run_learners": ".local",
    "GraceWindow": ".grace",
    "MERGE_NAMES": ".merge",
    "token_weights": ".merge",
    "radial_directional_average": ".merge",
    "weighted_mean": ".merge",
    "merge_outer_gradients": ".merge",
}

__getattr__, __dir__, __all__ = lazy_exports(__name__, _EXPORTS, globals())
