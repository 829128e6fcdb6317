"""Your own model for the trainer and CLI: a factory the command line names as ``FILE.py:FUNCTION``.

    diloco train --preset tiny --method streaming --set model=examples/own_model.py:build

The trainer calls ``build(vocab_size=..., seq_len=...)`` after seeding torch; the module it returns
has ``forward(idx, targets) -> (logits, loss)``. Its blocks live in an ``nn.ModuleList`` called
``layers``, so Streaming DiLoCo's fragmenter splits it like any transformer.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class GatedBlock(nn.Module):
    """A causal depthwise convolution over time, then a gated MLP; pre-norm residuals."""

    def __init__(self, d: int, kernel: int = 4) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.conv = nn.Conv1d(d, d, kernel, groups=d, padding=kernel - 1)
        self.up, self.gate, self.down = nn.Linear(d, 2 * d), nn.Linear(d, 2 * d), nn.Linear(2 * d, d)

    def forward(self, h: torch.Tensor) -> torch.Tensor:  # [batch, time, d]
        t = h.shape[1]
        h = h + self.conv(self.norm1(h).transpose(1, 2))[..., :t].transpose(1, 2)
        x = self.norm2(h)
        return h + self.down(F.silu(self.gate(x)) * self.up(x))


class ConvLM(nn.Module):
    def __init__(self, vocab_size: int, d: int = 64, depth: int = 4) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, d)
        self.layers = nn.ModuleList(GatedBlock(d) for _ in range(depth))
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab_size, bias=False)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        h = self.embed(idx)
        for layer in self.layers:
            h = layer(h)
        logits = self.head(self.norm(h))
        loss = None if targets is None else F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
        return logits, loss


def build(*, vocab_size: int, seq_len: int) -> nn.Module:
    return ConvLM(vocab_size)
