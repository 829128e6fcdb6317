"""scripts/stress_suite.py run as a user runs it, on one small test file: its table row holds pytest's counts and
seconds, and a mode's environment reaches the tests (``off``: the codecs' C loops are off in the run)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_stress_script_runs_a_mode_and_reads_pytests_closing_line(tmp_path):
    probe = tmp_path / "test_probe.py"
    probe.write_text(
        "import os\n\n"
        "def test_the_switch():\n"
        "    assert os.environ.get('DILOCO_NATIVE_CODECS') == '0'\n\n"
        "def test_skipped():\n"
        "    import pytest\n"
        "    pytest.skip('a skip, counted')\n"
    )
    logs = tmp_path / "logs"
    args = [sys.executable, "scripts/stress_suite.py", "--modes", "off", "--logs", str(logs), "--"]
    proc = subprocess.run([*args, str(probe), "-p", "no:cacheprovider"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (row,) = json.loads((logs / "stress-suite.json").read_text())["runs"]
    assert row["mode"] == "off" and row["rc"] == 0 and row["failed"] == []
    assert row["counts"] == {"passed": 1, "skipped": 1} and row["test_s"] >= 0
    assert "off: rc 0, 1 passed, 1 skipped" in proc.stdout
    shown = re.search(r"(\d+) min (\d\d) s of tests", proc.stdout)  # pytest's seconds, as whole minutes and seconds
    assert shown and 60 * int(shown[1]) + int(shown[2]) == round(row["test_s"]), (proc.stdout, row["test_s"])
