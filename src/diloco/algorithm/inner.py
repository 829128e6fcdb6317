"""The inner optimizer: AdamW, or Muon on the hidden matrices and AdamW on the rest (MuLoCo).

MuLoCo (arXiv 2505.23725) runs DiLoCo with Muon as the inner optimizer: its
orthogonalised updates make the outer gradients compress well (2-bit with error
feedback, next to no loss). Muon only makes sense for the 2-D weight matrices
inside the network; embeddings, the output head, norms and biases keep AdamW::

    opt = build_inner_optimizer(model, name="muon", lr=2e-3, weight_decay=0.1)
    ...
    opt.step(); opt.zero_grad()

Muon is ``torch.optim.Muon`` (PyTorch >= 2.9) with ``adjust_lr_fn="match_rms_adamw"``
(Moonshot's scaling, 0.2 sqrt(max(A, B))): its updates then have AdamW's RMS, so
both parts share one learning rate, schedule and weight decay.

Which parameters are hidden matrices (:func:`is_hidden_matrix`): 2-D, trainable,
not held by an ``nn.Embedding`` (a head tied to the embedding is the same
tensor) and not named like an embedding or head (``embed``, ``wte``, ``wpe``,
``head``, ``lm_head``, ``output``: a name part, e.g. ``lm_head.weight``). Pass
``hidden=`` your own predicate for models named otherwise.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from diloco.algorithm.choices import INNER_OPTIMIZERS
from diloco.errors import ConfigError

#: Name parts that mark an embedding or output head (kept on AdamW).
NOT_HIDDEN_NAMES: tuple[str, ...] = ("embed", "embedding", "embeddings", "wte", "wpe", "head", "lm_head", "output")


def is_hidden_matrix(name: str, param: torch.Tensor, embedding_ids: set[int]) -> bool:
    """True for a 2-D hidden weight matrix (Muon's), False for embeddings, head, norms and biases."""
    parts = set(name.lower().split("."))
    return param.ndim == 2 and id(param) not in embedding_ids and not (parts & set(NOT_HIDDEN_NAMES))


def split_parameters(
    model: nn.Module, *, hidden: Callable[[str, torch.Tensor], bool] | None = None
) -> tuple[list[nn.Parameter], list[nn.Parameter]]:
    """(hidden matrices, everything else) among ``model``'s trainable parameters, each once, in order."""
    embedding_ids = {id(p) for m in model.modules() if isinstance(m, nn.Embedding) for p in m.parameters()}
    matrices, rest = [], []
    for name, param in model.named_parameters():  # shared (tied) parameters appear once
        if not param.requires_grad:
            continue
        is_matrix = hidden(name, param) if hidden is not None else is_hidden_matrix(name, param, embedding_ids)
        (matrices if is_matrix else rest).append(param)
    return matrices, rest


class CombinedOptimizer:
    """Several optimizers driven as one: ``step``, ``zero_grad``, ``param_groups`` (all of them, so a
    learning-rate schedule that sets ``group["lr"]`` reaches every part), ``state_dict``."""

    def __init__(self, optimizers: dict[str, torch.optim.Optimizer]) -> None:
        assert optimizers, "no optimizer to combine"
        self.optimizers = optimizers

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return [g for opt in self.optimizers.values() for g in opt.param_groups]

    def __iter__(self) -> Iterator[torch.optim.Optimizer]:
        return iter(self.optimizers.values())

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> None:
        assert closure is None, "CombinedOptimizer.step takes no closure"
        for opt in self.optimizers.values():
            opt.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for opt in self.optimizers.values():
            opt.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict[str, Any]:
        return {name: opt.state_dict() for name, opt in self.optimizers.items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if set(state) != set(self.optimizers):
            raise ConfigError(
                f"optimizer checkpoint holds {sorted(state)} but this run has "
                f"{sorted(self.optimizers)}: resume with the inner optimizer it was written with"
            )
        for name, opt in self.optimizers.items():
            opt.load_state_dict(state[name])


def build_inner_optimizer(
    model: nn.Module,
    *,
    name: str = "adamw",
    lr: float,
    weight_decay: float = 0.1,
    betas: tuple[float, float] = (0.9, 0.99),
    muon_momentum: float = 0.95,
    hidden: Callable[[str, torch.Tensor], bool] | None = None,
) -> torch.optim.Optimizer | CombinedOptimizer:
    """The inner optimizer called ``name`` for ``model``'s trainable parameters.

    ``"adamw"``: one ``torch.optim.AdamW``. ``"muon"``: ``torch.optim.Muon`` (Nesterov momentum
    ``muon_momentum``, AdamW-matched learning rate) on the hidden matrices and AdamW on the rest, as a
    :class:`CombinedOptimizer`; ``hidden(name, param)`` overrides which parameters are hidden matrices.
    """
    if name not in INNER_OPTIMIZERS:
        raise ConfigError(f"inner optimizer {name!r}: choose one of {', '.join(INNER_OPTIMIZERS)}")
    if name == "adamw":
        return torch.optim.AdamW(model.parameters(), lr=lr, betas=betas, weight_decay=weight_decay)
    muon_cls = getattr(torch.optim, "Muon", None)
    if muon_cls is None:
        raise ConfigError(
            f"inner_optimizer='muon' needs torch.optim.Muon (PyTorch >= 2.9); this is torch "
            f"{torch.__version__}: upgrade torch or use inner_optimizer='adamw'"
        )
    matrices, rest = split_parameters(model, hidden=hidden)
    if not matrices:
        raise ConfigError(
            "inner_optimizer='muon' found no 2-D hidden matrices in this model (embeddings, head, "
            "norms and biases stay on AdamW); use inner_optimizer='adamw' or pass hidden="
        )
    parts: dict[str, torch.optim.Optimizer] = {
        "muon": muon_cls(
            matrices,
            lr=lr,
            weight_decay=weight_decay,
            momentum=muon_momentum,
            nesterov=True,
            adjust_lr_fn="match_rms_adamw",
        ),
    }
    if rest:
        parts["adamw"] = torch.optim.AdamW(rest, lr=lr, betas=betas, weight_decay=weight_decay)
    return CombinedOptimizer(parts)


__all__ = ["CombinedOptimizer", "INNER_OPTIMIZERS", "build_inner_optimizer", "is_hidden_matrix", "split_parameters"]
