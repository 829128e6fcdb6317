"""A device this process cannot train on is refused up front: a ValueError (``diloco train: error: ...``,
exit 2) before ``--out`` is created or changed, instead of torch's AssertionError after ``config.json``
and an empty ``metrics.jsonl`` were written."""

from __future__ import annotations

import pytest
import torch

from diloco.cli import main as cli_main
from diloco.train.device import check_device


def _unusable_cuda() -> str:
    """A CUDA device this machine cannot use: any on a machine without one, else one past the last GPU."""
    return f"cuda:{torch.cuda.device_count()}" if torch.cuda.is_available() else "cuda"


def test_check_device_accepts_cpu_and_refuses_what_is_not_there():
    assert check_device("cpu") == torch.device("cpu")
    with pytest.raises(ValueError, match=r"--device 'gpu0' is not a torch device; use cpu, cuda or cuda:N"):
        check_device("gpu0")
    with pytest.raises(ValueError, match=r"--device cuda.*(built without CUDA|no GPU is visible|sees \d+ GPU)"):
        check_device(_unusable_cuda())


@pytest.mark.parametrize("where", ["absent", "holding a file"])
def test_train_on_an_unusable_cuda_device_writes_nothing(tmp_path, capsys, where):
    out = tmp_path / "run"
    if where == "holding a file":
        out.mkdir()
        (out / "notes.txt").write_text("mine")
    before = sorted(p.name for p in out.iterdir()) if out.exists() else None
    code = cli_main(
        [
            "train",
            "--preset",
            "tiny",
            "--out",
            str(out),
            "--cache-dir",
            str(tmp_path / "cache"),
            "--no-progress",
            "--set",
            "steps=2",
            "--device",
            _unusable_cuda(),
        ]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("diloco train: error: --device cuda") and "Traceback" not in err
    assert (sorted(p.name for p in out.iterdir()) if out.exists() else None) == before
    assert not (tmp_path / "cache").exists()


def test_compare_on_an_unusable_cuda_device_writes_nothing(tmp_path, capsys):
    out = tmp_path / "cmp"
    code = cli_main(
        [
            "compare",
            "--preset",
            "tiny",
            "--out",
            str(out),
            "--cache-dir",
            str(tmp_path / "cache"),
            "--no-progress",
            "--device",
            _unusable_cuda(),
        ]
    )
    assert code == 2 and capsys.readouterr().err.startswith("diloco compare: error: --device cuda")
    assert not out.exists()
