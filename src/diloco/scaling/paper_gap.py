"""What the papers' scaling law predicts for a comparison's gaps, so a short run's gaps are read correctly.

The scaling-laws paper (arXiv 2503.09799) fits a power law with an offset per method, L(N) = A N^-a + C,
to its Table 4 (35M to 2.4B parameters, every run at 20 tokens per parameter). :func:`paper_law_gaps`
fits those laws (the same fit as ``diloco fit --paper-table4``) and gives DiLoCo's predicted gap to
data-parallel at a size N: an extrapolation for the CPU sizes, and only at the papers' budget of 20
tokens per parameter (the laws have no budget term of their own; Chinchilla's data term, which
``diloco fit --tokens`` applies, moves every method's loss by the same factor, so it leaves the ratio
unchanged). A run that trains far fewer tokens per parameter shows larger gaps than the law.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

from diloco.errors import ConfigError
from diloco.outer_steps import outer_steps

#: The papers' token budget, at which every run of their Table 4 was trained.
PAPER_TOKENS_PER_PARAM = 20

#: Where this project's runs at the papers' budget are reported (docs site page).
RESULTS_PAGE = "docs/results/index.md"


@lru_cache(maxsize=1)
def _paper_fit():
    from diloco.scaling.fit import fit_scaling
    from diloco.scaling.records import paper_table4_records

    return fit_scaling(paper_table4_records(), alternatives=())


def paper_law_gaps(num_params: float, *, replicas: Sequence[int] = (1, 2)) -> dict[int, float]:
    """DiLoCo's loss over data-parallel's, minus 1, in %, per M, at ``num_params`` (non-embedding) parameters."""
    if not num_params > 0:
        raise ConfigError(f"num_params={num_params!r}: give a positive parameter count")
    fit = _paper_fit()
    dp = fit.predict(num_params, method="dp").loss
    return {m: 100.0 * (fit.predict(num_params, method="diloco", replicas=m).loss / dp - 1.0) for m in replicas}


def reading_note(rows: Sequence[Mapping[str, Any]]) -> str:
    """Lines printed under a comparison's table: the run's tokens per parameter, the law's gaps, where to look next.

    ``rows``: :func:`diloco.compare.run_compare`'s, each with ``config``, ``steps`` and ``tokens``.
    """
    from diloco.models.sizes import make_config
    from diloco.models.transformer import count_params

    cfg = rows[0]["config"]
    if cfg.get("model"):
        return ""  # the law is about the project's transformer family; a user's model has its own N
    n = count_params(make_config(cfg["size"], vocab_size=cfg["vocab_size"], seq_len=cfg["seq_len"]), embeddings=False)
    tokens = max(int(r.get("tokens") or 0) for r in rows)
    outer = max(
        (
            outer_steps(total_steps=r["steps"], sync_every=r["config"]["sync_every"])
            for r in rows
            if r["config"]["method"] != "dp"
        ),
        default=0,
    )
    gaps = paper_law_gaps(n)
    law = ", ".join(f"M = {m} {g:+.2f} %" for m, g in gaps.items())
    return (
        f"How to read the gaps: this run trains {tokens / n:.2f} tokens per parameter (N = {n / 1e6:.2f}M "
        f"non-embedding){f', {outer} outer steps' if outer else ''}. The papers' scaling law (fitted to their "
        f"Table 4, 35M-2.4B parameters at {PAPER_TOKENS_PER_PARAM} tokens per parameter, extrapolated to this N) "
        f"predicts DiLoCo at {law} against data-parallel at {PAPER_TOKENS_PER_PARAM} tokens per parameter; "
        f"at fewer tokens per parameter every gap is larger (it shrinks with each doubling of the budget). "
        f"This project's runs at {PAPER_TOKENS_PER_PARAM} tokens per parameter: {RESULTS_PAGE}."
    )


__all__ = ["PAPER_TOKENS_PER_PARAM", "RESULTS_PAGE", "paper_law_gaps", "reading_note"]
