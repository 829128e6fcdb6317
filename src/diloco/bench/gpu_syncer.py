"""The syncer phase of :mod:`diloco.bench.gpu_check`: Decoupled DiLoCo's merge with the syncer's state on the GPU
(``syncer_device=cuda``) beside the same merge on the CPU, as ``benchmarks/syncer_merge.py`` measures it.

It runs that benchmark in a subprocess on one fragment size and two learner counts (FP4 replies, RDA; on the GPU
16M values and M in {2, 8}; in the dry run its ``--quick`` grid on the CPU alone) and keeps, per device and M, the
merge's median time, its multiple of a memcpy on that device and the peak memory growth over the model, and per M
the CPU's time over the GPU's: what the planner's CPU figures (:mod:`diloco.sim.syncer_cost`) stand beside.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from diloco.bench import RESULTS_DIR

#: the checkout whose benchmarks and tests :mod:`diloco.bench.gpu_check` runs
ROOT = RESULTS_DIR.parents[1]
SCRIPT = ROOT / "benchmarks" / "syncer_merge.py"


def checkout_env() -> dict[str, str]:
    """This process's environment with this checkout's ``src`` first on ``PYTHONPATH`` (for a subprocess)."""
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")])),
    }


def syncer_args(*, dry_run: bool) -> list[str]:
    """The benchmark's arguments for this phase."""
    if dry_run:
        return ["--quick", "--no-grid", "--devices", "cpu", "--repeats", "2"]
    return ["--sizes", "16M", "--learners", "2,8", "--no-grid", "--devices", "cpu,cuda", "--repeats", "3"]


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The phase's result from the benchmark's rows: each (device, M) and the CPU / GPU ratio per M."""
    kept = [
        {
            "device": r["device"],
            "learners": r["learners"],
            "values": r["values"],
            "merge_s": r["merge_s_median"],
            "merge_over_memcpy": r["merge_over_memcpy"],
            "peak_growth_over_model": r.get("peak_growth_over_model"),
        }
        for r in rows
    ]
    by = {(r["device"], r["learners"], r["values"]): r["merge_s"] for r in kept}
    ratio = {
        f"M={m}, {n:,} values": by[("cpu", m, n)] / s
        for (dev, m, n), s in by.items()
        if dev == "cuda" and ("cpu", m, n) in by and s > 0
    }
    return {"rows": kept, "cpu_over_gpu": ratio}


def run_syncer(*, dry_run: bool, timeout_s: float = 240.0) -> dict[str, Any]:
    """Run the benchmark (a subprocess, this checkout's code first on the path) and summarize its rows."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "syncer_merge.json"
        cmd = [sys.executable, str(SCRIPT), *syncer_args(dry_run=dry_run), "--out", str(out)]
        proc = subprocess.run(cmd, cwd=ROOT, env=checkout_env(), capture_output=True, text=True, timeout=timeout_s)
        if proc.returncode != 0 or not out.exists():
            raise RuntimeError(f"syncer_merge.py exited {proc.returncode}: {proc.stderr[-800:]}")
        data = json.loads(out.read_text())
    return {
        "command": " ".join(["benchmarks/syncer_merge.py", *syncer_args(dry_run=dry_run)]),
        **summarize(data["rows"]),
    }


def syncer_line(phase: dict[str, Any]) -> str:
    """The phase in one line of the summary."""
    rows = ", ".join(
        f"{r['device']} M={r['learners']} {r['merge_s'] * 1e3:.0f} ms ({r['merge_over_memcpy']:.0f} memcpys)"
        for r in phase["rows"]
    )
    ratio = "; ".join(f"{k}: CPU / GPU {v:.1f}x" for k, v in phase["cpu_over_gpu"].items())
    return f"syncer merge (FP4, RDA): {rows}" + (f"; {ratio}" if ratio else "")


__all__ = ["ROOT", "checkout_env", "run_syncer", "summarize", "syncer_args", "syncer_line"]
