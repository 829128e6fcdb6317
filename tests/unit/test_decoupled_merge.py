"""Decoupled DiLoCo's pure parts against closed forms: token weights, RDA, mean, grace window, packing."""

from __future__ import annotations

import math

import pytest
import torch
from _tiny import make_model
from torch.testing import assert_close

from diloco.algorithm.fragments import balanced_groups, split_fragments
from diloco.decoupled.grace import GraceWindow, check_grace, ema, grace_seconds
from diloco.decoupled.merge import (
    check_merge,
    merge_outer_gradients,
    radial_directional_average,
    token_weights,
    weighted_mean,
)


def test_token_weights_closed_form():
    # w = c_tok^2 / c_steps: (100^2/10, 100^2/20, 50^2/10) = (1000, 500, 250) -> / 1750
    assert token_weights([10, 20, 10], [100, 100, 50]) == pytest.approx([1000 / 1750, 500 / 1750, 250 / 1750])
    # equal batches, equal steps: equal weights; more steps at the same batch size weigh more
    assert token_weights([4, 4], [32, 32]) == [0.5, 0.5]
    w = token_weights([2, 6], [16, 48])  # 16^2/2 = 128, 48^2/6 = 384
    assert w == pytest.approx([0.25, 0.75])


def test_learner_with_no_steps_has_weight_zero():
    assert token_weights([0, 5], [0, 10]) == [0.0, 1.0]
    assert token_weights([0, 0], [0, 0]) == [0.0, 0.0]


def test_rda_keeps_the_norm_of_orthogonal_equal_norm_deltas_and_the_mean_shrinks_it():
    M, n, r = 4, 16, 3.0
    deltas = [r * torch.eye(n)[m] for m in range(M)]  # orthogonal, norm r each
    w = [1.0 / M] * M
    rda = radial_directional_average(deltas, w)
    mean = weighted_mean(deltas, w)
    assert float(rda.norm()) == pytest.approx(r, rel=1e-6)
    assert float(mean.norm()) == pytest.approx(r / math.sqrt(M), rel=1e-6)
    # same direction: RDA is the mean rescaled to the mean norm
    assert_close(rda, mean * math.sqrt(M))


def test_rda_of_parallel_deltas_is_the_weighted_mean_and_unit_of_zero_is_zero():
    d = torch.tensor([1.0, -2.0, 2.0])
    assert_close(radial_directional_average([d, 2 * d], [0.5, 0.5]), 1.5 * d)
    assert_close(radial_directional_average([d, torch.zeros(3)], [0.5, 0.5]), 0.5 * d)
    assert_close(radial_directional_average([torch.zeros(3)], [1.0]), torch.zeros(3))


def test_weighted_mean_closed_form_and_equal_weights_sum_in_order():
    a, b = torch.tensor([1.0, 0.0]), torch.tensor([0.0, 4.0])
    assert_close(weighted_mean([a, b], [0.25, 0.75]), torch.tensor([0.25, 3.0]))
    xs = [torch.randn(100, generator=torch.Generator().manual_seed(i)) for i in range(3)]
    expected = xs[0].clone().add_(xs[1]).add_(xs[2]).div_(3)
    assert torch.equal(weighted_mean(xs, [1 / 3] * 3), expected)  # bit for bit: the synchronous average


def test_merge_is_per_tensor_with_the_mean_for_embeddings():
    # two tensors of 2 values; the first an embedding (mean), the second RDA'd
    d1 = torch.tensor([2.0, 0.0, 2.0, 0.0])
    d2 = torch.tensor([0.0, 2.0, 0.0, 2.0])
    out = merge_outer_gradients([d1, d2], [0.5, 0.5], sizes=[2, 2], embedding=[True, False], merge="rda")
    assert_close(out[:2], torch.tensor([1.0, 1.0]))  # mean: norm sqrt(2)
    assert_close(out[2:], torch.tensor([math.sqrt(2), math.sqrt(2)]))  # RDA: norm 2 kept
    mean = merge_outer_gradients([d1, d2], [0.5, 0.5], sizes=[2, 2], embedding=[True, False], merge="mean")
    assert_close(mean, torch.tensor([1.0, 1.0, 1.0, 1.0]))
    # a learner of weight 0 takes no part
    assert_close(merge_outer_gradients([d1, d2], [1.0, 0.0], sizes=[2, 2], embedding=[True, False]), d1)


def test_unknown_merge_names_the_choices():
    with pytest.raises(ValueError, match="merge='median'.*'rda'.*'mean'"):
        check_merge("median")


def test_grace_window_closed_form_and_emas():
    window = grace_seconds(gamma=0.2, overlap_steps=2, step_time=1.0, quorum_time=0.3, sync_time=0.2)
    assert window == pytest.approx(0.3)  # 0.2 x (2 x 1.0 - 0.3 - 0.2)
    assert grace_seconds(gamma=0.2, overlap_steps=1, step_time=0.1, quorum_time=1.0, sync_time=0.0) == 0.0
    assert ema(None, 5.0, decay=0.9) == 5.0 and ema(5.0, 15.0, decay=0.9) == pytest.approx(6.0)
    g = GraceWindow(gamma=0.5, overlap_steps=2)
    assert g.seconds() == 0.0  # nothing measured yet
    g.observe(step_time=1.0, quorum_time=0.5, sync_time=0.5)
    assert g.seconds() == pytest.approx(0.5)


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(gamma=-0.1, decay=0.9, overlap_steps=1), "grace_gamma=-0.1"),
        (dict(gamma=1.0, decay=0.9, overlap_steps=1), "grace_gamma=1.0"),
        (dict(gamma=0.2, decay=0.9, overlap_steps=-1), "tau >= 0"),
        (dict(gamma=0.2, decay=1.5, overlap_steps=1), "grace_ema_decay=1.5"),
    ],
)
def test_grace_settings_that_cannot_fit_are_refused(kw, match):
    with pytest.raises(ValueError, match=match):
        check_grace(**kw)


def test_balanced_packing_largest_first_into_the_lightest():
    # sizes 10, 7, 6, 5, 1 into 2: 10 -> A, 7 -> B, 6 -> B (7 < 10), 5 -> A (10 < 13), 1 -> B (13 < 15)
    assert balanced_groups([10, 7, 6, 5, 1], 2) == [[0, 3], [1, 2, 4]]
    with pytest.raises(ValueError, match="num_fragments=6"):
        balanced_groups([1, 2, 3], 6)


def test_balanced_pattern_splits_a_model_by_whole_tensors():
    model = make_model()
    frags = split_fragments(model, 3, pattern="balanced")
    assert sorted(n for f in frags for n in f.names) == sorted(n for n, _ in model.named_parameters())
    sizes = [f.numel for f in frags]
    largest = max(p.numel() for p in model.parameters())
    assert max(sizes) - min(sizes) <= largest  # greedy packing's bound
