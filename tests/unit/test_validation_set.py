"""A run's validation set (:func:`diloco.train.inputs.validation_batches`): with ``eval_sequences`` the same
windows at every global batch."""

from __future__ import annotations

import numpy as np
import pytest
import torch


def arange_tokens(n: int) -> np.ndarray:
    return np.arange(n, dtype=np.int64)


def test_eval_sequences_give_every_global_batch_the_same_validation_windows():
    from types import SimpleNamespace

    from diloco.errors import ConfigError
    from diloco.train.inputs import validation_batches

    def windows(**cfg):
        batches = validation_batches(arange_tokens(1000), SimpleNamespace(seq_len=9, eval_batches=2, **cfg))
        return torch.cat([x for x, _ in batches]), {len(x) for x, _ in batches}

    # without it the set follows the batch: 2 batches of 3 windows, or of 8
    assert (
        len(windows(global_batch=3, eval_sequences=0)[0]) == 6
        and len(windows(global_batch=8, eval_sequences=0)[0]) == 16
    )
    same, sizes = windows(global_batch=8, eval_sequences=24)
    assert torch.equal(same, torch.arange(240).view(24, 10)[:, :9]) and sizes == {8}
    for batch, size in ((1, 1), (3, 3), (5, 4), (64, 24)):  # batches of the largest divisor of 24 up to the batch
        got, sizes = windows(global_batch=batch, eval_sequences=24)
        assert torch.equal(got, same) and sizes == {size}, batch
    with pytest.raises(ConfigError, match="eval_sequences=120: the validation split holds 100 windows .* at most 100"):
        windows(global_batch=8, eval_sequences=120)
