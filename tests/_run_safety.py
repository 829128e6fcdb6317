"""Helpers of the run-safety tests (tests/integration/test_run_safety.py, test_checkpoint_safety.py): the tiny
preset's config, a folder's bytes, the CLI's train command on it, strict JSON."""

from __future__ import annotations

import json
from pathlib import Path

from diloco.cli import main as cli_main
from diloco.train.config import TrainConfig, load_preset

STEPS = ["--set", "steps=8", "--set", "eval_every=4"]


def tiny(**kw) -> TrainConfig:
    return TrainConfig.from_dict({**load_preset("tiny")["base"], **kw})


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (relative path -> bytes)."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def cli_train(out: Path, cache: Path, *extra: str) -> int:
    return cli_main(
        [
            "train",
            "--preset",
            "tiny",
            "--method",
            "diloco",
            "--out",
            str(out),
            "--cache-dir",
            str(cache),
            "--no-progress",
            *STEPS,
            *extra,
        ]
    )


def strict_json(path: Path):
    def refuse(name):
        raise AssertionError(f"{path} holds {name}: not strict JSON")

    return json.loads(path.read_text(), parse_constant=refuse)
