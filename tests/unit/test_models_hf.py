"""Your model: Hugging Face causal LMs from a local config, your own factory, explicit fragments; and bad input."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from diloco.algorithm.fragments import find_blocks, fragments_from_prefixes, split_fragments
from diloco.models.factory import build_model, describe_model
from diloco.models.hf import CausalLM, build_hf_model

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
QWEN2 = {
    "model_type": "qwen2",
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 64,
}


@pytest.mark.parametrize(
    "fields, blocks",
    [(LLAMA, "hf.model.layers"), (GPT2, "hf.transformer.h"), (QWEN2, "hf.model.layers")],
    ids=["llama", "gpt2", "qwen2"],
)
def test_hf_models_train_and_split_like_the_projects(fields, blocks, tmp_path):
    folder = tmp_path / "cfg"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(fields))
    torch.manual_seed(0)
    model = build_hf_model(folder, vocab_size=300, seq_len=16)
    torch.manual_seed(0)
    same = build_hf_model(dict(fields), vocab_size=300, seq_len=16)  # the mapping form builds the same model
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), same.state_dict().values()))
    assert isinstance(model, CausalLM) and model.config.vocab_size == 300  # follows the data
    x = torch.randint(0, 300, (2, 16))
    logits, loss = model(x, torch.roll(x, -1, 1))
    assert logits.shape == (2, 16, 300) and 4.5 < loss.item() < 7.0  # ~ log(300) = 5.7 at init
    name, found = find_blocks(model)
    assert name == blocks and len(found) == 4
    for pattern, expect in (("strided", [[0, 2], [1, 3]]), ("sequential", [[0, 1], [2, 3]])):
        frags = split_fragments(model, 3, pattern=pattern)
        for frag, idx in zip(frags[1:], expect, strict=True):
            assert {int(n[len(blocks) + 1 :].split(".")[0]) for n in frag.names} == set(idx)
        assert not any(n.startswith(blocks + ".") for n in frags[0].names)  # embeddings, final norm, head
        assert sum(f.numel for f in frags) == sum(p.numel() for p in model.parameters())


def test_gpt2_dropout_off_unless_asked_and_tied_head(tmp_path):
    model = build_hf_model(GPT2, vocab_size=300, seq_len=16)
    assert model.config.resid_pdrop == 0.0 and model.config.attn_pdrop == 0.0
    assert model.hf.lm_head.weight is model.hf.transformer.wte.weight  # tied: one parameter, in fragment 0
    assert build_hf_model(GPT2 | {"resid_pdrop": 0.2}, vocab_size=300, seq_len=16).config.resid_pdrop == 0.2


@pytest.mark.parametrize(
    "fields, seq_len, message",
    [
        (
            LLAMA | {"vocab_size": 100},
            16,
            r"vocab_size=100 is smaller than the data's vocabulary \(300 ids\); remove "
            r"vocab_size from the config .* or set it to at least 300",
        ),
        (LLAMA, 128, r"max_position_embeddings=64 is shorter than seq_len=128; set max_position_embeddings >= 128"),
        (GPT2, 100, r"n_positions=64 is shorter than seq_len=100"),
        (
            LLAMA | {"model_type": "lama"},
            16,
            r"model_type='lama' is not a model type transformers .* knows; use one "
            r"such as llama, gpt2, qwen2",
        ),
        ({"hidden_size": 32}, 16, r"has no model_type; add one, e.g. \"model_type\": \"llama\""),
    ],
)
def test_bad_hf_configs_name_the_value_and_the_fix(fields, seq_len, message):
    with pytest.raises(ValueError, match=message):
        build_hf_model(fields, vocab_size=300, seq_len=seq_len)


def test_missing_hf_config_path(tmp_path):
    with pytest.raises(ValueError, match=r"'.*nowhere': no such file.*give a folder holding config.json"):
        build_hf_model(tmp_path / "nowhere", vocab_size=300, seq_len=16)
    (tmp_path / "bad.json").write_text("model_type = 'llama'")
    with pytest.raises(ValueError, match=r"bad.json is not a JSON config.*never executed"):
        build_hf_model(tmp_path / "bad.json", vocab_size=300, seq_len=16)


FACTORY = """
import torch
from torch import nn
import torch.nn.functional as F


class Bigram(nn.Module):
    def __init__(self, vocab_size):
        super().__init__()
        self.table = nn.Embedding(vocab_size, vocab_size)

    def forward(self, idx, targets=None):
        logits = self.table(idx)
        loss = None if targets is None else F.cross_entropy(logits.flatten(0, 1), targets.flatten())
        return logits, loss


def bigram(*, vocab_size, seq_len):
    return Bigram(vocab_size)


def hf_llama(*, vocab_size, seq_len):
    from transformers import LlamaConfig, LlamaForCausalLM
    return LlamaForCausalLM(LlamaConfig(vocab_size=vocab_size, hidden_size=32, intermediate_size=64,
                                        num_hidden_layers=2, num_attention_heads=2, max_position_embeddings=seq_len))


def not_a_model(*, vocab_size, seq_len):
    return "oops"
"""


def test_your_factory_by_file_or_module(tmp_path, monkeypatch):
    path = tmp_path / "my_models.py"
    path.write_text(FACTORY)
    by_file = build_model(f"{path}:bigram", size="tiny", vocab_size=50, seq_len=8, seed=3)
    monkeypatch.syspath_prepend(str(tmp_path))
    by_module = build_model("my_models:bigram", size="tiny", vocab_size=50, seq_len=8, seed=3)
    assert torch.equal(by_file.table.weight, by_module.table.weight)  # seeded the same way
    wrapped = build_model("my_models:hf_llama", size="tiny", vocab_size=50, seq_len=8, seed=0)
    assert isinstance(wrapped, CausalLM)  # a PreTrainedModel is wrapped for you
    with pytest.raises(ValueError, match=r"returned a str, not a torch.nn.Module"):
        build_model("my_models:not_a_model", size="tiny", vocab_size=50, seq_len=8, seed=0)
    with pytest.raises(ValueError, match=r"my_models has no function 'missing'"):
        build_model("my_models:missing", size="tiny", vocab_size=50, seq_len=8, seed=0)
    with pytest.raises(ValueError, match=r"cannot import module 'nomodule'.*put it on PYTHONPATH"):
        build_model("nomodule:build", size="tiny", vocab_size=50, seq_len=8, seed=0)


def test_unknown_model_spec_names_the_forms_that_work():
    assert describe_model("") == "transformer" and describe_model("hf:x") == "hf"
    assert describe_model("pkg.mod:fn") == "factory"
    with pytest.raises(ValueError, match=r"model='llama' is not a model: use '' .*'hf:PATH'.*'module:function'"):
        describe_model("llama")


def test_a_model_without_blocks_says_how_to_pass_fragments():
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    with pytest.raises(
        ValueError,
        match=r"num_fragments=2 needs repeated blocks.*has none: pass explicit "
        r"fragments=.*--set fragments='prefix\|prefix,prefix,...'",
    ):
        split_fragments(model, 2)
    groups = fragments_from_prefixes(model, ["0", "2"])
    frags = split_fragments(model, 2, fragments=groups)
    assert [f.names for f in frags] == [("0.weight", "0.bias"), ("2.weight", "2.bias")]
    with pytest.raises(ValueError, match=r"leave trainable parameters in no fragment: \['2.weight', '2.bias'\]"):
        fragments_from_prefixes(model, ["0"])
