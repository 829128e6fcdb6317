"""What a run trains on and trains: its data and its model, prepared and checked before anything is written.

:func:`prepare_inputs` resolves the config's sources (bundled corpus, your text, token files,
your tokenizer: :func:`diloco.data.prepare_data`), builds the validation batches, checks that each
replica's shard holds at least one batch, builds the seeded model (:func:`diloco.models.factory.build_model`)
and splits it into the run's fragments. Every problem is a ``ValueError`` naming the value and the
fix, raised before the run directory is created or touched (the tokenizer and token caches live
in the cache directory, keyed by content).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from diloco.errors import ConfigError

__all__ = ["Inputs", "check_ids_fit", "prepare_inputs", "run_fragments", "run_tokenizer"]


@dataclass
class Inputs:
    data: Any  # diloco.data.TokenData
    val_batches: list[tuple[torch.Tensor, torch.Tensor]]
    model: nn.Module  # the seeded template every replica copies
    fragments: list[list[str]] | None  # explicit fragments (parameter names), or None: the fragmenter's split


def run_fragments(cfg: Any, model: nn.Module) -> list[list[str]] | None:
    """The fragments the config asks for (``cfg.fragments`` prefixes), checked against the model.

    ``None`` means "let the fragmenter split the blocks"; either way the split is tried here, so a model
    whose blocks cannot be found for P > 1 fails now, with a message saying how to pass fragments.
    """
    from diloco.algorithm.fragments import fragments_from_prefixes, split_fragments

    if cfg.method == "dp":
        return None
    groups = fragments_from_prefixes(model, list(cfg.fragments)) if cfg.fragments else None
    if groups is not None and len(groups) != cfg.num_fragments:
        raise ConfigError(
            f"fragments={list(cfg.fragments)} names {len(groups)} fragments but num_fragments="
            f"{cfg.num_fragments}; give one comma-separated group per fragment or set "
            f"num_fragments={len(groups)}"
        )
    split_fragments(model, cfg.num_fragments, pattern=cfg.fragment_pattern, fragments=groups)
    return groups


def run_tokenizer(cfg: Any) -> tuple[str | None, Path | None]:
    """The tokenizer.json the run's text is tokenized with, and the model folder's own tokenizer.json.

    A pretrained ``hf:`` folder's tokenizer is the default (``cfg.tokenizer`` overrides it). Text on
    pretrained weights without a tokenizer is refused: a BPE trained here would give ids that mean
    nothing to the model's embeddings.
    """
    from diloco.data.sources import are_token_files
    from diloco.models.hf import folder_tokenizer, has_weights

    spec = cfg.model[3:] if cfg.model.startswith("hf:") else None
    own = folder_tokenizer(spec) if spec else None
    if are_token_files(cfg.sources):
        return None, own
    if cfg.tokenizer:
        return cfg.tokenizer, own
    if own is None and spec and has_weights(spec):
        raise ConfigError(
            f"model=hf:{spec} has pretrained weights but no tokenizer.json, and tokenizer is not set: "
            f"a tokenizer trained here would give ids that mean nothing to its embeddings. Put the "
            f"model's tokenizer.json in {spec} or set tokenizer=PATH (or train on token files made "
            f"with its tokenizer)"
        )
    return (str(own) if own else None), own


def check_ids_fit(data: Any, tokenizer_file: Path) -> None:
    """Token files trained with a model that has its own tokenizer: every id must be one of its tokens."""
    from tokenizers import Tokenizer

    size = Tokenizer.from_file(str(tokenizer_file)).get_vocab_size()
    top = max((int(a.max()) for a in (data.train, data.val) if a.size), default=-1)
    if top >= size:
        raise ConfigError(
            f"the token files hold id {top} but the model's tokenizer ({tokenizer_file}) has only "
            f"{size} tokens: these ids were not made by it. Tokenize the text with that tokenizer "
            f"(or train on the text itself: it is then tokenized with it)"
        )


def run_data(cfg: Any, cache_dir: Path | str) -> tuple[Any, Any]:
    """The token data of a run (a TrainConfig ``cfg``: its train and validation splits, tokenized as the run
    tokenizes them) and the model's own tokenizer, if it has one (``run_tokenizer``)."""
    from diloco.data import prepare_data

    tokenizer, model_tokenizer = run_tokenizer(cfg)
    data = prepare_data(
        cfg.sources,
        vocab_size=cfg.vocab_size,
        cache_dir=cache_dir,
        val_fraction=cfg.val_fraction,
        tokenizer=tokenizer,
        eod_token=cfg.eod_token or None,
        token_dtype=cfg.token_dtype,
    )
    return data, model_tokenizer


def validation_batches(tokens: Any, cfg: Any) -> list[tuple[Any, Any]]:
    """The fixed validation batches of a run (a TrainConfig ``cfg``) from the validation split ``tokens``.

    With ``eval_sequences`` set, they hold the split's first ``eval_sequences`` windows whatever the global batch
    (in batches of the largest divisor of it up to ``global_batch``), so that runs of different batches are
    measured on the same text; else the first ``eval_batches`` batches of ``global_batch`` windows. Raises
    ConfigError where the split holds fewer windows than ``eval_sequences``."""
    from diloco.data import eval_batches

    n = cfg.eval_sequences
    if n <= 0:
        return list(
            eval_batches(tokens, batch_size=cfg.global_batch, seq_len=cfg.seq_len, max_batches=cfg.eval_batches)
        )
    windows = int(tokens.size) // (cfg.seq_len + 1)
    if windows < n:
        raise ConfigError(
            f"eval_sequences={n}: the validation split holds {windows} windows of seq_len+1={cfg.seq_len + 1} "
            f"tokens; lower eval_sequences to at most {windows} or raise val_fraction"
        )
    size = max(d for d in range(1, min(n, cfg.global_batch) + 1) if n % d == 0)
    return list(eval_batches(tokens, batch_size=size, seq_len=cfg.seq_len, max_batches=n // size))


def prepare_inputs(cfg: Any, cache_dir: Path | str) -> Inputs:
    """Data, validation batches, the seeded model and its fragments for ``cfg`` (a TrainConfig)."""
    from diloco.data import ShardSampler
    from diloco.models.factory import build_model, check_model
    from diloco.train.speed import unwrap_compiled

    check_model(cfg.model)  # a bad model string, config or factory fails before any data work
    data, model_tokenizer = run_data(cfg, cache_dir)
    if model_tokenizer is not None and data.tokenizer is None:  # token files beside a model with its tokenizer
        check_ids_fit(data, model_tokenizer)
    val = validation_batches(data.val, cfg)
    ShardSampler(
        data.train,
        rank=0,
        world_size=cfg.replicas,
        batch_size=cfg.batch_per_replica,
        seq_len=cfg.seq_len,
        seed=cfg.seed,
    )  # raises when a replica's shard holds less than one batch
    model = build_model(
        cfg.model, size=cfg.size, vocab_size=data.vocab_size, seq_len=cfg.seq_len, seed=cfg.seed, z_loss=cfg.z_loss
    )
    model = unwrap_compiled(model)  # a torch.compile wrapper's names carry `_orig_mod.`: use the module's own
    return Inputs(data, val, model, run_fragments(cfg, model))
