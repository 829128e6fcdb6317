"""Statistics over seeds, as the studies and benchmarks report them: a mean with its standard error, and the
difference of two means with its standard error (unpaired: the two errors in quadrature, Welch's
sqrt(s_a^2/n_a + s_b^2/n_b)). An error needs two values on each side it is taken from; with fewer it is None."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence


def mean_se(xs: Sequence[float]) -> tuple[float, float | None]:
    """The mean of ``xs`` and its standard error (sample s.d. / sqrt n; None for a single value)."""
    mean = statistics.fmean(xs)
    return mean, (statistics.stdev(xs) / math.sqrt(len(xs)) if len(xs) > 1 else None)


def difference_se(a: Sequence[float], b: Sequence[float]) -> tuple[float, float | None]:
    """mean(a) - mean(b) and its standard error (the two means' errors in quadrature; None where either side has a
    single value)."""
    (ma, ea), (mb, eb) = mean_se(a), mean_se(b)
    return ma - mb, (None if ea is None or eb is None else math.hypot(ea, eb))


__all__ = ["difference_se", "mean_se"]
