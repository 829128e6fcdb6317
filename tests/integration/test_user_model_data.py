"""Your model on your data through the CLI, end to end: a tiny Hugging Face Llama and GPT-2 built from a
local config, trained with Streaming DiLoCo (P = 2, FP4) on a folder of your text files; evaluation of
the global parameters; bit-identical resume after the process is killed; and bad input refused
before the run directory is touched.
"""

from __future__ import annotations

import json
import math
import pydoc
import re
from pathlib import Path

import pytest
import torch

from diloco.algorithm.fragments import split_fragments
from diloco.cli import main as cli_main
from diloco.train import checkpoint as ckpt
from diloco.train.config import TrainConfig
from diloco.train.evaluation import evaluate
from diloco.train.inputs import prepare_inputs
from diloco.train.metrics import read_jsonl

pytestmark = pytest.mark.timeout(240)

LLAMA = {
    "model_type": "llama",
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 64,
}
GPT2 = {"model_type": "gpt2", "n_embd": 32, "n_layer": 4, "n_head": 4, "n_positions": 64}


@pytest.fixture(scope="module")
def user(tmp_path_factory) -> dict[str, Path]:
    """The user's files: a folder of text (standard-library docs: real English, not the bundled corpus),
    a Llama config folder (config.json) and a GPT-2 config file, and a shared cache."""
    root = tmp_path_factory.mktemp("user")
    text = root / "my-text"
    (text / "more").mkdir(parents=True)
    for i, module in enumerate(("argparse", "json", "logging", "pathlib", "subprocess", "unittest", "typing")):
        folder = text / "more" if i % 2 else text
        (folder / f"{module}.txt").write_text(pydoc.render_doc(module, renderer=pydoc.plaintext), encoding="utf-8")
    (root / "llama").mkdir()
    (root / "llama" / "config.json").write_text(json.dumps(LLAMA))
    (root / "gpt2.json").write_text(json.dumps(GPT2))
    return {"text": text, "llama": root / "llama", "gpt2": root / "gpt2.json", "cache": root / "cache"}


def _args(user, model: str, out: Path, steps: int, *extra: str) -> list[str]:
    sets = {
        "model": f"hf:{user[model]}",
        "sources": str(user["text"]),
        "vocab_size": 384,
        "seq_len": 32,
        "method": "streaming",
        "replicas": 2,
        "global_batch": 4,
        "sync_every": 4,
        "num_fragments": 2,
        "overlap_steps": 1,
        "merge_alpha": 0.5,
        "codec": "fp4_e3m0",
        "steps": steps,
        "warmup_steps": 2,
        "inner_lr": 3e-3,
        "eval_every": 8,
        "eval_batches": 2,
        "checkpoint_every": 4,
        "threads": 1,
    }
    out_args = ["train", "--preset", "tiny", "--out", str(out), "--cache-dir", str(user["cache"]), "--no-progress"]
    return out_args + [x for k, v in sets.items() for x in ("--set", f"{k}={v}")] + list(extra)


def _cfg(run: Path) -> TrainConfig:
    return TrainConfig.from_dict(json.loads((run / "config.json").read_text()))


@pytest.mark.slow
@pytest.mark.parametrize("model", ["llama", "gpt2"])
def test_hf_model_on_your_text_trains_evaluates_global_params_and_resumes_bit_identical(user, model, tmp_path):
    from _hooks import SigkillBeside

    total = 60
    full, killed = tmp_path / "full", tmp_path / "killed"
    # 3. (started first, checked below) the same run in a process of its own, SIGKILLed after its step-8 checkpoint
    kill = SigkillBeside(_args(user, model, killed, total), killed, step=8, log=tmp_path / "killed.log")
    # 1. uninterrupted, in this process, meanwhile
    assert cli_main(_args(user, model, full, total)) == 0
    summary = json.loads((full / "summary.json").read_text())
    rows = [r for r in read_jsonl(full / "metrics.jsonl") if "loss" in r]
    evals = [r["eval_loss"] for r in read_jsonl(full / "metrics.jsonl") if "eval_loss" in r]
    assert len(rows) == total and math.isfinite(summary["final_eval_loss"])
    assert evals[-1] < evals[0] < math.log(384) + 0.5  # it learns the user's text
    assert summary["bytes_sent_per_replica"] > 0

    # 2. the reported eval is of the global (outer) parameters: recompute it from the checkpoint
    cfg = _cfg(full)
    inputs = prepare_inputs(cfg, user["cache"])
    state = ckpt.load_latest(full)["replicas"][0]
    frags = split_fragments(inputs.model, 2)
    assert frags[1].names[0].startswith("hf.model.layers." if model == "llama" else "hf.transformer.h.")
    with torch.no_grad():  # the parameters themselves, so a tied head (GPT-2) takes the global value too
        for frag, flat in zip(frags, state["algorithm"]["global"], strict=True):
            offset = 0
            for p in frag.params:
                p.copy_(flat[offset : offset + p.numel()].view(p.shape))
                offset += p.numel()
    assert evaluate(inputs.model, inputs.val_batches) == summary["final_eval_loss"]
    inputs.model.load_state_dict(state["model"])  # replica 0's local parameters (alpha = 0.5): not what is reported
    assert evaluate(inputs.model, inputs.val_batches) != summary["final_eval_loss"]

    # 3. killed (SIGKILL) after the step-8 checkpoint, then resumed: bit-identical to the uninterrupted run
    stopped_at = kill.stopped_at()
    assert 8 <= stopped_at < total, "the run was not interrupted"
    assert cli_main(_args(user, model, killed, total, "--resume")) == 0
    a, b = ckpt.load_latest(full), ckpt.load_latest(killed)
    for ra, rb in zip(a["replicas"], b["replicas"], strict=True):
        for k in ra["model"]:
            assert torch.equal(ra["model"][k], rb["model"][k]), k
        for ga, gb in zip(ra["algorithm"]["global"], rb["algorithm"]["global"], strict=True):
            assert torch.equal(ga, gb)
    assert json.loads((killed / "summary.json").read_text())["final_eval_loss"] == summary["final_eval_loss"]
    assert [r["loss"] for r in read_jsonl(killed / "metrics.jsonl") if "loss" in r] == [r["loss"] for r in rows]


# -- bad input: refused before anything is trained or written ----------------------------------

FACTORY = """
import torch.nn.functional as F
from torch import nn


class Bigram(nn.Module):  # no block list: nothing for the fragmenter to split by
    def __init__(self, vocab_size):
        super().__init__()
        self.net = nn.Sequential(nn.Embedding(vocab_size, 16), nn.Linear(16, vocab_size))

    def forward(self, idx, targets=None):
        logits = self.net(idx)
        return logits, None if targets is None else F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def mlp(*, vocab_size, seq_len):
    return Bigram(vocab_size)
"""


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _bad_cases(tmp: Path, user) -> list[tuple[str, list[str], str]]:
    import numpy as np

    (tmp / "empty").mkdir()
    (tmp / "empty" / "a.txt").write_text("\n \n", encoding="utf-8")
    (tmp / "latin1").mkdir()
    (tmp / "latin1" / "caf.txt").write_bytes("Un caf\xe9, s'il vous pla\xeet.\n".encode("latin-1") * 50)
    np.arange(0, 600, dtype=np.uint16).repeat(20).tofile(tmp / "ids.bin")  # ids up to 599
    (tmp / "short.txt").write_text("A few words, and no more.\n", encoding="utf-8")
    (tmp / "nano").mkdir()
    np.arange(40, dtype=np.uint16).tofile(tmp / "nano" / "train.bin")  # one window, less than a batch
    np.arange(4000, dtype=np.uint16).tofile(tmp / "nano" / "val.bin")
    (tmp / "mine.py").write_text(FACTORY)
    (tmp / "lama.json").write_text(json.dumps(LLAMA | {"model_type": "lama"}))
    base = ["--set", "steps=4", "--set", "vocab_size=384", "--set", f"sources={user['text']}"]  # cached text
    return [
        (
            "missing path",
            ["--set", f"sources={tmp / 'nowhere'}"],
            r"nowhere'?: no such file or folder.*give an existing",
        ),
        ("empty corpus", ["--set", f"sources={tmp / 'empty'}"], r"every file is empty.*add text"),
        (
            "not UTF-8",
            ["--set", f"sources={tmp / 'latin1'}"],
            r"caf.txt is not UTF-8 text: byte 0xe9 at offset 6.*iconv",
        ),
        (
            "ids >= vocab",
            ["--set", f"sources={tmp / 'ids.bin'}", "--set", "vocab_size=512"],
            r"ids.bin holds token id 599, which is >= vocab_size=512; set vocab_size to at least 600",
        ),
        (
            "unknown source",
            ["--set", "sources=shakespear"],
            r"'shakespear': no such file or folder; the bundled "
            r"sources are bible, fortunes, gcide",
        ),
        (
            "too small for validation",
            ["--set", f"sources={tmp / 'short.txt'}"],
            r"validation split of \d+ tokens .* fewer than batch_size=8; raise val_fraction or lower seq_len",
        ),
        (
            "too small for one batch",
            ["--set", f"sources={tmp / 'nano'}", "--set", "vocab_size=4096"],
            r"40 tokens make 1 windows .* fewer than batch_size=4\. Lower seq_len or the per-replica batch size",
        ),
        (
            "no blocks for P > 1",
            [
                "--set",
                f"model={tmp / 'mine.py'}:mlp",
                "--method",
                "streaming",
                "--set",
                "num_fragments=2",
                "--set",
                "overlap_steps=0",
            ],
            r"num_fragments=2 needs repeated blocks.*Bigram has none.*--set fragments='prefix\|prefix,prefix",
        ),
        (
            "unknown model type",
            ["--set", f"model=hf:{tmp / 'lama.json'}"],
            r"model_type='lama' is not a model type transformers .* knows; use one such as llama",
        ),
        ("not a model", ["--set", "model=llama"], r"model='llama' is not a model: use '' .*'hf:PATH'"),
    ], base


BAD_CASES = [
    "missing path",
    "unknown source",
    "empty corpus",
    "not UTF-8",
    "ids >= vocab",
    "too small for validation",
    "too small for one batch",
    "no blocks for P > 1",
    "unknown model type",
    "not a model",
]


@pytest.mark.parametrize("case", BAD_CASES)
def test_bad_input_is_refused_before_the_run_directory_is_touched(user, tmp_path, capsys, case):
    cases, base = _bad_cases(tmp_path, user)
    assert sorted(name for name, _, _ in cases) == sorted(BAD_CASES)
    _, extra, message = next(c for c in cases if c[0] == case)
    out = tmp_path / "run"
    out.mkdir()
    (out / "my-results.txt").write_text("earlier results, not to be lost\n")
    before = _snapshot(out)
    common = ["--preset", "tiny", "--cache-dir", str(user["cache"]), "--no-progress", *base, *extra]
    assert cli_main(["train", "--out", str(out), *common]) == 2
    err = capsys.readouterr().err
    assert re.search(message, err, re.S), err
    assert _snapshot(out) == before, "the run directory changed"
    fresh = tmp_path / "fresh"
    assert cli_main(["train", "--out", str(fresh), *common]) == 2
    assert re.search(message, capsys.readouterr().err, re.S)
    assert not fresh.exists(), "a run directory was created"


def test_token_files_and_your_tokenizer_train_and_resume_like_the_bundled_corpus(user, tmp_path):
    """Pre-tokenized ids (nanoGPT .bin, memory-mapped) and a tokenizer.json go through the same trainer:
    the same shards, evaluation and exact resume."""
    import numpy as np
    from _hooks import CrashAfter, SimulatedCrash

    from diloco.data import load_text_documents, train_tokenizer
    from diloco.train.trainer import Trainer

    docs = load_text_documents([str(user["text"])])
    tok = train_tokenizer([d.text for d in docs], 400)
    (tmp_path / "tok").mkdir()
    (tmp_path / "tok" / "tokenizer.json").write_text(tok.to_json(), encoding="utf-8")
    ids = np.concatenate([np.asarray(tok.encode(d.text) + [tok.eod_id], dtype=np.uint16) for d in docs])
    ids.tofile(tmp_path / "corpus.bin")
    from diloco.train.config import load_preset

    base = dict(
        load_preset("tiny")["base"],
        size="tiny",
        seq_len=32,
        global_batch=4,
        replicas=2,
        method="streaming",
        sync_every=4,
        num_fragments=2,
        overlap_steps=1,
        merge_alpha=0.5,
        codec="fp4_e3m0",
        steps=12,
        warmup_steps=2,
        eval_every=6,
        eval_batches=2,
        checkpoint_every=4,
        threads=1,
    )
    by_ids = TrainConfig.from_dict(base | {"sources": [str(tmp_path / "corpus.bin")], "vocab_size": tok.vocab_size})
    by_json = TrainConfig.from_dict(base | {"sources": [str(user["text"])], "tokenizer": str(tmp_path / "tok")})
    results = {}
    for name, cfg in (("ids", by_ids), ("json", by_json)):
        full, cut = tmp_path / f"{name}-full", tmp_path / f"{name}-cut"
        results[name] = Trainer(cfg, full, cache_dir=user["cache"], progress=False).run()
        with pytest.raises(SimulatedCrash):
            Trainer(cfg, cut, cache_dir=user["cache"], progress=False, callbacks=[CrashAfter(6, replicas=2)]).run()
        resumed = Trainer(cfg, cut, cache_dir=user["cache"], progress=False).run(resume=True)
        assert resumed.final_eval_loss == results[name].final_eval_loss
        a, b = ckpt.load_latest(full), ckpt.load_latest(cut)
        for ra, rb in zip(a["replicas"], b["replicas"], strict=True):
            assert all(torch.equal(ra["model"][k], rb["model"][k]) for k in ra["model"])
        assert math.isfinite(results[name].final_eval_loss)
    # the same tokenizer on the same text: the tokenizer.json run reads ids from the same vocabulary
    assert prepare_inputs(by_json, user["cache"]).data.vocab_size == tok.vocab_size


def test_explicit_fragments_for_a_model_without_blocks_from_the_command_line(user, tmp_path):
    """The fix the no-blocks message gives works: --set fragments=PREFIXES splits the model as named."""
    (tmp_path / "mine.py").write_text(FACTORY)
    out = tmp_path / "run"
    args = [
        "train",
        "--preset",
        "tiny",
        "--method",
        "streaming",
        "--out",
        str(out),
        "--cache-dir",
        str(user["cache"]),
        "--no-progress",
        "--set",
        f"sources={user['text']}",
        "--set",
        "vocab_size=384",
        "--set",
        "steps=4",
        "--set",
        f"model={tmp_path / 'mine.py'}:mlp",
        "--set",
        "num_fragments=2",
        "--set",
        "overlap_steps=0",
        "--set",
        "fragments=net.0,net.1",
    ]
    assert cli_main(args) == 0
    sizes = [g.numel() for g in ckpt.load_latest(out)["replicas"][0]["algorithm"]["global"]]
    assert sizes == [384 * 16, 16 * 384 + 384]  # fragment 0: the embedding; fragment 1: the linear head
