"""A job for ``torchrun``: join with ``setup_communicators``, train TinyNet with StreamingDiLoCo, save the result.

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

from diloco import get_codec, setup_communicators  # noqa: E402


def main() -> None:
    out_dir, cfg = Path(sys.argv[1]), json.loads(sys.argv[2])
    torch.set_num_threads(1)
    R = cfg.get("R", 1)
    with setup_communicators(ranks_per_worker=R, backend="gloo", timeout_s=30, process_group_timeout_s=60) as comms:
        env = comms.env
        if R == 1:
            result = streaming_replica(comms.replica, cfg)
        else:  # the worker's R ranks: one averaged gradient, the same parameters on every rank
            fp32 = get_codec("fp32")
            payloads = comms.intra.all_gather_async(fp32.encode(torch.full((3,), float(env.rank)))).wait()
            mean = torch.stack([fp32.decode(p, 3) for p in payloads]).mean(0)
            result = {
                "replica": (comms.replica.rank, comms.replica.world_size),
                "intra": (comms.intra.rank, comms.intra.world_size),
                "lead": comms.is_lead,
                "mean": mean,
            }
        result["env"] = {
            "rank": env.rank,
            "world_size": env.world_size,
            "local_rank": env.local_rank,
            "gloo_ifname": os.environ.get("GLOO_SOCKET_IFNAME"),
            "device": str(comms.device),
        }
        torch.save(result, out_dir / f"rank{env.rank}.pt")
    assert not dist.is_initialized()  # close() destroyed the process group it created


if __name__ == "__main__":
    main()
