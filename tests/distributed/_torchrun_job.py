"""A job for ``torchrun``: join from the environment, train TinyNet with StreamingDiLoCo, save the result.

Usage: torchrun --standalone --nproc-per-node 2 _torchrun_job.py OUT_DIR CFG_JSON
"""

import json
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from _replicas import streaming_replica  # noqa: E402
from diloco.comm.torch_dist import TorchDistCommunicator  # noqa: E402
from diloco.distributed import init_from_env  # noqa: E402


def main() -> None:
    out_dir, cfg = Path(sys.argv[1]), json.loads(sys.argv[2])
    torch.set_num_threads(1)
    env = init_from_env(backend="gloo", timeout_s=60)
    comm = TorchDistCommunicator(timeout_s=30)
    result = streaming_replica(comm, cfg)
    result["env"] = {"rank": env.rank, "world_size": env.world_size, "local_rank": env.local_rank,
                     "gloo_ifname": os.environ.get("GLOO_SOCKET_IFNAME")}
    torch.save(result, out_dir / f"rank{env.rank}.pt")
    comm.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
