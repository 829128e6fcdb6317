"""diloco: DiLoCo and Streaming DiLoCo for PyTorch, with a trainer, a simulator and scaling laws.

The public face, imported lazily (``import diloco`` loads nothing heavy; ``diloco.sim`` and
``diloco.traffic`` never load torch)::

    from diloco import StreamingDiLoCo, DataParallel, Schedule, run_replicas
    from diloco import TorchDistCommunicator, setup_communicators      # under torchrun
    from diloco import TrainConfig, train_model    # the trainer: train_model(cfg, out_dir, cache_dir=...)

Your own loop: one :class:`StreamingDiLoCo` per replica, ``algo.step()`` after every inner
optimizer step (see ``examples/own_loop.py``).
"""

from diloco._lazy import lazy_exports

__version__ = "0.1.0"

_EXPORTS = {
    # the algorithm
    "StreamingDiLoCo": "diloco.algorithm.streaming",
    "SyncReport": "diloco.algorithm.base",
    "ReplicaAlgorithm": "diloco.algorithm.base",
    "broadcast_parameters": "diloco.algorithm.base",
    "DataParallel": "diloco.algorithm.data_parallel",
    "Schedule": "diloco.algorithm.schedule",
    "SyncEvents": "diloco.algorithm.schedule",
    "split_fragments": "diloco.algorithm.fragments",
    "find_blocks": "diloco.algorithm.fragments",
    "Fragment": "diloco.algorithm.fragments",
    # codecs: the registry
    "Codec": "diloco.wire.codec",
    "CODEC_NAMES": "diloco.wire.registry",
    "get_codec": "diloco.wire.registry",
    "ALL_CODEC_NAMES": "diloco.wire.registry",
    # bandwidth: error feedback, the inner optimizer (AdamW or Muon)
    "ErrorFeedback": "diloco.wire.error_feedback",
    "build_inner_optimizer": "diloco.algorithm.inner",
    # communicators
    "Communicator": "diloco.comm.base",
    "CommError": "diloco.comm.base",
    "ConfigError": "diloco.errors",
    "LocalCommunicator": "diloco.comm.local",
    "run_replicas": "diloco.comm.local",
    "TorchDistCommunicator": "diloco.comm.torch_dist",
    "WorkerCommunicator": "diloco.comm.mesh",
    "build_layout": "diloco.comm.mesh",
    # torch.distributed launch
    "Communicators": "diloco.distributed.launch",
    "init_from_env": "diloco.distributed.launch",
    "setup_communicators": "diloco.distributed.launch",
    "run_processes": "diloco.distributed.spawn",
    # the trainer
    "TrainConfig": "diloco.train.config",
    "Trainer": "diloco.train.trainer",
    "train_model": "diloco.train.trainer",
    "RunResult": "diloco.train.result",
    # models and data
    "Transformer": "diloco.models.transformer",
    "ModelConfig": "diloco.models.transformer",
    "make_config": "diloco.models.sizes",
    "ShardSampler": "diloco.data.shards",
    "eval_batches": "diloco.data.shards",
    "prepare_tokens": "diloco.data.tokens",
}

__getattr__, __dir__, __all__ = lazy_exports(__name__, _EXPORTS, globals())
