"""A tiny model with repeated blocks, for fast algorithm tests (the real model family is tested elsewhere)."""

from __future__ import annotations

import threading

import torch
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.fc = nn.Linear(d, d)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h + torch.tanh(self.fc(self.norm(h)))


class TinyNet(nn.Module):
    """Embedding -> blocks -> head; predicts the next token of a short sequence."""

    def __init__(self, vocab: int = 16, d: int = 8, n_blocks: int = 4) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(Block(d) for _ in range(n_blocks))
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None):
        h = self.embed(x)
        for b in self.blocks:
            h = b(h)
        logits = self.head(self.norm(h))
        loss = None if y is None else F.cross_entropy(logits.flatten(0, 1), y.flatten())
        return logits, loss


_RNG_LOCK = threading.Lock()


def make_model(seed: int = 0, **kw) -> TinyNet:
    """Seeded init; the lock keeps replica threads from interleaving on torch's global RNG."""
    with _RNG_LOCK:
        torch.manual_seed(seed)
        return TinyNet(**kw)


def batches(rank: int, num_steps: int, *, batch: int = 4, seq: int = 6, vocab: int = 16, seed: int = 0):
    """Deterministic per-replica data: a noisy 'next = current + 1 mod vocab' task."""
    g = torch.Generator().manual_seed(1000 * seed + rank)
    out = []
    for _ in range(num_steps):
        x = torch.randint(0, vocab, (batch, seq), generator=g)
        y = (x + 1) % vocab
        noise = torch.rand(batch, seq, generator=g) < 0.1
        y = torch.where(noise, torch.randint(0, vocab, (batch, seq), generator=g), y)
        out.append((x, y))
    return out


class ConstantStep(torch.optim.Optimizer):
    """A fixed-update optimizer: w <- w - c every step, whatever the gradient."""

    def __init__(self, params, c):
        super().__init__(params, {"c": c})

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            for p in group["params"]:
                p.sub_(group["c"])


class Scalar(torch.nn.Module):
    """One scalar parameter w = 0: closed-form tests of the outer step."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(()))
