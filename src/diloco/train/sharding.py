"""FSDP workers in the trainer: a worker's model ``fully_shard``'ed (FSDP2) over its R ranks.

With ``worker_sharding = "fsdp"`` each DiLoCo worker's R ranks hold one model
between them: every repeated block (the project's ``blocks``, an HF model's
``model.layers`` / ``transformer.h``, ...: :func:`~diloco.algorithm.fragments.find_blocks`)
is its own FSDP unit, then the root (embeddings, final norm, head). FSDP
all-gathers a unit's parameters for its forward and backward and reduce-scatters
its gradients, averaged over the R ranks, so each rank keeps and steps only its
shard: the inner AdamW state, the global copy and the outer-optimizer state are
all 1/R of a replicated worker's. :class:`~diloco.algorithm.streaming.StreamingDiLoCo`
works on those shards unchanged and exchanges them between the same-index ranks
of the workers (:meth:`~diloco.comm.mesh.Layout.shard_communicator`).

``mixed_precision``: bf16 parameters for forward and backward, gradients reduced
in fp32, the sharded master weights (and so the optimizer states and the global
copy) fp32: FSDP2's ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``.

Also the sharded worker's process groups: :func:`worker_group` (a second group over the
worker's ranks, for background checkpoint writes) and :func:`worker_totals` (the worker's
byte counters, summed over its ranks).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


def shard_worker_model(model: nn.Module, mesh: Any, *, mixed_precision: bool = False) -> nn.Module:
    """``fully_shard`` every repeated block of ``model`` and then the model itself on ``mesh`` (in place).

    ``mesh``: the worker's 1-D DeviceMesh (``Layout.device_mesh["local"]``). A model without repeated
    blocks is sharded as one unit (correct, but every parameter is gathered at once).
    """
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from diloco.algorithm.fragments import find_blocks

    kwargs: dict[str, Any] = {"mesh": mesh}
    if mixed_precision:
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    found = find_blocks(model)
    if found is not None:
        for block in found[1]:
            fully_shard(block, **kwargs)
    fully_shard(model, **kwargs)
    return model


def is_sharded(t: torch.Tensor) -> bool:
    """True for a DTensor (a parameter, state or global value of an FSDP-sharded model)."""
    return hasattr(t, "device_mesh") and hasattr(t, "full_tensor")


def shard_like(value: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """``value`` (this rank's shard, a view) as a DTensor shaped like parameter ``ref`` (a plain tensor stays one)."""
    if not is_sharded(ref):
        return value
    from torch.distributed.tensor import DTensor

    return DTensor.from_local(
        value, ref.device_mesh, ref.placements, shape=ref.shape, stride=ref.stride(), run_check=False
    )


def full_tensors(state: dict[str, Any]) -> dict[str, Any]:
    """Every DTensor of ``state`` gathered into a plain tensor (a collective: call on every rank of the mesh,
    with the same keys in the same order); other values as they are."""
    return {k: v.full_tensor() if isinstance(v, torch.Tensor) and is_sharded(v) else v for k, v in state.items()}


def scalar(value: Any) -> float:
    """A float from a number, a tensor or a DTensor (``clip_grad_norm_`` returns one for sharded gradients)."""
    if isinstance(value, torch.Tensor) and is_sharded(value):
        value = value.full_tensor()
    return float(value)


def worker_group(mesh: Any, *, num_workers: int, ranks_per_worker: int) -> Any:
    """A second process group over this worker's ranks (every process creates every worker's, in one order):
    ``checkpoint_async`` writes a sharded checkpoint's shards over it in the background, never interleaved
    with training's collectives on ``mesh``."""
    import torch.distributed as dist

    layout = [[w * ranks_per_worker + r for r in range(ranks_per_worker)] for w in range(num_workers)]
    mine, _ = dist.new_subgroups_by_enumeration(layout, backend="gloo")
    assert dist.get_process_group_ranks(mine) == dist.get_process_group_ranks(mesh.get_group())
    return mine


def worker_totals(stats: dict[str, int], mesh: Any) -> dict[str, int]:
    """Byte counters summed over a sharded worker's ranks (one collective; exchanges counted once): each rank
    counted its own column's (its shard's) traffic."""
    import torch.distributed as dist

    keys = [k for k in stats if k != "num_exchanges"]
    summed = torch.tensor([stats[k] for k in keys], dtype=torch.int64)
    dist.all_reduce(summed, group=mesh.get_group())
    return {**stats, **dict(zip(keys, summed.tolist(), strict=True))}


def sharding_errors(cfg: Any) -> list[str]:
    """What ``worker_sharding`` cannot run with (each message names the value and the fix)."""
    errors: list[str] = []

    def need(ok: bool, msg: str) -> None:
        if not ok:
            errors.append(msg)

    if cfg.worker_sharding == "fsdp":
        need(
            cfg.method != "dp",
            f"worker_sharding='fsdp' runs DiLoCo / streaming workers, not method={cfg.method!r}: "
            f"use method='diloco' or 'streaming', or worker_sharding='replicate'",
        )
        need(
            cfg.inner_optimizer == "adamw",
            f"inner_optimizer={cfg.inner_optimizer!r} with worker_sharding='fsdp' is not supported (Muon "
            f"orthogonalises whole matrices; FSDP holds shards): use inner_optimizer='adamw' or "
            f"worker_sharding='replicate'",
        )
        need(
            not cfg.compile,
            "compile=true with worker_sharding='fsdp' is not supported: set compile=false "
            "or worker_sharding='replicate'",
        )
    need(
        not cfg.checkpoint_async or cfg.worker_sharding == "fsdp",
        f"checkpoint_async=true needs worker_sharding='fsdp' (sharded checkpoints; got "
        f"{cfg.worker_sharding!r}): set checkpoint_async=false",
    )
    need(
        not cfg.fsdp_mixed_precision or cfg.worker_sharding == "fsdp",
        f"fsdp_mixed_precision=true needs worker_sharding='fsdp' (got {cfg.worker_sharding!r}); "
        f"for replicated workers use bf16=true",
    )
    return errors


__all__ = [
    "full_tensors",
    "is_sharded",
    "scalar",
    "shard_like",
    "shard_worker_model",
    "sharding_errors",
    "worker_group",
    "worker_totals",
]
