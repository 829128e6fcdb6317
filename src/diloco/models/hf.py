"""Hugging Face ``transformers`` causal LMs (Llama, GPT-2, Qwen2, ...) built from a local config.

An optional extra (``pip install -e ".[hf]"``). Nothing is downloaded: the model is built with
random weights from a config you give as

* a folder holding ``config.json`` (as ``save_pretrained`` writes it), or
* a ``.json`` file of config fields with a ``model_type`` (``{"model_type": "llama",
  "hidden_size": 256, ...}``), or that mapping itself.

``vocab_size`` defaults to the data's (the tokenizer's) and must not be smaller; the context
(``max_position_embeddings`` / ``n_positions``) must cover the training sequence length. Dropout
fields you do not set are 0 (pretraining, and a resumed run repeats the same steps bit for bit).

The model is wrapped in :class:`CausalLM`, whose ``forward(idx, targets)`` returns ``(logits,
loss)`` like :class:`diloco.models.Transformer`, so the trainer, the evaluation and the
fragmenter use it unchanged: the fragmenter finds its blocks (``model.layers`` in Llama and Qwen2,
``transformer.h`` in GPT-2; see :func:`diloco.algorithm.fragments.find_blocks`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["CausalLM", "build_hf_model", "check_model_type", "load_hf_config_fields"]

INSTALL = 'pip install "transformers>=4.46" (or: pip install -e ".[hf]")'

# Context-length fields of the common configs, and dropout fields, by name.
_CONTEXT_FIELDS = ("max_position_embeddings", "n_positions", "n_ctx", "seq_length")
_DROPOUT_FIELDS = ("attention_dropout", "hidden_dropout", "resid_pdrop", "embd_pdrop", "attn_pdrop",
                   "summary_first_dropout", "dropout", "hidden_dropout_prob", "attention_probs_dropout_prob")


def _transformers():
    try:
        import transformers
    except ImportError:
        raise ValueError(f"a Hugging Face model needs the transformers package, which is not installed; "
                         f"install it with: {INSTALL}") from None
    return transformers


class CausalLM(nn.Module):
    """A ``transformers`` causal LM with the project's interface: ``forward(idx, targets) -> (logits, loss)``.

    The loss is the mean next-token cross-entropy of ``logits`` against ``targets`` (already
    shifted by the data pipeline), computed in FP32.
    """

    def __init__(self, hf_model: nn.Module) -> None:
        super().__init__()
        self.hf = hf_model

    @property
    def config(self) -> Any:
        return self.hf.config

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        logits = self.hf(input_ids=idx, use_cache=False).logits
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
        return logits, loss


def load_hf_config_fields(spec: str | Path | Mapping[str, Any]) -> dict[str, Any]:
    """The config fields of ``spec`` (a folder with config.json, a .json file, or a mapping), checked."""
    if isinstance(spec, Mapping):
        fields = dict(spec)
        where = "the config mapping"
    else:
        path = Path(spec).expanduser()
        file = path / "config.json" if path.is_dir() else path
        if not file.is_file():
            raise ValueError(f"Hugging Face config {str(spec)!r}: no such file{' (config.json)' if path.is_dir() else ''}; "
                             f"give a folder holding config.json or a .json file of config fields with a "
                             f"model_type, e.g. {{\"model_type\": \"llama\", \"hidden_size\": 256}}")
        try:
            fields = json.loads(file.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueError(f"{file} is not a JSON config ({exc}); write it as JSON (it is never executed)") from None
        where = str(file)
        if not isinstance(fields, dict):
            raise ValueError(f"{file} holds a {type(fields).__name__}, not a JSON object of config fields")
    model_type = fields.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        raise ValueError(f"{where} has no model_type; add one, e.g. \"model_type\": \"llama\" (or gpt2, qwen2, ...)")
    return fields


def check_model_type(spec: str | Path | Mapping[str, Any]) -> str:
    """The config's ``model_type`` if transformers knows it as a causal LM (checked before any data work)."""
    model_type = load_hf_config_fields(spec)["model_type"]
    transformers = _transformers()
    if model_type not in transformers.CONFIG_MAPPING:
        raise ValueError(f"model_type={model_type!r} is not a model type transformers "
                         f"{transformers.__version__} knows; use one such as llama, gpt2, qwen2, mistral")
    return model_type


def build_hf_model(spec: str | Path | Mapping[str, Any], *, vocab_size: int, seq_len: int) -> CausalLM:
    """A randomly initialised ``AutoModelForCausalLM`` from a local config, wrapped in :class:`CausalLM`.

    Seed torch before calling for a reproducible initialisation.
    """
    fields = load_hf_config_fields(spec)
    transformers = _transformers()
    model_type = fields.pop("model_type")
    for key in ("architectures", "transformers_version", "_name_or_path", "torch_dtype", "dtype"):
        fields.pop(key, None)
    given_vocab = fields.get("vocab_size")
    if given_vocab is None:
        fields["vocab_size"] = int(vocab_size)
    elif not isinstance(given_vocab, int) or given_vocab < vocab_size:
        raise ValueError(f"the model config's vocab_size={given_vocab!r} is smaller than the data's vocabulary "
                         f"({vocab_size} ids); remove vocab_size from the config (it then follows the data) "
                         f"or set it to at least {vocab_size}")
    for name in _DROPOUT_FIELDS:
        fields.setdefault(name, 0.0)
    try:
        config = transformers.AutoConfig.for_model(model_type, **fields)
    except ValueError as exc:
        if "Unrecognized model identifier" in str(exc):
            raise ValueError(f"model_type={model_type!r} is not a model type transformers "
                             f"{transformers.__version__} knows; use one such as llama, gpt2, qwen2, mistral") from None
        raise ValueError(f"invalid {model_type} config: {exc}") from None
    for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value >= config.vocab_size and name not in fields:
            setattr(config, name, None)  # a default from the original tokenizer (e.g. GPT-2's 50256)
    context = next((getattr(config, f) for f in _CONTEXT_FIELDS if isinstance(getattr(config, f, None), int)), None)
    if context is not None and context < seq_len:
        field = next((f for f in _CONTEXT_FIELDS if f in fields),  # the name the user wrote
                     next(f for f in _CONTEXT_FIELDS if getattr(config, f, None) == context))
        raise ValueError(f"the model config's {field}={context} is shorter than seq_len={seq_len}; set {field} "
                         f">= {seq_len} in the config or lower seq_len")
    try:
        model = transformers.AutoModelForCausalLM.from_config(config)
    except ValueError as exc:
        raise ValueError(f"transformers has no causal LM for model_type={model_type!r} ({exc}); use a decoder "
                         f"such as llama, gpt2 or qwen2") from None
    return CausalLM(model)
