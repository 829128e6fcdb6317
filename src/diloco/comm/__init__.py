"""Communicators: who replicas talk to (threads in one process, or torch.distributed), and byte accounting."""

from diloco._lazy import lazy_exports

_EXPORTS = {
    "Communicator": ".base",
    "CommError": ".base",
    "Work": ".base",
    "CommStats": ".accounting",
    "LocalCommunicator": ".local",
    "LocalGroup": ".local",
    "run_replicas": ".local",
    "TorchDistCommunicator": ".torch_dist",
    "WorkerCommunicator": ".mesh",
    "Layout": ".mesh",
    "build_layout": ".mesh",
}

__getattr__, __dir__, __all__ = lazy_exports(__name__, _EXPORTS, globals())
