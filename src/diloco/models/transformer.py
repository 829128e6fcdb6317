"""A Chinchilla-style decoder-only transformer, and its parameter and FLOP counts.

The architecture the Scaling Laws for DiLoCo paper names (Chinchilla-style, QK-LayerNorm, z-loss),
built the way its reference codebase (NanoDO) builds it, except that positions are rotary:

* pre-norm blocks ``x + attn(norm(x))`` then ``x + mlp(norm(x))``, a final norm before the head;
* LayerNorm with a learned scale and **no bias**, and no bias in any linear layer; no dropout;
* QK-LayerNorm: queries and keys are layer-normalised per head (over ``head_dim``) before the
  rotary rotation, which keeps attention logits bounded (Wortsman et al. 2023);
* a **GELU** MLP (tanh approximation, two matrices, hidden width ``d_mlp``, 4 x d_model in the
  papers' shapes) rather than SwiGLU: the papers' table gives one hidden width and NanoDO uses GELU;
* z-loss ``z_loss * mean(logsumexp(logits)^2)`` added to the mean cross-entropy, which keeps the
  softmax normaliser near 1 (PaLM; Wortsman et al.).

The repeated blocks live in ``Transformer.blocks`` (an ``nn.ModuleList``): the Streaming DiLoCo
fragmenter groups parameters by these blocks; embedding, final norm and head sit outside it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from diloco.errors import ConfigError


@dataclass(frozen=True)
class ModelConfig:
    """The shape of a :class:`Transformer`. Every field is validated on construction."""

    vocab_size: int
    seq_len: int  # the longest sequence the rotary tables cover; also the context of flops_per_token
    n_layers: int
    n_heads: int
    d_model: int
    d_mlp: int
    qk_norm: bool = True
    z_loss: float = 1e-4  # weight of the log-partition penalty; 0 disables it
    tie_embeddings: bool = False  # the output head reuses the token embedding matrix
    rope_base: float = 10_000.0
    init_std: float = 0.02

    def __post_init__(self) -> None:
        errors = [
            f"{f.name}={getattr(self, f.name)!r} must be a positive integer"
            for f in fields(self)
            if f.name in ("vocab_size", "seq_len", "n_layers", "n_heads", "d_model", "d_mlp")
            and not (isinstance(getattr(self, f.name), int) and getattr(self, f.name) > 0)
        ]
        if not errors:
            if self.d_model % self.n_heads:
                errors.append(
                    f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}: "
                    f"choose n_heads among the divisors of d_model"
                )
            elif self.head_dim % 2:
                errors.append(
                    f"head_dim = d_model / n_heads = {self.head_dim} is odd; rotary embeddings rotate "
                    f"pairs of features: choose n_heads so that d_model / n_heads is even"
                )
        if not (isinstance(self.z_loss, (int, float)) and math.isfinite(self.z_loss) and self.z_loss >= 0):
            errors.append(f"z_loss={self.z_loss!r} must be a finite number >= 0 (0 disables it)")
        if not (isinstance(self.rope_base, (int, float)) and self.rope_base > 1):
            errors.append(f"rope_base={self.rope_base!r} must be > 1 (10000 is usual)")
        if not (isinstance(self.init_std, (int, float)) and self.init_std > 0):
            errors.append(f"init_std={self.init_std!r} must be > 0 (0.02 is usual)")
        for name in ("qk_norm", "tie_embeddings"):
            if not isinstance(getattr(self, name), bool):
                errors.append(f"{name}={getattr(self, name)!r} must be True or False")
        if errors:
            raise ConfigError("invalid model config:\n  " + "\n  ".join(errors))

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads


class LossTerms(NamedTuple):
    """The training loss and its parts (all scalars): ``loss = ce + z``."""

    loss: torch.Tensor
    ce: torch.Tensor  # mean cross-entropy in nats: what evaluation reports
    z: torch.Tensor  # z_loss * mean(logsumexp(logits)^2); zero when z_loss == 0


def lm_loss(logits: torch.Tensor, targets: torch.Tensor, *, z_loss: float) -> LossTerms:
    """Mean next-token cross-entropy plus the z-loss, from one log-softmax.

    The log-partition needed by the z-loss comes for free: ``logsumexp(logits) = logits[t] -
    log_softmax(logits)[t]`` for any index t, so one fused log-softmax (forward and backward) over
    the vocabulary serves both terms; a separate ``logsumexp`` would cost ~35% more on CPU.
    Computed in FP32 whatever the logits' dtype.
    """
    logits = logits.float()
    idx = targets.unsqueeze(-1)
    target_logprob = F.log_softmax(logits, dim=-1).gather(-1, idx).squeeze(-1)
    ce = -target_logprob.mean()
    if not z_loss:
        return LossTerms(ce, ce, ce.new_zeros(()))
    lse = logits.gather(-1, idx).squeeze(-1) - target_logprob
    z = z_loss * lse.square().mean()
    return LossTerms(ce + z, ce, z)


def rotary_tables(seq_len: int, head_dim: int, base: float = 10_000.0) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of the rotary angles, each ``(seq_len, 1, head_dim // 2)`` (broadcast over heads)."""
    inv_freq = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float64), inv_freq)
    return angles.cos().float().unsqueeze(1), angles.sin().float().unsqueeze(1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate feature pairs (i, i + head_dim/2) of ``x`` (B, T, H, head_dim) by position-dependent angles."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.n_heads, self.head_dim = cfg.n_heads, cfg.head_dim
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=False)  # one matmul for q, k and v
        norm = (lambda: nn.LayerNorm(cfg.head_dim, bias=False)) if cfg.qk_norm else nn.Identity
        self.q_norm, self.k_norm = norm(), norm()
        self.out = nn.Linear(cfg.d_model, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        B, T, D = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.n_heads, self.head_dim).unbind(2)
        # Under autocast the norms may run in FP32; SDPA needs one dtype for q, k and v.
        q = apply_rotary(self.q_norm(q), cos, sin).to(v.dtype)
        k = apply_rotary(self.k_norm(k), cos, sin).to(v.dtype)
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        return self.out(y.transpose(1, 2).reshape(B, T, D))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.fc = nn.Linear(cfg.d_model, cfg.d_mlp, bias=False)
        self.proj = nn.Linear(cfg.d_mlp, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.attn_norm = nn.LayerNorm(cfg.d_model, bias=False)
        self.attn = Attention(cfg)
        self.mlp_norm = nn.LayerNorm(cfg.d_model, bias=False)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), cos, sin)
        return x + self.mlp(self.mlp_norm(x))


class Transformer(nn.Module):
    """Decoder-only language model: ``forward(idx, targets) -> (logits, loss)``.

    ``loss`` is mean cross-entropy plus the z-loss term (``None`` without targets); use
    :meth:`loss_terms` for the plain cross-entropy. Initialisation draws from torch's global RNG in a
    fixed order, so ``torch.manual_seed(s); Transformer(cfg)`` is reproducible.
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        if not isinstance(config, ModelConfig):
            raise ConfigError(
                f"Transformer needs a ModelConfig, got {type(config).__name__}: "
                f"build one with diloco.models.make_config(size, vocab_size=..., seq_len=...)"
            )
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layers))
        self.norm = nn.LayerNorm(config.d_model, bias=False)
        self.head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.head.weight = self.embed.weight
        cos, sin = rotary_tables(config.seq_len, config.head_dim, config.rope_base)
        # Not persistent: derived from the config, so checkpoints and parameter counts leave them out.
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """N(0, init_std) for matrices; residual-branch outputs scaled by 1/sqrt(2 n_layers) (GPT-2) so
        the residual stream's variance does not grow with depth; norm scales 1."""
        std = self.config.init_std
        for name, p in self.named_parameters():
            if p.ndim == 1:
                nn.init.ones_(p)
            elif name.endswith(("attn.out.weight", "mlp.proj.weight")):
                nn.init.normal_(p, std=std / math.sqrt(2 * self.config.n_layers))
            else:
                nn.init.normal_(p, std=std)

    def logits(self, idx: torch.Tensor) -> torch.Tensor:
        """Next-token logits ``(B, T, vocab_size)`` for token ids ``idx`` ``(B, T)``."""
        T = idx.shape[1]
        if T > self.config.seq_len:
            raise ConfigError(
                f"sequence length {T} exceeds the model's seq_len={self.config.seq_len}: "
                f"build the model with a larger seq_len or feed shorter sequences"
            )
        cos, sin = self.rope_cos[:T], self.rope_sin[:T]
        x = self.embed(idx)
        for block in self.blocks:
            x = block(x, cos, sin)
        return self.head(self.norm(x))

    def loss_terms(self, idx: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, LossTerms]:
        """``(logits, LossTerms(loss, ce, z))``: the loss that is trained and its parts."""
        logits = self.logits(idx)
        return logits, lm_loss(logits, targets, z_loss=self.config.z_loss)

    def forward(
        self, idx: torch.Tensor, targets: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        if targets is None:
            return self.logits(idx), None
        logits, terms = self.loss_terms(idx, targets)
        return logits, terms.loss


# ----------------------------------------------------------------------------------------------
# Counting from the config alone (no module built): the papers' shapes have up to 10B parameters.


def _block_params(cfg: ModelConfig) -> tuple[int, int]:
    """(matrix weights, norm scales) of one block."""
    d = cfg.d_model
    matrices = 4 * d * d + 2 * d * cfg.d_mlp  # qkv (3d^2) + out (d^2) + fc + proj
    norms = 2 * d + (2 * cfg.head_dim if cfg.qk_norm else 0)
    return matrices, norms


def count_params(config: ModelConfig, *, embeddings: bool = True) -> int:
    """Number of trainable parameters of ``Transformer(config)``.

    ``embeddings=False`` gives the non-embedding count (Kaplan et al.'s N): everything except the
    token embedding and the output head (both vocab_size x d_model), i.e. the blocks and the final
    norm. A tied head is counted once.
    """
    matrices, norms = _block_params(config)
    n = config.n_layers * (matrices + norms) + config.d_model
    if embeddings:
        n += config.vocab_size * config.d_model * (1 if config.tie_embeddings else 2)
    return n


def flops_per_token(config: ModelConfig, *, training: bool = True, attention: bool = True) -> int:
    """Matmul FLOPs per token (a multiply-add is 2 FLOPs), Kaplan et al.'s convention.

    Forward = 2 x (weights of every matrix multiplied: the blocks' four matrices and the output head;
    the embedding is a lookup) + 2 x n_layers x seq_len x d_model for attention. The attention term is
    the exact count of QK^T and AV under the causal mask, averaged over positions (position t attends
    t keys: 2 t d + 2 t d FLOPs, mean over t ~ 2 seq_len d). Norms, GELU, softmax and rotary are
    elementwise and left out (under 1% at these widths). ``training`` = 3 x forward: the backward
    pass computes gradients for inputs and for weights, each as costly as the forward.
    """
    matrices, _ = _block_params(config)
    fwd = 2 * (config.n_layers * matrices + config.vocab_size * config.d_model)
    if attention:
        fwd += 2 * config.n_layers * config.seq_len * config.d_model
    return 3 * fwd if training else fwd
