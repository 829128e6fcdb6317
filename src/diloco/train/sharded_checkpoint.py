"""Sharded checkpoints of FSDP workers with ``torch.distributed.checkpoint`` (DCP).

With ``worker_sharding = "fsdp"`` no rank holds its worker's whole state, so every
rank writes its own shard. Per worker W and step N::

    checkpoints/step-0000000N/worker-W/__L_0.distcp   # rank L's shards (DCP, one file per rank)
    checkpoints/step-0000000N/worker-W/.metadata      # DCP's index of every shard
    checkpoints/step-0000000N/worker-W/rank-L.pt      # rank L's small non-tensor state (torch.save)

The DCP part holds every tensor under a parameter's name, as a DTensor of the
worker's mesh: the model (``model/NAME``), the inner optimizer's state
(``optim/NAME/KEY``: AdamW's moments and step), the global copy (``global/NAME``)
and the outer optimizers' per-element state (``outer/NAME/KEY``: Nesterov momentum),
and with error feedback its accumulators (``feedback/NAME``), the last three cut out of
:class:`~diloco.algorithm.streaming.StreamingDiLoCo`'s flat per-fragment vectors. Because
everything is named and global-shaped, a load with another number of ranks per
worker (R) is DCP resharding: each rank reads the pieces of the saved shards its
new shard covers. ``rank-L.pt`` holds what is
not a sharded tensor and stays with the rank: the sampler position, the
algorithm's step counter, its in-flight exchanges (rank L's encoded shard of the
outer gradient: valid only for the same layout), byte counters, the optimizers'
hyper-parameters. It is loaded with ``weights_only=True``; DCP's tensors are too
(its ``.metadata`` index is a pickle: the SHA-256 of every file is checked before
anything is read, see :mod:`diloco.train.checkpoint`).

:func:`save_worker` and :func:`load_worker` speak the trainer's replicate format
(``{"model", "optimizer", "algorithm", "sampler", ...}`` with the optimizer keyed by
parameter index and the algorithm's flat vectors): the trainer's restore code,
elastic resizing included, is the same for both.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from diloco.files import atomic_write_with
from diloco.train.checkpoint import CheckpointError, step_dir
from diloco.train.sharding import is_sharded, shard_like

#: ``format`` of a checkpoint's record written by FSDP workers (absent: one torch.save file per worker).
FORMAT = "dcp"


def worker_dir(run_dir: Path, step: int, worker: int) -> Path:
    return step_dir(run_dir, step) / f"worker-{worker}"


def _rank_file(run_dir: Path, step: int, worker: int, rank: int) -> Path:
    return worker_dir(run_dir, step, worker) / f"rank-{rank}.pt"


def _split(flat: torch.Tensor, params: list[torch.Tensor], names: list[str]) -> dict[str, torch.Tensor]:
    """A fragment's flat vector of local shards, cut into one global-shaped (DTensor) value per parameter."""
    from diloco.algorithm.base import local_shard

    out, offset = {}, 0
    for name, param in zip(names, params, strict=True):
        shard = local_shard(param.detach())
        out[name] = shard_like(flat[offset : offset + shard.numel()].view(shard.shape), param)
        offset += shard.numel()
    assert offset == flat.numel(), (offset, flat.numel())
    return out


def _param_names(model: nn.Module, opt: torch.optim.Optimizer) -> list[str]:
    """The names of the optimizer's parameters in its state dict's index order."""
    name_of = {id(p): n for n, p in model.named_parameters()}
    return [name_of[id(p)] for group in opt.param_groups for p in group["params"]]


def _tensors(
    state: dict[str, Any], model: nn.Module, opt: torch.optim.Optimizer, algo: Any
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The trainer's state as DCP's named tensors, and the rest (for ``rank-L.pt``)."""
    names = _param_names(model, opt)
    tensors: dict[str, torch.Tensor] = {f"model/{k}": v for k, v in state["model"].items()}
    opt_state = state["optimizer"]
    optim_kinds: dict[str, dict[str, str]] = {}
    for idx, entry in opt_state["state"].items():
        name = names[int(idx)]
        optim_kinds[name] = {}
        for key, value in entry.items():
            assert isinstance(value, torch.Tensor), f"optimizer state {name}/{key} is not a tensor"
            tensors[f"optim/{name}/{key}"] = value
            optim_kinds[name][key] = "param" if value.dim() > 0 else str(value.dtype).removeprefix("torch.")
    alg = state["algorithm"]
    outer_rest = []
    for p, frag in enumerate(algo.fragments):
        for name, value in _split(alg["global"][p], frag.params, frag.names).items():
            tensors[f"global/{name}"] = value
        if "outer_optimizers" not in alg:  # a decoupled learner: its global copy, no outer optimizer
            continue
        saved = alg["outer_optimizers"][p]
        per_element, other = [], {}
        for key, value in saved["state"].get(0, {}).items():
            if isinstance(value, torch.Tensor) and value.numel() == alg["global"][p].numel() and value.dim() == 1:
                per_element.append(key)
                for name, piece in _split(value, frag.params, frag.names).items():
                    tensors[f"outer/{name}/{key}"] = piece
            else:
                other[key] = value
        outer_rest.append({"param_groups": saved["param_groups"], "per_element": per_element, "other": other})
    feedback = alg.get("error_feedback")
    if feedback is not None:  # the accumulators: one flat vector per fragment, laid out as the global copy
        for p, frag in enumerate(algo.fragments):
            for name, value in _split(feedback["accumulators"][p], frag.params, frag.names).items():
                tensors[f"feedback/{name}"] = value
    rest = {k: v for k, v in state.items() if k not in ("model", "optimizer", "algorithm")}
    rest["optimizer"] = {"param_groups": opt_state["param_groups"], "kinds": optim_kinds}
    rest["algorithm"] = {k: v for k, v in alg.items() if k not in ("global", "outer_optimizers", "error_feedback")}
    if "outer_optimizers" in alg:
        rest["algorithm"]["outer"] = outer_rest
    if feedback is not None:
        rest["algorithm"]["feedback_decay"] = feedback["decay"]
    return tensors, rest


def _copy(t: torch.Tensor) -> torch.Tensor:
    """A copy that training cannot change while it is written (a DTensor: a copy of its local shard)."""
    if is_sharded(t):
        from torch.distributed.tensor import DTensor

        return DTensor.from_local(
            t.to_local().detach().clone(),
            t.device_mesh,
            t.placements,
            shape=t.shape,
            stride=t.stride(),
            run_check=False,
        )
    return t.detach().clone()


class _Copied:
    """DCP's stager for tensors :func:`_copy` already copied (DCP's own stager copies whole storages, which
    fails on FSDP's parameters, whose storages it may have freed)."""

    should_synchronize_after_execute = False

    def stage(self, state_dict: dict[str, Any]) -> dict[str, Any]:
        return state_dict

    def synchronize_staging(self) -> None:
        pass

    def close(self) -> None:
        pass


def save_worker(
    run_dir: Path,
    step: int,
    *,
    worker: int,
    rank: int,
    state: dict[str, Any],
    model: nn.Module,
    opt: torch.optim.Optimizer,
    algo: Any,
    process_group: Any,
    async_group: Any = None,
) -> Any:
    """Every rank of worker ``worker`` (together: DCP is a collective over ``process_group``, the worker's ranks).

    ``state``: the trainer's replicate-format state of this rank (model and optimizer state dicts of the
    sharded model, the algorithm's ``state_dict()``, sampler, counters).

    ``async_group`` (a process group of the worker's ranks used for nothing else): copy the tensors now and
    write them in a background thread (``dcp.async_save``, whose collectives then run on that group, never
    interleaved with training's); returns its Future, done when this rank's shard and (on the worker's first
    rank) DCP's index are written. Without it, returns None once everything is written.
    """
    import torch.distributed.checkpoint as dcp

    tensors, rest = _tensors(state, model, opt, algo)
    where = worker_dir(run_dir, step, worker)
    where.mkdir(parents=True, exist_ok=True)
    atomic_write_with(_rank_file(run_dir, step, worker, rank), lambda f: torch.save(rest, f))
    if async_group is not None:
        return dcp.async_save(
            {k: _copy(v) for k, v in tensors.items()},
            checkpoint_id=where,
            process_group=async_group,
            async_stager=_Copied(),
        )
    dcp.save(tensors, checkpoint_id=where, process_group=process_group)
    return None


def load_worker(
    run_dir: Path,
    step: int,
    *,
    worker: int,
    rank: int,
    model: nn.Module,
    opt: torch.optim.Optimizer,
    algo: Any,
    process_group: Any,
) -> dict[str, Any]:
    """Worker ``worker``'s checkpoint of ``step``, resharded onto this rank's ``model`` (any R), in the trainer's
    replicate format; the non-tensor state is rank ``rank``'s of that worker (``rank-RANK.pt``).

    Call on every rank of the (new) worker: DCP reads collectively over ``process_group``.
    """
    import torch.distributed.checkpoint as dcp

    where = worker_dir(run_dir, step, worker)
    path = _rank_file(run_dir, step, worker, rank)
    if not (where / ".metadata").exists() or not path.exists():
        raise CheckpointError(
            f"sharded checkpoint {where} is incomplete ({'.metadata' if path.exists() else path.name}"
            f" missing); was it written with fewer workers or ranks?"
        )
    try:
        rest = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise CheckpointError(
            f"checkpoint {path} is damaged or not a checkpoint ({type(exc).__name__}); delete "
            f"{step_dir(run_dir, step)} and its .json record to resume from the one before"
        ) from None
    # Templates on this rank's current layout: DCP loads (and reshards) into them in place.
    tensors: dict[str, torch.Tensor] = {f"model/{k}": v for k, v in model.state_dict().items()}
    params = dict(model.named_parameters())
    optim_state: dict[str, dict[str, torch.Tensor]] = {}
    for name, kinds in rest["optimizer"]["kinds"].items():
        optim_state[name] = {}
        for key, kind in kinds.items():
            value = torch.zeros_like(params[name]) if kind == "param" else torch.zeros((), dtype=getattr(torch, kind))
            optim_state[name][key] = tensors[f"optim/{name}/{key}"] = value
    flats = [torch.zeros_like(g.detach()) for g in algo.global_flat]
    outer_flats: list[dict[str, torch.Tensor]] = []
    for p, frag in enumerate(algo.fragments):
        for name, value in _split(flats[p], frag.params, frag.names).items():
            tensors[f"global/{name}"] = value
        if "outer" not in rest["algorithm"]:  # a decoupled learner: no outer optimizer
            continue
        bufs = {key: torch.zeros_like(flats[p]) for key in rest["algorithm"]["outer"][p]["per_element"]}
        for key, buf in bufs.items():
            for name, value in _split(buf, frag.params, frag.names).items():
                tensors[f"outer/{name}/{key}"] = value
        outer_flats.append(bufs)
    feedback = None
    if "feedback_decay" in rest["algorithm"]:
        feedback = [torch.zeros_like(f) for f in flats]
        for p, frag in enumerate(algo.fragments):
            for name, value in _split(feedback[p], frag.params, frag.names).items():
                tensors[f"feedback/{name}"] = value
    dcp.load(tensors, checkpoint_id=where, process_group=process_group)

    names = _param_names(model, opt)
    model_state = {k[len("model/") :]: v for k, v in tensors.items() if k.startswith("model/")}
    optimizer = {
        "state": {names.index(n): s for n, s in optim_state.items()},
        "param_groups": rest["optimizer"]["param_groups"],
    }
    alg = {k: v for k, v in rest["algorithm"].items() if k not in ("outer", "feedback_decay")}
    alg["global"] = flats
    if feedback is not None:
        alg["error_feedback"] = {"decay": rest["algorithm"]["feedback_decay"], "accumulators": feedback}
    if "outer" in rest["algorithm"]:
        alg["outer_optimizers"] = [
            {
                "state": {0: {**o["other"], **outer_flats[p]}} if (o["other"] or outer_flats[p]) else {},
                "param_groups": o["param_groups"],
            }
            for p, o in enumerate(rest["algorithm"]["outer"])
        ]
    out = {k: v for k, v in rest.items() if k not in ("optimizer", "algorithm")}
    return {**out, "model": model_state, "optimizer": optimizer, "algorithm": alg}


def read_full(run_dir: Path, step: int, worker: int) -> dict[str, torch.Tensor]:
    """Worker ``worker``'s tensors at ``step``, whole (every shard read), in one process without torch.distributed:
    ``{"model/NAME": ..., "optim/NAME/KEY": ..., "global/NAME": ..., "outer/NAME/KEY": ...}`` (for inspection,
    tests, or converting a run to one file per worker)."""
    # What torch.distributed.checkpoint.format_utils.dcp_to_torch_save does, without writing the file.
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.format_utils import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    state: dict[str, Any] = {}
    _load_state_dict(
        state,
        storage_reader=FileSystemReader(worker_dir(run_dir, step, worker)),
        planner=_EmptyStateDictLoadPlanner(),
        no_dist=True,
    )
    return state


__all__ = ["FORMAT", "load_worker", "read_full", "save_worker", "worker_dir"]
