"""The demo's reading note: the papers' law at the run's size, its tokens per parameter, and where to look."""

from __future__ import annotations

import pytest

from diloco.scaling.paper_gap import RESULTS_PAGE, paper_law_gaps, reading_note
from diloco.scaling.records import paper_table4
from diloco.train.config import TrainConfig, load_preset


def test_the_law_reproduces_the_papers_own_gaps_where_it_was_fitted():
    table = paper_table4()
    for size, n, *losses in table["rows"]:
        loss = dict(zip(table["columns"][2:], losses, strict=True))
        measured = 100 * (loss["diloco-m2"] / loss["dp"] - 1)
        assert paper_law_gaps(n)[2] == pytest.approx(measured, abs=0.25), size  # residuals of a 2-parameter law


def test_the_law_widens_the_gap_as_n_shrinks():
    gaps = [paper_law_gaps(n)[2] for n in (2.4e9, 35e6, 1e6, 1e5)]
    assert gaps == sorted(gaps)


def test_the_demo_note_names_its_budget_the_laws_gaps_and_the_results_page():
    preset = load_preset("demo")
    rows = []
    for name, over in preset["methods"].items():
        cfg = TrainConfig.from_dict({**preset["base"], **over})
        rows.append(
            {
                "name": name,
                "config": cfg.to_dict(),
                "steps": cfg.total_steps,
                "tokens": cfg.total_steps * cfg.tokens_per_step,
            }
        )
    note = reading_note(rows)
    n = 2 * 128 * 128 * 4 * 5 + 4 * 128 * 128 * 5  # 5 blocks of attention (4 d^2) and MLP (2 x d x 4d) ...
    n += 2 * 128 * 5 + 128  # ... plus their two norm scales each and the final norm
    gaps = paper_law_gaps(n)
    assert f"this run trains {480 * 16 * 128 / n:.2f} tokens per parameter" in note
    assert f"N = {n / 1e6:.2f}M" in note and f"{480 // preset['base']['sync_every']} outer steps" in note
    assert f"M = 1 {gaps[1]:+.2f} %, M = 2 {gaps[2]:+.2f} %" in note
    assert RESULTS_PAGE in note and "20 tokens per parameter" in note
