"""The examples run as written (fast settings), on the user's kind of model and data."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_own_loop_example_trains_your_model_on_your_text(tmp_path):
    text = tmp_path / "notes"
    text.mkdir()
    # the user's own text files: here this repository's README and design docs
    for src in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))[:3]]:
        (text / src.name).write_bytes(src.read_bytes())
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / "own_loop.py"),
            "--text",
            str(text),
            "--steps",
            "60",
            "--sync-every",
            "10",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    m = re.search(
        r"held-out loss of the global model: ([\d.]+) nats/byte \(uniform guess: ([\d.]+)\); "
        r"sent (\d+) bytes/replica",
        proc.stdout,
    )
    assert m, proc.stdout
    val_loss, uniform, sent = float(m[1]), float(m[2]), int(m[3])
    assert val_loss < 0.75 * uniform  # it learned something about the text
    assert sent > 0  # and the replicas exchanged outer gradients
