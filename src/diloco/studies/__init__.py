"""What the studies under ``studies/`` share with the tests and with each other: their grids, kept as one file per
study, and the code their scripts and the tests both read. A study's scripts stay in its folder and import this."""

from __future__ import annotations

from pathlib import Path

#: the study folders of a source checkout (the package is installed editable from it)
STUDIES = Path(__file__).resolve().parents[3] / "studies"
