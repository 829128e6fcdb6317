"""Named model sizes: the papers' shapes, CPU-scale shapes that train here in minutes, and "tiny".

The papers' shapes are Scaling Laws for DiLoCo, Table 3 (vocab 32,768, seq 2,048). Their names
match ``count_params(config)`` with a **tied** embedding (non-embedding parameters plus one
vocab x d_model matrix), which is how their reference code (NanoDO) builds the model, so these
shapes set ``tie_embeddings=True``: e.g. "35M" has 18.9M non-embedding + 16.8M embedding = 35.7M.

CPU sizes are named by their NON-embedding parameter count (the part that scales the way the
laws say); their vocabulary and sequence length come from the data, so ``make_config`` takes them:

    make_config("cpu-1m", vocab_size=4096, seq_len=128)
    make_config("1.3B")                      # the paper's vocab and seq_len
    make_config("cpu-3m", vocab_size=8192, seq_len=256, z_loss=0.0)
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from diloco.errors import ConfigError
from diloco.models.transformer import ModelConfig


@dataclass(frozen=True)
class ModelShape:
    """A model's shape without (or with default) vocabulary and sequence length."""

    n_layers: int
    n_heads: int
    d_model: int
    d_mlp: int
    vocab_size: int | None = None  # None: the caller's data decides
    seq_len: int | None = None
    tie_embeddings: bool = False


def _paper(n_layers: int, n_heads: int, d_model: int) -> ModelShape:
    return ModelShape(n_layers, n_heads, d_model, 4 * d_model, vocab_size=32_768, seq_len=2_048, tie_embeddings=True)


def _cpu(n_layers: int, n_heads: int, d_model: int) -> ModelShape:
    return ModelShape(n_layers, n_heads, d_model, 4 * d_model)


#: Every named size. Papers' rows: (layers, heads, d_model), MLP hidden = 4 d_model, head_dim 64.
#: CPU rows use head_dim 16-32 and are deeper than the papers' aspect ratio (d_model / layers ~ 85)
#: would give, so that Streaming DiLoCo has several blocks to split into fragments.
SIZES: dict[str, ModelShape] = {
    "35M": _paper(6, 8, 512),
    "90M": _paper(9, 12, 768),
    "180M": _paper(12, 16, 1024),
    "330M": _paper(15, 20, 1280),
    "550M": _paper(18, 24, 1536),
    "1.3B": _paper(24, 32, 2048),
    "2.4B": _paper(30, 40, 2560),
    "4B": _paper(36, 48, 3072),
    "10B": _paper(48, 64, 4096),
    "cpu-25k": _cpu(2, 2, 32),  # 24.8k; cpu-25k .. cpu-0.2m: the laptop scaling study's x2 ladder
    "cpu-50k": _cpu(4, 2, 32),  # 49.6k
    "cpu-0.1m": _cpu(5, 2, 40),  # 96.6k
    "cpu-0.2m": _cpu(4, 4, 64),  # 0.20M
    "cpu-0.25m": _cpu(5, 4, 64),  # 0.25M non-embedding
    "cpu-1m": _cpu(5, 4, 128),  # 0.99M
    "cpu-3m": _cpu(7, 6, 192),  # 3.10M
    "cpu-10m": _cpu(8, 10, 320),  # 9.84M
    "tiny": _cpu(3, 2, 32),  # 37k: unit tests, builds and steps in milliseconds
}

#: The papers' sizes in increasing order (the scaling-law ladder).
PAPER_SIZES: tuple[str, ...] = ("35M", "90M", "180M", "330M", "550M", "1.3B", "2.4B", "4B", "10B")
#: The sizes that train on a CPU in minutes, in increasing order.
CPU_SIZES: tuple[str, ...] = ("cpu-25k", "cpu-50k", "cpu-0.1m", "cpu-0.2m", "cpu-0.25m", "cpu-1m", "cpu-3m", "cpu-10m")


def get_size(name: str) -> ModelShape:
    """The shape named ``name`` (case-insensitive: "1.3b" and "1.3B" are the same size)."""
    if name in SIZES:
        return SIZES[name]
    by_lower = {k.lower(): v for k, v in SIZES.items()}
    if isinstance(name, str) and name.lower() in by_lower:
        return by_lower[name.lower()]
    raise ConfigError(f"unknown model size {name!r}: choose one of {', '.join(SIZES)}")


def size_blocks(name: str) -> tuple[int | None, list[str]]:
    """The blocks of size ``name`` and the config's messages: ``(n_layers, [])``, or ``(None, [what to choose])``."""
    try:
        return get_size(name).n_layers, []
    except ValueError:
        return None, [f"size={name!r}: choose one of {', '.join(SIZES)}"]


def make_config(
    size_name: str, *, vocab_size: int | None = None, seq_len: int | None = None, **overrides: Any
) -> ModelConfig:
    """A validated :class:`ModelConfig` of the named size.

    ``vocab_size`` and ``seq_len`` are required for sizes that do not fix them (the CPU sizes and
    "tiny"); for the papers' sizes they default to 32,768 and 2,048. ``overrides`` set any other
    ``ModelConfig`` field (``z_loss=0.0``, ``qk_norm=False``, ``n_layers=4``, ...).
    """
    shape = get_size(size_name)
    valid = {f.name for f in fields(ModelConfig)} - {"vocab_size", "seq_len"}
    unknown = sorted(set(overrides) - valid)
    if unknown:
        raise ConfigError(f"unknown ModelConfig field(s) {unknown}: valid overrides are {', '.join(sorted(valid))}")
    vocab_size = shape.vocab_size if vocab_size is None else vocab_size
    seq_len = shape.seq_len if seq_len is None else seq_len
    missing = [n for n, v in (("vocab_size", vocab_size), ("seq_len", seq_len)) if v is None]
    if missing:
        raise ConfigError(
            f"size {size_name!r} takes {' and '.join(missing)} from the data: pass "
            f"make_config({size_name!r}, vocab_size=..., seq_len=...) "
            f"(e.g. the tokenizer's vocab size and the training sequence length)"
        )
    base = dict(
        n_layers=shape.n_layers,
        n_heads=shape.n_heads,
        d_model=shape.d_model,
        d_mlp=shape.d_mlp,
        tie_embeddings=shape.tie_embeddings,
    )
    return ModelConfig(vocab_size=vocab_size, seq_len=seq_len, **(base | overrides))
