"""The divergence guard end to end: a huge inner lr stops the run with a non-zero exit and the message, and the
run folder's earlier checkpoints stay byte for byte as they were (tiny preset, a few seconds each)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from diloco.cli import main as cli_main
from diloco.train.config import TrainConfig, load_preset
from diloco.train.divergence import DivergenceError
from diloco.train.trainer import Trainer, TrainerCallback

# The inner lr ramps up over the warmup (lr = 1000 x step / 16000): about 0.5 at step 8, where the run is still
# near its start (checkpoints at 4, 8, 12), and 1 at step 16, where the evaluation is 3.3 x ln(vocab)
DIVERGING = {
    "method": "diloco",
    "inner_lr": 1000.0,
    "warmup_steps": 16000,
    "steps": 64,
    "checkpoint_every": 4,
    "keep_checkpoints": 10,
    "eval_every": 8,
    "threads": 1,
}


def files(run_dir: Path) -> dict[str, str]:
    """SHA-256 of every file under the run's checkpoints/ folder."""
    root = run_dir / "checkpoints"
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def test_the_cli_stops_a_diverging_run_with_exit_3_the_message_and_its_checkpoints_intact(
    tmp_path, token_cache, capsys
):
    out = tmp_path / "run"
    sets = [a for k, v in DIVERGING.items() if k != "method" for a in ("--set", f"{k}={v}")]
    code = cli_main(
        [
            "train",
            "--preset",
            "tiny",
            "--method",
            "diloco",
            *sets,
            "--out",
            str(out),
            "--no-progress",
            "--cache-dir",
            str(token_cache),
        ]
    )
    err = capsys.readouterr().err
    assert code == 3, err
    assert "the run diverged at step 16: the evaluation loss is" in err
    for setting in ("inner_lr=1000", "outer_lr=0.7", "outer_momentum=0.9", "diverge_factor=3"):
        assert setting in err, (setting, err)
    assert "No checkpoint of this state was written" in err
    assert not (out / "summary.json").exists()
    # the checkpoints before the divergence, each file as its commit recorded it; none of the diverged state
    latest = json.loads((out / "checkpoints" / "latest.json").read_text())
    assert latest["step"] == 12
    steps = sorted(int(p.name.split("-")[1]) for p in (out / "checkpoints").glob("step-*") if p.is_dir())
    assert steps == [4, 8, 12]
    for step in steps:
        record = json.loads((out / "checkpoints" / f"step-{step:08d}.json").read_text())
        for name, digest in record["files"].items():
            data = (out / "checkpoints" / f"step-{step:08d}" / name).read_bytes()
            assert hashlib.sha256(data).hexdigest() == digest["sha256"], (step, name)


class Snapshots(TrainerCallback):
    """Replica 0 records every checkpoint file's digest after each step."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir, self.last = run_dir, {}

    def on_step_end(self, step: int, *, rank: int) -> None:
        if rank == 0:
            self.last = {"step": step, "files": files(self.run_dir)}


def test_the_guard_writes_nothing_after_the_last_healthy_step(tmp_path, token_cache):
    cfg = TrainConfig.from_dict({**load_preset("tiny")["base"], **DIVERGING})
    snap = Snapshots(tmp_path)
    trainer = Trainer(cfg, tmp_path, cache_dir=token_cache, progress=False, callbacks=[snap])
    with pytest.raises(DivergenceError, match="diverged at step 16"):
        trainer.run()
    assert snap.last["step"] == 15 and snap.last["files"]
    assert files(tmp_path) == snap.last["files"]  # byte for byte what was there before the diverged step


@pytest.mark.timeout(120)
def test_a_decoupled_run_with_every_learner_waiting_stops_too(tmp_path, token_cache):
    """K = M: when one learner's loss is not finite, the others (waiting for the syncer) stop as well."""
    cfg = TrainConfig.from_dict(
        {
            **load_preset("tiny")["base"],
            "method": "decoupled",
            "replicas": 3,
            "global_batch": 12,
            "quorum": 0,
            "inner_lr": 1e5,
            "warmup_steps": 2,
            "steps": 40,
            "threads": 1,
        }
    )
    trainer = Trainer(cfg, tmp_path, cache_dir=token_cache, progress=False)
    with pytest.raises(DivergenceError, match="training loss is nan"):
        trainer.run()
    assert not list(tmp_path.glob("checkpoints/step-*"))
