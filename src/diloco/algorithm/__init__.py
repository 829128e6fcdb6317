"""The algorithms: Streaming DiLoCo (DiLoCo is its case P = 1, tau = 0), data parallelism, their parts
(eager updates, the inner optimizer: AdamW or Muon). The codecs and error feedback are :mod:`diloco.wire`.

Lazy: ``diloco.algorithm.schedule`` is torch-free, and
importing this package loads neither torch nor the other modules.
"""

from diloco._lazy import lazy_exports

_EXPORTS = {
    "StreamingDiLoCo": ".streaming",
    "SyncReport": ".base",
    "ReplicaAlgorithm": ".base",
    "broadcast_parameters": ".base",
    "DataParallel": ".data_parallel",
    "Schedule": ".schedule",
    "SyncEvents": ".schedule",
    "Fragment": ".fragments",
    "find_blocks": ".fragments",
    "split_fragments": ".fragments",
    "block_groups": "diloco.layout",
    "build_inner_optimizer": ".inner",
    "INNER_OPTIMIZERS": ".choices",
    "default_outer_optimizer": ".outer",
}

__getattr__, __dir__, __all__ = lazy_exports(__name__, _EXPORTS, globals())
