"""Fixtures shared by the whole test session."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def token_cache(tmp_path_factory) -> Path:
    """One tokenizer and token cache for the session (the tiny preset's, built here once).

    Every test that trains on the bundled corpus passes it as ``cache_dir``, so no test
    rebuilds a tokenizer another one already built (a build takes seconds to minutes).
    """
    from diloco.data import prepare_tokens
    from diloco.train.config import TrainConfig, load_preset

    cfg = TrainConfig.from_dict(load_preset("tiny")["base"])
    path = tmp_path_factory.mktemp("token-cache")
    prepare_tokens(cfg.sources, cfg.vocab_size, path, val_fraction=cfg.val_fraction)
    return path
