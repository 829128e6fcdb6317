"""Launch helpers for torch.distributed runs (the only part of the library that reads the environment).

* :func:`setup_communicators` joins a torchrun job and builds the replica (and worker) communicators;
* :func:`init_from_env` joins a job started by ``torchrun`` (see :mod:`diloco.distributed.launch`).
* :func:`run_processes` runs a replica function in N local processes on gloo, the
  multi-process twin of :func:`diloco.comm.local.run_replicas` (see :mod:`diloco.distributed.spawn`).
"""

from diloco.distributed.launch import Communicators, DistEnv, init_from_env, read_env, setup_communicators
from diloco.distributed.spawn import ProcessFailure, RankFailure, run_processes

__all__ = [
    "Communicators",
    "DistEnv",
    "ProcessFailure",
    "RankFailure",
    "init_from_env",
    "read_env",
    "run_processes",
    "setup_communicators",
]
