"""Where the syncer's state and merge math live (``syncer_device``): the CPU, or an accelerator of its host.

Everything the syncer holds is on that device: the global fragments Theta_p, the outer optimizers' momentum,
the learners' copies (bases) and a merge's running sums. A report's payload is moved there before it is decoded;
what leaves the syncer (a reply's payload, a welcome's fragments, the global parameters, :meth:`state_dict`) is
on the CPU, the wire every transport carries (a learner puts it on its own device), so a checkpoint written by
a syncer on a GPU loads on a machine without one. ``cpu`` (the default) is the syncer as it always was, bit for
bit; on a GPU a merge's decode, sums and outer step run there (the same math; float sums may round differently,
within the codec's tolerance).

``auto``: ``cuda`` where this process sees a GPU, else ``cpu``.
"""

from __future__ import annotations

from typing import Any

import torch

from diloco.errors import ConfigError

#: The default: the syncer's state in host memory (a GPU beside it is the learners').
DEFAULT_SYNCER_DEVICE = "cpu"


def check_syncer_device(value: str) -> str:
    """``value`` if it names a device the syncer could use somewhere (``auto``, ``cpu``, ``cuda``, ``cuda:N``...);
    whether this host has it is :func:`resolve_syncer_device`'s check, where the syncer runs."""
    if value != "auto":
        try:
            kind = torch.device(value).type
        except (RuntimeError, TypeError, ValueError):
            kind = None
        if kind not in ("cpu", "cuda"):
            raise ConfigError(
                f"syncer_device={value!r} is not a device the syncer runs on: use cpu, auto (a GPU if this host has "
                f"one) or cuda[:N]"
            )
    return value


def resolve_syncer_device(value: str | torch.device) -> torch.device:
    """The device ``value`` names on this host (``auto``: ``cuda`` if a GPU is visible, else ``cpu``); a ConfigError
    naming it and the fix if this process cannot use it (``syncer_device=cuda`` without a GPU)."""
    from diloco.train.device import check_device

    if value == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    check_syncer_device(str(value))
    return check_device(value, key="syncer_device")


def actor_device(value: str) -> str:
    """``syncer_device`` inside a Ray actor that asked for one GPU: Ray shows the actor that GPU alone, as ``cuda:0``,
    so ``cuda:N`` there means it (``cuda``); ``cpu`` and ``auto`` are unchanged."""
    return "cuda" if value.startswith("cuda") else value


def to_host(tree: Any, *, memo: dict[int, torch.Tensor] | None = None) -> Any:
    """``tree`` (dicts, lists, tuples of tensors and plain values) with every tensor not on the CPU copied there;
    tensors it shares stay shared (one copy each), as ``torch.save`` keeps them. CPU tensors are kept as they are."""
    memo = {} if memo is None else memo
    if isinstance(tree, torch.Tensor):
        if tree.device.type == "cpu":
            return tree
        if id(tree) not in memo:
            memo[id(tree)] = tree.cpu()
        return memo[id(tree)]
    if isinstance(tree, dict):
        return {k: to_host(v, memo=memo) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(to_host(v, memo=memo) for v in tree)
    return tree


def syncer_device_errors(cfg: Any) -> list[str]:
    """The config's ``syncer_device``, if it names no device (its host checks it where the syncer runs)."""
    try:
        check_syncer_device(cfg.syncer_device)
    except ConfigError as exc:
        return [str(exc)]
    return []


__all__ = [
    "DEFAULT_SYNCER_DEVICE",
    "actor_device",
    "check_syncer_device",
    "resolve_syncer_device",
    "syncer_device_errors",
    "to_host",
]
