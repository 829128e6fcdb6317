"""Launch helpers for torch.distributed runs (the only part of the library that reads the environment).

* :func:`init_from_env` joins a job started by ``torchrun`` (see :mod:`diloco.distributed.launch`).
* :func:`run_processes` runs a replica function in N local processes on gloo, the
  multi-process twin of :func:`diloco.comm.local.run_replicas` (see :mod:`diloco.distributed.spawn`).
"""

from diloco.distributed.launch import DistEnv, init_from_env, read_env
from diloco.distributed.spawn import ProcessFailure, RankFailure, run_processes

__all__ = ["DistEnv", "ProcessFailure", "RankFailure", "init_from_env", "read_env", "run_processes"]
