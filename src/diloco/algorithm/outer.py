"""The pure math of one outer sync: merge, the outer optimizer, and loading the global state.

The replicas' outer gradients are averaged where they are decoded (:func:`diloco.wire.average.average_payloads`).
Kept free of state so it can be tested against closed forms and reused by
every mode (DiLoCo, Streaming DiLoCo, data-parallel gradient averaging).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial

import torch

from diloco.errors import ConfigError

OuterOptimizerFactory = Callable[[list[torch.Tensor]], torch.optim.Optimizer]

#: The DiLoCo paper's outer optimizer: SGD, lr 0.7, momentum 0.9, Nesterov.
default_outer_optimizer: OuterOptimizerFactory = partial(torch.optim.SGD, lr=0.7, momentum=0.9, nesterov=True)


@torch.no_grad()
def merge_(local: Sequence[torch.Tensor], global_views: Sequence[torch.Tensor], alpha: float) -> None:
    """local <- alpha * local + (1 - alpha) * global, in place (alpha = 0 copies global exactly)."""
    for p, g in zip(local, global_views, strict=True):
        g = g.to(device=p.device, dtype=p.dtype)
        if alpha == 0.0:
            p.copy_(g)
        else:
            p.copy_(torch.lerp(g, p, alpha))


@torch.no_grad()
def load_global_state(
    global_flat: Sequence[torch.Tensor], outer_optimizers: Sequence[torch.optim.Optimizer], state: dict, *, owner: str
) -> None:
    """Copy ``state["global"]`` (one flat tensor per fragment) into ``global_flat`` and load the outer
    optimizers' states; a checkpoint of another split is refused (``owner`` names the loader in the message)."""
    if len(state["global"]) != len(global_flat):
        raise ConfigError(
            f"checkpoint has {len(state['global'])} fragments, this {owner} has {len(global_flat)}: "
            f"use the num_fragments the checkpoint was written with"
        )
    for g, saved in zip(global_flat, state["global"], strict=True):
        if saved.shape != g.shape:
            raise ConfigError(f"checkpoint fragment of {saved.numel()} values, this {owner} expects {g.numel()}")
        g.copy_(saved)
    for opt, saved in zip(outer_optimizers, state["outer_optimizers"], strict=True):
        opt.load_state_dict(saved)
