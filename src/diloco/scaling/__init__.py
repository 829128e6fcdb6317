"""Scaling laws for DiLoCo: resumable sweeps, robust power-law fits, held-out validation, reports.

sweep.py      GridSpec -> run configs -> run_sweep (one JSONL file, resumable)
synthetic.py  a known noisy law as a stand-in trainer (tests, demos)
laws.py       the parametric forms and their Huber fit in log space
records.py    the finished records a fit reads (checked), the paper's Table 4 as records
fit.py        best point per (method, N) -> every law, leave-largest-out: a ScalingFit
fitted.py     ScalingFit: its laws, predict(), its JSON and tables
report.py     PNG plots and a Markdown report
"""

from diloco.scaling.fit import best_points, fit_scaling
from diloco.scaling.fitted import ScalingFit
from diloco.scaling.laws import FORMS, FittedLaw, fit_law
from diloco.scaling.records import load_records, paper_table4_records
from diloco.scaling.sweep import RUNNERS, GridSpec, expand, read_results, register_runner, run_sweep

__all__ = [
    "FORMS",
    "FittedLaw",
    "GridSpec",
    "RUNNERS",
    "ScalingFit",
    "best_points",
    "expand",
    "fit_law",
    "fit_scaling",
    "load_records",
    "paper_table4_records",
    "read_results",
    "register_runner",
    "run_sweep",
]
