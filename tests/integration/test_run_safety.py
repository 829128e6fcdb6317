"""A run directory is never damaged by a command-line mistake, and checkpoints survive damage.

Each damaging case of issue 12 runs through the real CLI on the tiny preset and asserts
that every file of the existing run is byte-identical afterwards.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from _hooks import CrashAfter, SimulatedCrash

from diloco.cli import main as cli_main
from diloco.train import checkpoint as ckpt
from diloco.train.config import TrainConfig, load_preset
from diloco.train.result import RunResult
from diloco.train.trainer import Trainer, TrainerCallback, train_model

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


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, token_cache) -> tuple[Path, dict[str, bytes]]:
    """A finished tiny run (read-only for the tests: each asserts it is unchanged)."""
    out = tmp_path_factory.mktemp("runs") / "finished"
    assert cli_train(out, token_cache) == 0
    return out, snapshot(out)


def strict_json(path: Path):
    def refuse(name):
        raise AssertionError(f"{path} holds {name}: not strict JSON")

    return json.loads(path.read_text(), parse_constant=refuse)


# -- 1. the run directory --------------------------------------------------------------------------
def test_out_holding_another_run_is_refused_naming_the_keys(finished_run, token_cache, capsys):
    out, before = finished_run
    assert cli_train(out, token_cache, "--set", "inner_lr=0.01", "--set", "sync_every=4") == 2
    err = capsys.readouterr().err
    assert "holds another run" in err and "inner_lr: 0.003 -> 0.01" in err and "sync_every: 8 -> 4" in err
    assert "--overwrite" in err
    assert snapshot(out) == before


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


# -- 2. checkpoints --------------------------------------------------------------------------------
def test_the_last_k_checkpoints_are_kept(tmp_path, token_cache):
    train_model(tiny(steps=12, checkpoint_every=2, keep_checkpoints=3), tmp_path, cache_dir=token_cache, progress=False)
    assert ckpt.saved_steps(tmp_path) == [8, 10, 12]
    assert sorted(p.name for p in (tmp_path / "checkpoints").glob("*.json")) == [
        "latest.json",
        "step-00000008.json",
        "step-00000010.json",
        "step-00000012.json",
    ]


def test_default_cadence_falls_on_sync_boundaries_and_is_named_in_help(capsys):
    assert TrainConfig(steps=1, sync_every=30).checkpoint_interval == 120  # first multiple of H >= 100
    assert TrainConfig(steps=1, sync_every=500).checkpoint_interval == 500
    assert TrainConfig(steps=1, method="dp").checkpoint_interval == 100
    assert TrainConfig(steps=1, checkpoint_every=0).checkpoint_interval == 0
    with pytest.raises(SystemExit):
        cli_main(["train", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "checkpoint_every" in help_text and "every 100 steps" in help_text and "keep_checkpoints" in help_text


@pytest.mark.parametrize("method", ["dp", "streaming"])
def test_a_damaged_latest_checkpoint_falls_back_and_ends_bit_identical(tmp_path, token_cache, capsys, method):
    kw = dict(method=method, steps=24, checkpoint_every=8, eval_every=12)
    if method == "streaming":
        kw.update(sync_every=6, num_fragments=2, overlap_steps=2, merge_alpha=0.5, codec="int8")
    cfg = tiny(**kw)
    full, cut = tmp_path / "full", tmp_path / "cut"
    train_model(cfg, full, cache_dir=token_cache, progress=False)
    with pytest.raises(SimulatedCrash):
        crash = CrashAfter(20, replicas=cfg.replicas)
        Trainer(cfg, cut, cache_dir=token_cache, progress=False, callbacks=[crash]).run()
    assert ckpt.saved_steps(cut) == [8, 16]
    damaged = cut / "checkpoints" / "step-00000016" / "replica-1.pt"
    data = bytearray(damaged.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte in the middle of the tensors
    damaged.write_bytes(bytes(data))
    capsys.readouterr()
    resumed = Trainer(cfg, cut, cache_dir=token_cache, progress=False).run(resume=True)
    err = capsys.readouterr().err
    assert "skipped a damaged checkpoint, step 16" in err and "resuming from step 8" in err
    assert "weights_only" not in err
    a, b = ckpt.load_latest(full), ckpt.load_latest(cut)
    assert a["step"] == b["step"] == 24
    for ra, rb in zip(a["replicas"], b["replicas"], strict=True):
        for k in ra["model"]:
            assert torch.equal(ra["model"][k], rb["model"][k]), k
        if method == "streaming":
            for ga, gb in zip(ra["algorithm"]["global"], rb["algorithm"]["global"], strict=True):
                assert torch.equal(ga, gb)
    assert resumed.final_eval_loss == strict_json(full / "summary.json")["final_eval_loss"]
    steps = [r["step"] for r in map(json.loads, (cut / "metrics.jsonl").read_text().splitlines()) if "loss" in r]
    assert steps == list(range(1, 25))


class _NotATensor:
    pass


def test_an_unloadable_checkpoint_is_named_without_torchs_unsafe_advice(tmp_path):
    path = tmp_path / "checkpoints" / "step-00000004" / "replica-0.pt"
    path.parent.mkdir(parents=True)
    torch.save({"model": _NotATensor()}, path)  # what weights_only=True refuses
    with pytest.raises(ckpt.CheckpointError) as info:
        ckpt.load_replica(tmp_path, 0, 4)
    assert str(path) in str(info.value) and "weights_only" not in str(info.value)
    assert info.value.__cause__ is None and info.value.__suppress_context__


def test_no_readable_checkpoint_says_what_to_do(tmp_path, token_cache, capsys):
    out = tmp_path / "run"
    assert cli_train(out, token_cache, "--set", "checkpoint_every=4") == 0
    for step in (4, 8):
        (out / "checkpoints" / f"step-{step:08d}" / "replica-0.pt").write_bytes(b"garbage")
    before = snapshot(out)
    assert cli_train(out, token_cache, "--set", "checkpoint_every=4", "--resume") == 2
    err = capsys.readouterr().err
    assert "no readable checkpoint" in err and "step 8:" in err and "step 4:" in err and "--overwrite" in err
    assert snapshot(out) == before


def test_compare_reuses_a_finished_run_and_resumes_an_interrupted_one(tmp_path, token_cache, capsys):
    preset = load_preset("tiny")
    preset_file = tmp_path / "p.json"
    preset_file.write_text(
        json.dumps(
            {
                "base": {**preset["base"], "checkpoint_every": 4},
                "methods": {"dp": {"method": "dp"}, "diloco": {"method": "diloco"}},
            }
        )
    )
    out = tmp_path / "cmp"
    args = [
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
    # diloco was killed after step 6: its checkpoint at step 4 is resumed, dp trains afresh
    cfg = TrainConfig.from_dict({**preset["base"], "checkpoint_every": 4, "steps": 8, "eval_every": 4})
    with pytest.raises(SimulatedCrash):
        crash = CrashAfter(6, replicas=cfg.replicas)
        Trainer(cfg, out / "diloco", cache_dir=token_cache, progress=False, callbacks=[crash]).run()
    assert cli_main(args) == 0
    first = {r["name"]: r for r in json.loads((out / "compare.json").read_text())}
    steps = [
        r["step"] for r in map(json.loads, (out / "diloco" / "metrics.jsonl").read_text().splitlines()) if "loss" in r
    ]
    assert steps == list(range(1, 9)) and not first["diloco"]["reused"]
    before = snapshot(out / "dp")
    assert cli_main(args) == 0  # everything finished: reused, nothing retrained
    again = {r["name"]: r for r in json.loads((out / "compare.json").read_text())}
    assert again["dp"]["reused"] and again["diloco"]["reused"]
    assert again["dp"]["final_eval_loss"] == first["dp"]["final_eval_loss"]
    assert snapshot(out / "dp") == before


def test_the_fix_an_unloadable_checkpoint_names_works(tmp_path, token_cache, capsys):
    """A file that matches its record but does not load (written by something else): the message names
    what to delete; after deleting it, --resume continues from the step before and ends as the full run."""
    cfg = tiny(steps=8, checkpoint_every=2, eval_every=4)
    full, cut = tmp_path / "full", tmp_path / "cut"
    train_model(cfg, full, cache_dir=token_cache, progress=False)
    with pytest.raises(SimulatedCrash):
        crash = CrashAfter(6, replicas=cfg.replicas)
        Trainer(cfg, cut, cache_dir=token_cache, progress=False, callbacks=[crash]).run()
    record_path = cut / "checkpoints" / "step-00000006.json"
    record = json.loads(record_path.read_text())
    for rank in range(cfg.replicas):
        path = cut / "checkpoints" / "step-00000006" / f"replica-{rank}.pt"
        torch.save({"model": _NotATensor()}, path)
        record["files"][path.name] = ckpt._digest(path)
    record_path.write_text(json.dumps(record))
    (cut / "checkpoints" / "latest.json").write_text(json.dumps(record))
    args = [
        "train",
        "--preset",
        "tiny",
        "--method",
        "diloco",
        "--out",
        str(cut),
        "--cache-dir",
        str(token_cache),
        "--no-progress",
        "--set",
        "steps=8",
        "--set",
        "checkpoint_every=2",
        "--set",
        "eval_every=4",
        "--resume",
    ]
    assert cli_main(args) == 2
    err = capsys.readouterr().err
    assert "weights_only" not in err
    step_dir, step_record = str(cut / "checkpoints" / "step-00000006"), str(record_path)
    assert f"delete {step_dir} and {step_record}" in err
    shutil.rmtree(step_dir)
    record_path.unlink()
    assert cli_main(args) == 0
    a, b = ckpt.load_latest(full), ckpt.load_latest(cut)
    for ra, rb in zip(a["replicas"], b["replicas"], strict=True):
        for k in ra["model"]:
            assert torch.equal(ra["model"][k], rb["model"][k]), k
