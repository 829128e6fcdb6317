"""The pure math of one outer sync: average the replicas' outer gradients, merge.

Kept free of state so it can be tested against closed forms and reused by
every mode (DiLoCo, Streaming DiLoCo, data-parallel gradient averaging).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial

import torch

from diloco.errors import ConfigError
from diloco.wire.codec import Codec, all_finite

OuterOptimizerFactory = Callable[[list[torch.Tensor]], torch.optim.Optimizer]

#: The DiLoCo paper's outer optimizer: SGD, lr 0.7, momentum 0.9, Nesterov.
default_outer_optimizer: OuterOptimizerFactory = partial(torch.optim.SGD, lr=0.7, momentum=0.9, nesterov=True)


def average_payloads(
    payloads: Sequence[torch.Tensor], codec: Codec, numel: int, *, out_device: torch.device | None = None
) -> tuple[torch.Tensor | None, list[int]]:
    """Decode every replica's payload and average them in FP32, in rank order.

    Contributions that decode to any non-finite value are dropped from the
    average (the codecs turn a non-finite input into an all-NaN payload) and
    their ranks returned, so one diverged replica cannot poison the others.
    Returns ``(None, dropped)`` when every contribution was dropped.
    Summing in rank order makes the result bit-identical on every replica.
    """
    total: torch.Tensor | None = None
    dropped: list[int] = []
    for rank, payload in enumerate(payloads):
        value = codec.decode(payload, numel)
        if out_device is not None:
            value = value.to(out_device)
        if not bool(all_finite(value)):
            dropped.append(rank)
            continue
        total = value if total is None else total.add_(value)
    kept = len(payloads) - len(dropped)
    if total is None:
        return None, dropped
    return total.div_(kept), dropped


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
