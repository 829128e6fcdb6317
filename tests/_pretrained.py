"""A tiny 'pretrained' Hugging Face Llama as a user has it: a folder that ``save_pretrained`` wrote (config.json,
model.safetensors) with a tokenizer.json made with the ``tokenizers`` library, beside a folder of text."""

from __future__ import annotations

import pydoc
from pathlib import Path

import torch

from diloco.data import train_tokenizer

#: The model's embedding rows; its tokenizer has 300 tokens (padded, as real models' vocabularies are).
MODEL_VOCAB = 320
TOKENIZER_VOCAB = 300


def make_text(folder: Path) -> list[str]:
    """Standard-library documentation as .txt files (real English, not the bundled corpus); their texts."""
    folder.mkdir(parents=True, exist_ok=True)
    for module in ("argparse", "json", "logging", "pathlib"):
        (folder / f"{module}.txt").write_text(pydoc.render_doc(module, renderer=pydoc.plaintext), encoding="utf-8")
    return [p.read_text(encoding="utf-8") for p in sorted(folder.iterdir())]


def make_pretrained_llama(folder: Path, docs: list[str], *, steps: int = 30) -> None:
    """A 2-layer Llama (hidden 32) trained ``steps`` AdamW steps on ``docs``: its loss is well below a random
    initialisation's, so a run that starts from these weights shows it from its first step."""
    import transformers

    cfg = transformers.LlamaConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=MODEL_VOCAB,
        max_position_embeddings=64,
    )
    torch.manual_seed(1234)
    model = transformers.AutoModelForCausalLM.from_config(cfg)
    tok = train_tokenizer(docs, TOKENIZER_VOCAB)
    ids = torch.tensor([i for d in docs for i in tok.encode(d)])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(0)
    for _ in range(steps):
        starts = torch.randint(0, len(ids) - 33, (8,), generator=g)
        batch = torch.stack([ids[s : s + 33] for s in starts.tolist()])
        model(input_ids=batch[:, :-1], labels=batch[:, :-1]).loss.backward()
        opt.step()
        opt.zero_grad()
    model.save_pretrained(folder)
    tok.save(folder / "tokenizer.json")
