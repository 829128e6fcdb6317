"""Committed summaries against what a report recomputes: equal, floats to a stated relative tolerance.

A summary's floats come through least-squares fits (the papers' law, fitted with L-BFGS-B, and the power laws of
:mod:`diloco.scaling.laws`) and BLAS sums. L-BFGS-B stops once the projected gradient is below ``gtol = 1e-8`` on an
objective scaled to O(1) at its optimum, so a fitted coefficient lands within about 1e-8 relative of the same
optimum on another CPU (seen: 1.4e-8 between two AMD EPYC machines, 2e-8 between the machine that wrote a summary
and a 2-core CPU); the order of a vectorized sum moves the last bit or two (1e-16). ``RTOL = 1e-6`` leaves two
orders of margin over both and still catches any change to the records or to the report's reading of them: one
changed record moves a seed mean by 1e-4 or more. Everything that is not a float (counts, names, seeds, the
chosen settings) must be equal.
"""

from __future__ import annotations

import math
from typing import Any

RTOL = 1e-6
ATOL = 1e-12  # for values that are 0 on one machine and 1e-17 on another


def assert_tree_close(got: Any, want: Any, *, rtol: float = RTOL, path: str = "$") -> None:
    """``got == want`` for JSON-like trees, floats to ``rtol`` relative (``path`` names the first difference)."""
    if isinstance(got, float) and isinstance(want, float):
        ok = (math.isnan(got) and math.isnan(want)) or math.isclose(got, want, rel_tol=rtol, abs_tol=ATOL)
        assert ok, f"{path}: {got!r} != {want!r} (rtol {rtol:g})"
    elif isinstance(got, dict) and isinstance(want, dict):
        assert sorted(got) == sorted(want), f"{path}: keys {sorted(got)} != {sorted(want)}"
        for k in got:
            assert_tree_close(got[k], want[k], rtol=rtol, path=f"{path}.{k}")
    elif isinstance(got, list) and isinstance(want, list):
        assert len(got) == len(want), f"{path}: {len(got)} items != {len(want)}"
        for i, (x, y) in enumerate(zip(got, want)):
            assert_tree_close(x, y, rtol=rtol, path=f"{path}[{i}]")
    else:
        assert type(got) is type(want) and got == want, f"{path}: {got!r} != {want!r}"
