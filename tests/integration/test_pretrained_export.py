"""Pretrained in, trained out: a tiny Hugging Face Llama saved with ``save_pretrained`` (weights and a
tokenizer.json) trained from its weights through the CLI, exported with ``diloco export`` and reloaded with
``transformers``; the project's Transformer exported to safetensors and reloaded; bad input refused before
anything is written."""

from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

transformers = pytest.importorskip("transformers")

from _pretrained import MODEL_VOCAB, make_pretrained_llama, make_text  # noqa: E402

from diloco.cli import main as cli_main  # noqa: E402
from diloco.data import ShardSampler, train_tokenizer  # noqa: E402
from diloco.models.hf import CausalLM  # noqa: E402
from diloco.models.saving import load_transformer  # noqa: E402
from diloco.train import checkpoint as ckpt  # noqa: E402
from diloco.train.config import TrainConfig  # noqa: E402
from diloco.train.evaluation import evaluate  # noqa: E402
from diloco.train.export import export_run, global_model  # noqa: E402
from diloco.train.inputs import prepare_inputs  # noqa: E402
from diloco.train.metrics import read_jsonl  # noqa: E402

pytestmark = pytest.mark.timeout(120)


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def user(tmp_path_factory) -> dict[str, Path]:
    """A folder of text, and a 'pretrained' Llama folder: save_pretrained's weights and config, and a
    tokenizer.json made with the tokenizers library (300 tokens, <|endoftext|> among them)."""
    root = tmp_path_factory.mktemp("pretrained")
    docs = make_text(root / "text")
    make_pretrained_llama(root / "llama", docs)
    (root / "big").mkdir()
    train_tokenizer(docs, 400).save(root / "big" / "tokenizer.json")  # more tokens than the model has rows
    return {
        "root": root,
        "text": root / "text",
        "llama": root / "llama",
        "big": root / "big" / "tokenizer.json",
        "cache": root / "cache",
    }


SETS = {
    "sources": None,
    "seq_len": 32,
    "method": "streaming",
    "replicas": 2,
    "global_batch": 4,
    "sync_every": 4,
    "num_fragments": 2,
    "overlap_steps": 1,
    "merge_alpha": 0.5,
    "codec": "fp4_e3m0",
    "steps": 8,
    "warmup_steps": 2,
    "inner_lr": 3e-3,
    "eval_every": 8,
    "eval_batches": 2,
    "checkpoint_every": 4,
    "threads": 1,
}


def _train_args(user, model: str, out: Path, **over) -> list[str]:
    sets = SETS | {"model": model, "sources": str(user["text"])} | over
    return ["train", "--preset", "tiny", "--out", str(out), "--cache-dir", str(user["cache"]), "--no-progress"] + [
        x for k, v in sets.items() for x in ("--set", f"{k}={v}")
    ]


@pytest.fixture(scope="module")
def hf_run(user, tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("runs") / "llama"
    assert cli_main(_train_args(user, f"hf:{user['llama']}", run)) == 0
    return run


def _cfg(run: Path) -> TrainConfig:
    return TrainConfig.from_dict(json.loads((run / "config.json").read_text()))


def test_pretrained_llama_trains_from_its_weights_with_its_tokenizer(user, hf_run):
    cfg = _cfg(hf_run)
    inputs = prepare_inputs(cfg, user["cache"])
    assert inputs.data.vocab_size == 300  # the folder's tokenizer, not a BPE trained on the text
    assert (
        json.loads((hf_run / "tokenizer.json").read_text())["model"]["vocab"]
        == json.loads((user["llama"] / "tokenizer.json").read_text())["model"]["vocab"]
    )
    pretrained = transformers.AutoModelForCausalLM.from_pretrained(user["llama"], dtype=torch.float32)
    first = []
    for rank in range(cfg.replicas):  # the first batch of each replica, as the trainer draws it
        x, y = ShardSampler(
            inputs.data.train,
            rank=rank,
            world_size=cfg.replicas,
            batch_size=cfg.batch_per_replica,
            seq_len=cfg.seq_len,
            seed=cfg.seed,
        ).next_batch()
        with torch.no_grad():
            logits = pretrained(input_ids=x).logits
        first.append(F.cross_entropy(logits.float().flatten(0, 1), y.flatten()).item())
    logged = next(r["loss"] for r in read_jsonl(hf_run / "metrics.jsonl") if "loss" in r)
    assert logged == pytest.approx(sum(first) / len(first), rel=1e-5)
    assert logged < math.log(MODEL_VOCAB) - 1.0  # far below a random initialisation's ~log(vocab)


def test_export_writes_the_global_parameters_transformers_loads(user, hf_run, tmp_path, capsys):
    out = tmp_path / "exported"
    assert cli_main(["export", str(hf_run), "--out", str(out)]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["step"] == 8 and printed["model_kind"] == "hf"
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= set(printed["files"])
    loaded = transformers.AutoModelForCausalLM.from_pretrained(out)
    assert loaded.dtype == torch.float32 and loaded.config.vocab_size == MODEL_VOCAB
    inputs = prepare_inputs(_cfg(hf_run), user["cache"])
    summary = json.loads((hf_run / "summary.json").read_text())
    # the trainer evaluated its StreamingDiLoCo.global_state_dict(): the exported weights give that loss
    assert_close(evaluate(CausalLM(loaded), inputs.val_batches), summary["final_eval_loss"], rtol=1e-6, atol=0)
    model, _, _ = global_model(hf_run)
    x = inputs.val_batches[0][0]
    with torch.no_grad():
        assert torch.equal(loaded(input_ids=x).logits, model(x)[0])
        for name, value in loaded.state_dict().items():
            assert torch.equal(value, model.hf.state_dict()[name]), name
    # not replica 0's local parameters (alpha = 0.5 keeps them apart from the global ones)
    model.load_state_dict(ckpt.load_latest(hf_run)["replicas"][0]["model"])
    assert evaluate(model, inputs.val_batches) != pytest.approx(summary["final_eval_loss"], rel=1e-6)
    # the tokenizer: transformers loads it and encodes as the run did
    tok = transformers.AutoTokenizer.from_pretrained(out)
    sample = "Parse the command line, then log it."
    assert tok(sample, add_special_tokens=False)["input_ids"] == inputs.data.tokenizer.encode(sample)
    assert tok.eos_token == "<|endoftext|>"
    # an earlier checkpoint (--step): other weights; into a folder holding files only with --overwrite
    assert cli_main(["export", str(hf_run), "--out", str(out), "--step", "4", "--overwrite"]) == 0
    earlier = transformers.AutoModelForCausalLM.from_pretrained(out)
    assert not torch.equal(earlier.lm_head.weight, loaded.lm_head.weight)


def test_projects_transformer_exports_to_safetensors_and_loads_back(token_cache, tmp_path, capsys):
    run, out = tmp_path / "run", tmp_path / "model"
    args = [
        "train",
        "--preset",
        "tiny",
        "--method",
        "streaming",
        "--out",
        str(run),
        "--cache-dir",
        str(token_cache),
        "--no-progress",
        "--set",
        "steps=8",
        "--set",
        "sync_every=4",
        "--set",
        "eval_every=8",
        "--set",
        "num_fragments=2",
        "--set",
        "threads=1",
    ]
    assert cli_main(args) == 0
    capsys.readouterr()
    assert cli_main(["export", str(run), "--out", str(out)]) == 0
    assert json.loads(capsys.readouterr().out)["model_kind"] == "transformer"
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors", "tokenizer.json"]
    loaded = load_transformer(out)
    model, _, cfg = global_model(run)
    inputs = prepare_inputs(cfg, token_cache)
    x = inputs.val_batches[0][0]
    with torch.no_grad():
        assert torch.equal(loaded(x)[0], model(x)[0])
    summary = json.loads((run / "summary.json").read_text())
    assert_close(evaluate(loaded, inputs.val_batches), summary["final_eval_loss"], rtol=1e-6, atol=0)
    # a run written before runs kept tokenizer.json and checkpoints their vocab_size: rebuilt from its data
    old = tmp_path / "old-run"
    shutil.copytree(run, old)
    (old / "tokenizer.json").unlink()
    for record in (old / "checkpoints").glob("*.json"):
        record.write_text(json.dumps({k: v for k, v in json.loads(record.read_text()).items() if k != "vocab_size"}))
    export_run(old, out=tmp_path / "from-old", cache_dir=token_cache)
    assert (tmp_path / "from-old" / "tokenizer.json").read_text() == (out / "tokenizer.json").read_text()
    with torch.no_grad():
        assert torch.equal(load_transformer(tmp_path / "from-old")(x)[0], model(x)[0])
    with pytest.raises(ValueError, match=r"is a Hugging Face model: load it with transformers"):
        (tmp_path / "hf").mkdir()
        (tmp_path / "hf" / "config.json").write_text('{"model_type": "llama"}')
        load_transformer(tmp_path / "hf")


FACTORY = """
import torch.nn.functional as F
from torch import nn


class Bigram(nn.Module):
    def __init__(self, vocab_size):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, 16)
        self.head = nn.Linear(16, vocab_size)

    def forward(self, idx, targets=None):
        logits = self.head(self.embed(idx))
        return logits, None if targets is None else F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def build(*, vocab_size, seq_len):
    return Bigram(vocab_size)
"""


def test_data_parallel_run_of_your_factory_exports_to_safetensors(token_cache, tmp_path, capsys):
    """DP: the global parameters are every replica's; a factory's model is written as model.safetensors."""
    from safetensors.torch import load_model

    (tmp_path / "mine.py").write_text(FACTORY)
    run, out = tmp_path / "run", tmp_path / "model"
    assert (
        cli_main(
            [
                "train",
                "--preset",
                "tiny",
                "--method",
                "dp",
                "--out",
                str(run),
                "--cache-dir",
                str(token_cache),
                "--no-progress",
                "--set",
                "steps=4",
                "--set",
                f"model={tmp_path / 'mine.py'}:build",
            ]
        )
        == 0
    )
    capsys.readouterr()
    assert cli_main(["export", str(run), "--out", str(out)]) == 0
    assert json.loads(capsys.readouterr().out)["model_kind"] == "factory"
    assert sorted(p.name for p in out.iterdir()) == ["model.safetensors", "tokenizer.json"]
    cfg = _cfg(run)
    inputs = prepare_inputs(cfg, token_cache)
    model = inputs.model
    load_model(model, out / "model.safetensors")
    for name, value in ckpt.load_latest(run)["replicas"][1]["model"].items():
        assert torch.equal(model.state_dict()[name], value), name
    summary = json.loads((run / "summary.json").read_text())
    assert_close(evaluate(model, inputs.val_batches), summary["final_eval_loss"], rtol=1e-6, atol=0)


# -- bad input: a clear error (exit 2) before anything is written --------------------------------------------------


def test_export_refusals_write_nothing(hf_run, tmp_path, capsys):
    held = tmp_path / "held"
    held.mkdir()
    (held / "notes.txt").write_text("mine")
    empty_run = tmp_path / "empty-run"
    empty_run.mkdir()
    (empty_run / "config.json").write_text("{}")
    cases = [
        (
            ["export", str(hf_run), "--out", str(held)],
            r"--out .*held already holds files \(notes.txt\); choose a "
            r"new or empty folder, or pass --overwrite",
        ),
        (
            ["export", str(empty_run), "--out", str(tmp_path / "m1")],
            r"empty-run has no checkpoint .*nothing to "
            r"export",
        ),
        (
            ["export", str(hf_run), "--out", str(tmp_path / "m2"), "--step", "5"],
            r"has no checkpoint of step 5; its checkpoints: 4, 8",
        ),
        (["export", str(hf_run), "--out", str(hf_run)], r"holds the run .* itself; export to another folder"),
    ]
    before = _snapshot(tmp_path)
    run_before = _snapshot(hf_run)
    for argv, message in cases:
        assert cli_main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("diloco export: error: ") and re.search(message, err), err
    assert _snapshot(tmp_path) == before and _snapshot(hf_run) == run_before
    assert not (tmp_path / "m1").exists() and not (tmp_path / "m2").exists()


def test_a_damaged_newest_checkpoint_is_skipped_and_said_or_refused_when_named(hf_run, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(hf_run, run)
    victim = run / "checkpoints" / "step-00000008" / "replica-1.pt"
    victim.write_bytes(victim.read_bytes()[:-100])  # truncated: its SHA-256 no longer matches the record
    assert cli_main(["export", str(run), "--out", str(tmp_path / "named"), "--step", "8"]) == 2
    assert re.search(r"diloco export: error: checkpoint .*replica-1.pt is damaged", capsys.readouterr().err)
    assert not (tmp_path / "named").exists()
    assert cli_main(["export", str(run), "--out", str(tmp_path / "latest")]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["step"] == 4
    assert re.search(r"skipped a damaged checkpoint, step 8: .*replica-1.pt is damaged.*exported step 4", captured.err)


def _bad_folders(user, tmp: Path) -> dict[str, tuple[list[str], str]]:
    deeper = tmp / "deeper"  # config says 3 layers, the weights hold 2
    shutil.copytree(user["llama"], deeper)
    fields = json.loads((deeper / "config.json").read_text())
    (deeper / "config.json").write_text(json.dumps(fields | {"num_hidden_layers": 3}))
    wider = tmp / "wider"  # config says hidden 64, the weights hold 32
    shutil.copytree(user["llama"], wider)
    (wider / "config.json").write_text(json.dumps(fields | {"hidden_size": 64, "head_dim": 16}))
    untokenized = tmp / "no-tokenizer"
    shutil.copytree(user["llama"], untokenized)
    (untokenized / "tokenizer.json").unlink()
    pickled = tmp / "pickled"
    pickled.mkdir()
    shutil.copy(user["llama"] / "config.json", pickled / "config.json")
    torch.save({}, pickled / "pytorch_model.bin")
    np.arange(0, 600, dtype=np.uint16).repeat(20).tofile(tmp / "ids.bin")  # ids up to 599: not this tokenizer's
    llama = f"hf:{user['llama']}"
    return {
        "weights missing for the config": (
            _train_args(user, f"hf:{deeper}", tmp / "out"),
            r"the weights in .*deeper do not match its config.json: 9 missing "
            r"weight\(s\) \(model.layers.2",
        ),
        "weights of other shapes": (
            _train_args(user, f"hf:{wider}", tmp / "out"),
            r"the weights in .*wider do not match its config.json: .* is \[\d+, 32\] in the "
            r"weights, \[\d+, 64\] by the config",
        ),
        "tokenizer larger than the model": (
            _train_args(user, llama, tmp / "out", tokenizer=user["big"]),
            r"the data's vocabulary \(400 ids\) is larger than that of the pretrained "
            r"model in .* \(vocab_size=320\)",
        ),
        "ids beyond the tokenizer": (
            _train_args(user, llama, tmp / "out", sources=tmp / "ids.bin", vocab_size=600),
            r"the token files hold id 599 but the model's tokenizer \(.*tokenizer.json\) "
            r"has only 300 tokens",
        ),
        "weights without a tokenizer": (
            _train_args(user, f"hf:{untokenized}", tmp / "out"),
            r"has pretrained weights but no tokenizer.json, and tokenizer is not set",
        ),
        "pickled weights": (
            _train_args(user, f"hf:{pickled}", tmp / "out"),
            r"holds weights as pytorch_model.bin, a pickle .*only safetensors are loaded",
        ),
    }


def test_bad_pretrained_folders_are_refused_before_the_run_directory(user, tmp_path, capsys):
    cases = _bad_folders(user, tmp_path)
    before = _snapshot(tmp_path)
    for name, (argv, message) in cases.items():
        assert cli_main(argv) == 2, name
        err = capsys.readouterr().err
        assert "diloco train: error: " in err and "Traceback" not in err and re.search(message, err), f"{name}: {err}"
        assert not (tmp_path / "out").exists(), name
    assert _snapshot(tmp_path) == before
