"""The model family: a Chinchilla-style decoder-only transformer, its counts, and named sizes."""

from diloco.models.sizes import CPU_SIZES, PAPER_SIZES, SIZES, ModelShape, get_size, make_config
from diloco.models.transformer import (
    LossTerms,
    ModelConfig,
    Transformer,
    count_params,
    flops_per_token,
    lm_loss,
)

__all__ = [
    "CPU_SIZES",
    "PAPER_SIZES",
    "SIZES",
    "LossTerms",
    "ModelConfig",
    "ModelShape",
    "Transformer",
    "count_params",
    "flops_per_token",
    "get_size",
    "lm_loss",
    "make_config",
]
