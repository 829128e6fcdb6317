"""The eval loss of a model on fixed validation batches, and the bf16 autocast the trainer shares with it."""

from __future__ import annotations

import contextlib
import copy

import torch
import torch.nn.functional as F

__all__ = ["autocast", "evaluate", "evaluate_parameters"]


def autocast(enabled: bool, device: torch.device):
    """bf16 autocast on ``device`` when ``enabled``, else nothing."""
    return torch.autocast(device.type, dtype=torch.bfloat16) if enabled else contextlib.nullcontext()


@torch.no_grad()
def evaluate(model: torch.nn.Module, batches: list[tuple[torch.Tensor, torch.Tensor]], bf16: bool = False) -> float:
    """Mean cross-entropy (no z-loss) over fixed validation batches."""
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    device = next(model.parameters()).device
    for x, y in batches:
        x, y = x.to(device), y.to(device)
        with autocast(bf16, device):
            logits, _ = model(x)
        total += F.cross_entropy(logits.float().flatten(0, 1), y.flatten(), reduction="sum").item()
        count += y.numel()
    model.train(was_training)
    return total / count


@torch.no_grad()
def evaluate_parameters(
    template: torch.nn.Module,
    named: dict[str, torch.Tensor],
    val: list[tuple[torch.Tensor, torch.Tensor]],
    *,
    bf16: bool,
    device: torch.device,
) -> float:
    """Held-out loss of ``template``'s architecture with the parameters ``named`` (e.g. a syncer's global ones)."""
    model = copy.deepcopy(template).to(device)
    params = dict(model.named_parameters())
    for name, value in named.items():
        params[name].copy_(value)
    return evaluate(model, val, bf16)
