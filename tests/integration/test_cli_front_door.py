"""The command line explains itself: every key in the help, `diloco config`, range checks, `--resume auto`."""

from __future__ import annotations

import json
import re
from dataclasses import fields
from pathlib import Path

import pytest
import torch
from _hooks import CrashAfter, SimulatedCrash

from diloco.cli import main as cli_main
from diloco.train import checkpoint as ckpt
from diloco.train.config import TrainConfig, load_preset, reference
from diloco.train.trainer import Trainer

STEPS = ["--set", "steps=8", "--set", "eval_every=4", "--set", "checkpoint_every=4"]


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


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("command", ["train", "compare", "config"])
def test_help_names_every_config_key_with_type_default_and_meaning(command, capsys):
    with pytest.raises(SystemExit):
        cli_main([command, "--help"])
    text = capsys.readouterr().out
    for f in fields(TrainConfig):
        line = re.search(rf"^    {f.name} \((\S+), default ([^)]*)\)\n        (\S.*)$", text, re.M)
        assert line, f"{command} --help does not list {f.name}"
        assert line.group(3) == f.metadata["doc"]
    assert len(re.findall(r"^    \w+ \(", text, re.M)) == len(fields(TrainConfig))


def test_every_field_is_documented_in_one_place():
    docs = reference()
    assert [d.name for d in docs] == [f.name for f in fields(TrainConfig)]
    defaults = {f.name: f.default for f in fields(TrainConfig)}
    for d in docs:
        assert d.doc and d.section and len(d.doc) < 140, d.name
        assert d.default == (list(defaults[d.name]) if isinstance(defaults[d.name], tuple) else defaults[d.name])


def test_config_prints_the_resolved_validated_config(capsys):
    assert cli_main(["config", "--preset", "demo", "--method", "streaming", "--set", "sync_every=60"]) == 0
    out = json.loads(capsys.readouterr().out)
    preset = load_preset("demo")
    expected = TrainConfig.from_dict({**preset["base"], **preset["methods"]["streaming"], "sync_every": 60})
    assert out["config"] == expected.to_dict()
    assert out["derived"]["total_steps"] == expected.total_steps == 480
    assert out["derived"]["checkpoint_interval"] == 120  # the first multiple of H=60 at or above 100


@pytest.mark.parametrize(
    "setting, message",
    [
        ("tokens=-5", "tokens=-5: must be >= 0"),
        ("steps=-1", "steps=-1: must be >= 0"),
        ("inner_lr=0", "inner_lr=0.0: must be > 0"),
        ("inner_lr=nan", "inner_lr=nan: must be a finite number"),
        ("outer_lr=-0.5", "outer_lr=-0.5: must be > 0"),
        ("outer_momentum=1.0", "outer_momentum=1.0: need 0 <= outer_momentum < 1"),
        ("beta2=1.5", "beta2=1.5: need 0 <= beta2 < 1"),
        ("global_batch=0", "global_batch=0: need at least 1"),
        ("weight_decay=-0.1", "weight_decay=-0.1: must be >= 0"),
        ("grad_clip=-1", "grad_clip=-1.0: must be >= 0"),
        ("warmup_steps=-3", "warmup_steps=-3: must be >= 0"),
        ("seed=-1", "seed=-1: must be >= 0"),
    ],
)
def test_numbers_out_of_range_are_refused_naming_the_value(setting, message, capsys):
    assert cli_main(["config", "--preset", "demo", "--set", setting]) == 2
    assert message in capsys.readouterr().err


def test_resume_auto_starts_a_run_where_there_is_none(tmp_path, token_cache):
    out = tmp_path / "job"
    assert cli_train(out, token_cache, "--resume") == 2  # plain --resume still needs a checkpoint
    assert not out.exists()
    assert cli_train(out, token_cache, "--resume", "auto") == 0
    assert json.loads((out / "summary.json").read_text())["steps"] == 8
    finished = snapshot(out)
    assert cli_train(out, token_cache, "--resume", "auto") == 0  # requeued after it finished: nothing changes
    assert snapshot(out) == finished


def test_resume_auto_continues_a_killed_run_bit_for_bit(tmp_path, token_cache):
    cfg = TrainConfig.from_dict(
        {**load_preset("tiny")["base"], "method": "diloco", "steps": 8, "eval_every": 4, "checkpoint_every": 4}
    )
    full, cut = tmp_path / "full", tmp_path / "cut"
    assert cli_train(full, token_cache) == 0
    with pytest.raises(SimulatedCrash):
        Trainer(cfg, cut, cache_dir=token_cache, progress=False, callbacks=[CrashAfter(6, replicas=cfg.replicas)]).run()
    assert ckpt.saved_steps(cut) == [4] and not (cut / "summary.json").exists()
    assert cli_train(cut, token_cache, "--resume", "auto") == 0
    a, b = ckpt.load_latest(full), ckpt.load_latest(cut)
    assert a["step"] == b["step"] == 8
    for ra, rb in zip(a["replicas"], b["replicas"], strict=True):
        for k in ra["model"]:
            assert torch.equal(ra["model"][k], rb["model"][k]), k


def test_resume_auto_still_refuses_another_runs_folder(tmp_path, token_cache, capsys):
    out = tmp_path / "run"
    assert cli_train(out, token_cache) == 0
    before = snapshot(out)
    assert cli_train(out, token_cache, "--resume", "auto", "--set", "inner_lr=0.01") == 2
    assert "inner_lr" in capsys.readouterr().err
    assert snapshot(out) == before


def test_a_finished_streaming_run_resumed_with_a_larger_budget_trains_on(tmp_path, token_cache):
    """The last step flushes the exchanges in flight; the steps they were due at must finish nothing."""
    out = tmp_path / "run"
    base = [
        "train",
        "--preset",
        "tiny",
        "--method",
        "streaming",
        "--set",
        "num_fragments=2",
        "--out",
        str(out),
        "--cache-dir",
        str(token_cache),
        "--no-progress",
        "--set",
        "eval_every=8",
    ]
    assert cli_main([*base, "--set", "steps=16"]) == 0
    assert cli_main([*base, "--set", "steps=24", "--resume"]) == 0
    assert json.loads((out / "summary.json").read_text())["steps"] == 24


def test_a_user_error_is_one_line_and_a_bug_shows_its_traceback(capsys, monkeypatch):
    """ConfigError (the user's to fix): one line, exit 2. Anything else escaping a command is a bug: the
    traceback and where to report it, exit 1 (a ValueError from a bug included, which used to be one line)."""
    from diloco.errors import ConfigError

    assert issubclass(ConfigError, ValueError)
    assert cli_main(["config", "--preset", "demo", "--set", "steps=abc"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("diloco config: error: steps='abc': expected a value of type int") and "Traceback" not in err
    assert err.count("\n") == 1

    import diloco.cli.config as config_cli

    def broken(args):
        return [][0] if args.preset == "demo" else int("not a number")

    monkeypatch.setattr(config_cli, "run", broken)
    for preset, kind in (("demo", "IndexError"), ("tiny", "ValueError")):
        assert cli_main(["config", "--preset", preset]) == 1
        err = capsys.readouterr().err
        assert err.startswith("Traceback") and f"{kind}:" in err and "internal error (a bug" in err
