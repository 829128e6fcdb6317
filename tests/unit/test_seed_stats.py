"""diloco.seed_stats against closed forms: the standard error of a mean (s / sqrt n) and Welch's error of a
difference of two means (sqrt(s_a^2/n_a + s_b^2/n_b))."""

from __future__ import annotations

import math

import pytest

from diloco.seed_stats import difference_se, mean_se


def test_the_mean_and_its_standard_error():
    assert mean_se([1.0, 2.0, 3.0]) == (2.0, pytest.approx(1 / math.sqrt(3)))  # s = 1
    assert mean_se([4.0, 4.0]) == (4.0, 0.0)
    assert mean_se([5.5]) == (5.5, None)  # one seed: no error


def test_the_difference_of_two_means_and_welchs_error():
    a, b = [1.0, 2.0, 3.0], [0.0, 2.0]  # s_a^2 = 1 (n 3), s_b^2 = 2 (n 2)
    diff, se = difference_se(a, b)
    assert diff == pytest.approx(1.0) and se == pytest.approx(math.sqrt(1 / 3 + 2 / 2))
    assert difference_se(a, [7.0]) == (pytest.approx(-5.0), None)
