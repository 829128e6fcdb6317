"""A run directory is never damaged by a command-line mistake (checkpoints surviving damage:
test_checkpoint_safety.py).

Each damaging case runs through the real CLI on the tiny preset and asserts that every file of the existing run
is byte-identical afterwards.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from _hooks import CrashAfter, SimulatedCrash
from _run_safety import STEPS, cli_train, snapshot, strict_json, tiny

from diloco.cli import main as cli_main
from diloco.train import checkpoint as ckpt
from diloco.train.config import TrainConfig, load_preset
from diloco.train.result import RunResult
from diloco.train.trainer import Trainer, TrainerCallback, train_model


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, token_cache) -> tuple[Path, dict[str, bytes]]:
    """A finished tiny run (read-only for the tests: each asserts it is unchanged)."""
    out = tmp_path_factory.mktemp("runs") / "finished"
    assert cli_train(out, token_cache) == 0
    return out, snapshot(out)


def test_a_typo_against_an_existing_run_changes_nothing(finished_run, token_cache, capsys):
    out, before = finished_run
    assert cli_train(out, token_cache, "--set", "codec=fp4_e3mo") == 2
    assert "codec='fp4_e3mo': choose one of" in capsys.readouterr().err
    assert snapshot(out) == before


def test_the_same_run_again_without_resume_is_refused(finished_run, token_cache, capsys):
    out, before = finished_run
    assert cli_train(out, token_cache) == 2
    assert "already holds this run, finished" in capsys.readouterr().err
    assert snapshot(out) == before


def test_resume_of_a_finished_run_says_so_and_changes_nothing(finished_run, token_cache, capsys):
    out, before = finished_run
    assert cli_train(out, token_cache, "--resume") == 0
    captured = capsys.readouterr()
    assert "already finished (step 8 of 8); nothing to do" in captured.err
    assert json.loads(captured.out)["final_eval_loss"] == strict_json(out / "summary.json")["final_eval_loss"]
    assert snapshot(out) == before


def test_settings_that_do_not_change_training_may_differ(finished_run, token_cache, capsys):
    out, before = finished_run
    assert cli_train(out, token_cache, "--resume", "--set", "checkpoint_every=4", "--set", "keep_checkpoints=5") == 0
    assert "already finished" in capsys.readouterr().err
    assert snapshot(out) == before


def test_resume_at_the_last_checkpoint_without_a_summary_writes_it(tmp_path, token_cache):
    out = tmp_path / "run"
    assert cli_train(out, token_cache) == 0
    want = strict_json(out / "summary.json")["final_eval_loss"]
    (out / "summary.json").unlink()  # killed after the last checkpoint, before the summary
    metrics = (out / "metrics.jsonl").read_bytes()
    assert cli_train(out, token_cache, "--resume") == 0
    assert strict_json(out / "summary.json")["final_eval_loss"] == want
    assert (out / "metrics.jsonl").read_bytes() == metrics


def test_resume_on_data_that_changed_is_refused_and_changes_nothing(tmp_path, token_cache, capsys):
    """A corpus that changed between sittings (e.g. an upgraded Debian package) would continue the run on
    other batches: the resume is refused naming both digests, the run directory is left byte-identical,
    and with the data restored the same resume goes on and records the data's digest."""
    from diloco.train.inputs import prepare_inputs

    ids = prepare_inputs(tiny(), token_cache).data.train[:20_000].astype(np.uint16)
    corpus = tmp_path / "corpus.bin"
    ids.tofile(corpus)
    cfg = tiny(sources=[str(corpus)], steps=12, eval_every=6, checkpoint_every=4, threads=1)
    out = tmp_path / "run"
    with pytest.raises(SimulatedCrash):
        Trainer(cfg, out, cache_dir=token_cache, progress=False, callbacks=[CrashAfter(8, replicas=2)]).run()
    digest = prepare_inputs(cfg, token_cache).data.digest()
    assert ckpt.latest_meta(out)["data_sha256"] == digest
    changed = ids.copy()
    changed[1234] = (int(changed[1234]) + 1) % 512  # one token of 20,000
    changed.tofile(corpus)
    before = snapshot(out)
    with pytest.raises(
        ValueError, match=r"(?s)the data differs.*" + digest[:16] + r".*in its checkpoint.*another --out"
    ):
        Trainer(cfg, out, cache_dir=token_cache, progress=False).run(resume=True)
    assert snapshot(out) == before
    ids.tofile(corpus)  # the fix the message names: the data the run used
    result = Trainer(cfg, out, cache_dir=token_cache, progress=False).run(resume=True)
    assert result.data_sha256 == digest == strict_json(out / "summary.json")["data_sha256"]
    assert ckpt.latest_meta(out)["step"] == 12


def test_token_digest_covers_every_token_and_the_split():
    from diloco.data import TokenData

    def data(train, val, dtype=np.uint16):
        return TokenData(np.asarray(train, dtype=dtype), np.asarray(val, dtype=dtype), None, (), {})

    a = data(range(10), range(10, 13))
    same = data(range(10), range(10, 13))
    one_token = data([*range(9), 11], range(10, 13))
    moved_split = data(range(11), range(11, 13))  # the same token stream, cut one token later
    wider = data(range(10), range(10, 13), np.uint32)
    assert a.digest() == same.digest()
    assert len({a.digest(), one_token.digest(), moved_split.digest(), wider.digest()}) == 4


def test_resume_and_overwrite_together_are_refused(finished_run, token_cache, capsys):
    out, before = finished_run
    assert cli_train(out, token_cache, "--resume", "--overwrite") == 2
    assert "choose one" in capsys.readouterr().err
    assert snapshot(out) == before


def test_every_json_written_is_strict(finished_run):
    out, _ = finished_run
    for name in ("config.json", "summary.json", "checkpoints/latest.json"):
        strict_json(out / name)
    for line in (out / "metrics.jsonl").read_text().splitlines():
        json.loads(line, parse_constant=lambda c: pytest.fail(f"metrics.jsonl holds {c}"))


def test_a_diverged_loss_is_written_as_null():
    result = RunResult(Path("x"), float("nan"), 1, 1, 0, 0, 0, 0, 1.0, 1.0, 10, 0)
    d = result.to_dict()
    assert d["final_eval_loss"] is None and json.dumps(d, allow_nan=False)
    assert math.isnan(RunResult.from_dict(d).final_eval_loss)


def test_overwrite_replaces_a_run_deliberately(tmp_path, token_cache):
    out = tmp_path / "run"
    assert cli_train(out, token_cache) == 0
    (out / "notes.txt").write_text("mine")  # not a run file: left alone
    assert cli_train(out, token_cache, "--set", "inner_lr=0.01", "--overwrite") == 0
    assert strict_json(out / "config.json")["inner_lr"] == 0.01
    assert (out / "notes.txt").read_text() == "mine"
    assert ckpt.latest_meta(out)["config"]["inner_lr"] == 0.01


_HOLD = (
    "import sys, time\nfrom diloco.train.rundir import RunDirLock\nlock = RunDirLock(sys.argv[1])\n"
    "lock.acquire()\nprint('held', flush=True)\ntime.sleep(120)\n"
)
_TRY = (
    "import sys\nfrom diloco.train.rundir import RunDirLock\ntry:\n    RunDirLock(sys.argv[1]).acquire()\n"
    "except ValueError as exc:\n    print(exc)\n    sys.exit(3)\n"
)


def test_a_folder_another_process_is_training_in_is_refused_and_left_alone(finished_run, token_cache, capsys):
    """Another process holds the run folder (as a run training there does): even --overwrite touches nothing."""
    out, before = finished_run
    holder = subprocess.Popen([sys.executable, "-c", _HOLD, str(out)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        for extra in (("--overwrite",), ("--resume",), ()):
            assert cli_train(out, token_cache, *extra) == 2
            assert "another process is training in this folder right now" in capsys.readouterr().err
    finally:
        holder.kill()
        holder.wait()
    assert snapshot(out) == before
    assert cli_train(out, token_cache, "--resume") == 0  # the holder is gone: the lock went with it
    assert "already finished" in capsys.readouterr().err


class _TryTheLock(TrainerCallback):
    """At one step, another process tries to take the folder of the run that is training."""

    def __init__(self, out: Path, step: int) -> None:
        self.out, self.step, self.seen = out, step, None

    def on_step_end(self, step: int, *, rank: int) -> None:
        if step == self.step and rank == 0:
            self.seen = subprocess.run(
                [sys.executable, "-c", _TRY, str(self.out)], capture_output=True, text=True, timeout=120
            )


def test_a_new_run_holds_its_folder_while_it_trains_and_lets_go_after(tmp_path, token_cache):
    out = tmp_path / "new"
    probe = _TryTheLock(out, step=2)
    Trainer(
        tiny(method="diloco", steps=4, eval_every=4), out, cache_dir=token_cache, progress=False, callbacks=[probe]
    ).run()
    assert probe.seen.returncode == 3 and "another process is training" in probe.seen.stdout, probe.seen
    after = subprocess.run([sys.executable, "-c", _TRY, str(out)], capture_output=True, text=True, timeout=120)
    assert after.returncode == 0, after


@pytest.mark.parametrize(
    "setting, message",
    [
        ("size=huge", "size='huge': choose one of"),
        ("dp_codec=nope", "dp_codec='nope': choose one of"),
        ("num_fragments=5", "num_fragments=5 needs 4 block fragments but size='tiny' has 3 blocks"),
        (
            "sources=shakespeare,nope",
            "source 'nope': no such file or folder; the bundled sources are bible, fortunes, gcide",
        ),
    ],
)
def test_bad_settings_are_reported_before_the_directory_is_made(tmp_path, token_cache, capsys, setting, message):
    out = tmp_path / "never"
    method = ["--method", "streaming"] if "fragments" in setting else []
    assert (
        cli_main(
            [
                "train",
                "--preset",
                "tiny",
                *method,
                "--out",
                str(out),
                "--cache-dir",
                str(token_cache),
                "--no-progress",
                *STEPS,
                "--set",
                setting,
            ]
        )
        == 2
    )
    assert message in capsys.readouterr().err
    assert not out.exists()


def test_train_config_rejects_unknown_codec_and_size():
    for kw, msg in (
        (dict(codec="fp5"), "codec='fp5'"),
        (dict(dp_codec="nope"), "dp_codec='nope'"),
        (dict(size="huge"), "size='huge'"),
    ):
        with pytest.raises(ValueError, match=msg):
            TrainConfig(steps=1, **kw)


def test_compare_checks_every_method_before_training_any(tmp_path, token_cache, capsys):
    preset = load_preset("tiny")
    out = tmp_path / "cmp"
    # the second method's folder holds a run of another config: the first must not train either
    other = tmp_path / "other"
    train_model(tiny(method="dp", steps=4), other, cache_dir=token_cache, progress=False)
    (out / "diloco").parent.mkdir(parents=True)
    other.rename(out / "diloco")
    before = snapshot(out)
    preset_file = tmp_path / "p.json"
    preset_file.write_text(
        json.dumps({"base": preset["base"], "methods": {"dp": {"method": "dp"}, "diloco": {"method": "diloco"}}})
    )
    assert (
        cli_main(
            [
                "compare",
                "--preset",
                str(preset_file),
                "--out",
                str(out),
                "--cache-dir",
                str(token_cache),
                "--no-progress",
                *STEPS,
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "nothing was trained" in err and "diloco: --out" in err and "method: 'dp' -> 'diloco'" in err
    assert "pass --fresh to replace it" in err and "--overwrite" not in err  # compare's own flag
    assert snapshot(out) == before and not (out / "dp").exists()
    # a bad setting in one method: reported before any trains
    preset_file.write_text(
        json.dumps({"base": preset["base"], "methods": {"dp": {"method": "dp"}, "bad": {"codec": "fp5"}}})
    )
    assert (
        cli_main(
            [
                "compare",
                "--preset",
                str(preset_file),
                "--out",
                str(tmp_path / "cmp2"),
                "--cache-dir",
                str(token_cache),
                "--no-progress",
                *STEPS,
            ]
        )
        == 2
    )
    assert "codec='fp5'" in capsys.readouterr().err and not (tmp_path / "cmp2").exists()
