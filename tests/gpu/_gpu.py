"""What the GPU suite shares: the skip markers, and rank functions the nccl tests run in child processes.

Every test here is collected on every machine and skipped where torch sees no CUDA GPU (or fewer GPUs
than it needs), so ``pytest tests/gpu`` reports skips, never errors, on a CPU machine.
"""

from __future__ import annotations

from functools import partial

import pytest
import torch
from _tiny import batches, make_model

NUM_GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0

requires_cuda = pytest.mark.skipif(NUM_GPUS == 0, reason="needs a CUDA GPU (torch.cuda.is_available() is False)")


def requires_gpus(n: int):
    return pytest.mark.skipif(NUM_GPUS < n, reason=f"needs {n} CUDA GPUs (this machine has {NUM_GPUS})")


def outer():
    return partial(torch.optim.SGD, lr=0.7, momentum=0.9, nesterov=True)


STREAMING = {"sync_every": 4, "num_fragments": 2, "overlap_steps": 1, "merge_alpha": 0.5}


def train_streaming(
    comm,
    *,
    device: str,
    offload: str | None = None,
    codec: str = "fp32",
    steps: int = 12,
    seed_by_rank: bool = True,
    fsdp_mesh=None,
) -> dict:
    """TinyNet with StreamingDiLoCo on ``device`` (replicas start apart: the algorithm equalises them).

    ``fsdp_mesh``: ``fully_shard`` every block and the root over it first. Returns the global
    parameters by name (full tensors, on the CPU) and where the global copy lived.
    """
    from diloco.algorithm.streaming import StreamingDiLoCo

    model = make_model(seed=comm.rank if seed_by_rank else 0).to(device)
    if fsdp_mesh is not None:
        from torch.distributed.fsdp import fully_shard

        for block in model.blocks:
            fully_shard(block, mesh=fsdp_mesh)
        fully_shard(model, mesh=fsdp_mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    algo = StreamingDiLoCo(model, comm=comm, codec=codec, outer_optimizer=outer(), offload_device=offload, **STREAMING)
    for x, y in batches(comm.rank, steps):
        model(x.to(device), y.to(device))[1].backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        algo.step()
    algo.flush()
    glob = algo.global_state_dict()
    return {
        "global": {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().cpu() for k, v in glob.items()},
        "global_device": str(algo.global_flat[0].device),
        "sharded": all(hasattr(p, "to_local") for p in model.parameters()),
    }


# -- rank functions for run_processes(..., backend="nccl") (module level: the children import them) -------------------
def nccl_streaming_rank(comm, cfg: dict) -> dict:
    """One replica per GPU over nccl (the communicator's device is this rank's GPU)."""
    assert comm.device.type == "cuda", comm.device
    return train_streaming(comm, device=str(comm.device), codec=cfg["codec"], steps=cfg["steps"])


def nccl_fsdp_rank(comm, cfg: dict) -> dict:
    """FSDP2 on one CUDA rank: the model ``fully_shard``'ed over a one-GPU mesh, StreamingDiLoCo on its shards."""
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cuda", (1,))
    return train_streaming(comm, device=str(comm.device), codec=cfg["codec"], steps=cfg["steps"], fsdp_mesh=mesh)


def nccl_exchange_rank(comm, cfg: dict) -> dict:
    """Every codec's mean through nccl, a broadcast and a barrier, on this rank's GPU."""
    from diloco.wire.registry import CODEC_NAMES, get_codec

    out = {}
    for name in CODEC_NAMES:
        codec = get_codec(name)
        g = torch.Generator().manual_seed(comm.rank)
        values = torch.randn(4099, generator=g).to(comm.device)
        payload = comm.encode(values, codec)
        mean, dropped = comm.mean_async(payload, codec=codec, numel=values.numel(), tag=name).wait()
        out[name] = {
            "mean": mean.cpu(),
            "payload_device": str(payload.device),
            "dropped": list(dropped),
            "own": codec.decode(payload, values.numel()).cpu(),
        }
    t = torch.full((3,), float(comm.rank), device=comm.device)
    comm.broadcast_([t], src=0)
    comm.barrier()
    out["broadcast"] = t.cpu()
    return out
