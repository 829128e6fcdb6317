"""A model as a folder other code loads: Hugging Face's format, or the project's Transformer in safetensors.

* :func:`save_hf`: a :class:`~diloco.models.hf.CausalLM` through ``save_pretrained`` (``config.json``,
  ``model.safetensors``, ``generation_config.json``) and its tokenizer as a ``PreTrainedTokenizerFast``
  (``tokenizer.json``, ``tokenizer_config.json``): ``transformers.AutoModelForCausalLM.from_pretrained(folder)``
  and ``AutoTokenizer.from_pretrained(folder)`` load it.
* :func:`save_transformer` / :func:`load_transformer`: the project's :class:`~diloco.models.Transformer`
  as ``config.json`` (``{"diloco_model": "Transformer", "model_config": {...}}``), ``model.safetensors``
  (``safetensors.torch.save_model``: tied weights stored once) and ``tokenizer.json``::

      from diloco.models.saving import load_transformer
      model = load_transformer("my-model")          # a Transformer in eval mode, weights in FP32
      logits, _ = model(idx)

* :func:`save_module`: any other ``nn.Module`` (a ``model=module:function`` factory's) as ``model.safetensors``;
  load it into the module your factory builds with ``safetensors.torch.load_model(model, path)``.

Nothing here reads a pickle: safetensors files hold tensors only.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch
from torch import nn

from diloco.errors import ConfigError
from diloco.files import read_json, write_json

__all__ = ["TRANSFORMER_FORMAT", "describe_folder", "load_transformer", "save_hf", "save_module", "save_transformer"]

#: The ``diloco_model`` value of an exported Transformer's ``config.json``.
TRANSFORMER_FORMAT = "Transformer"


def _safetensors_torch():
    try:
        import safetensors.torch
    except ImportError:
        raise ConfigError(
            "exporting needs the safetensors package, which is not installed; install it with: "
            'pip install safetensors (or: pip install -e ".[hf]")'
        ) from None
    return safetensors.torch


def _write_tokenizer_json(folder: Path, tokenizer_json: str | None) -> None:
    if tokenizer_json is not None:
        (folder / "tokenizer.json").write_text(tokenizer_json, encoding="utf-8")


def save_hf(
    model: nn.Module,
    folder: Path | str,
    *,
    tokenizer_json: str | None = None,
    eod_token: str | None = None,
    set_eos: bool = False,
) -> None:
    """``model`` (a :class:`~diloco.models.hf.CausalLM`) and its tokenizer as a Hugging Face folder.

    ``set_eos``: make ``eod_token`` (the run's document separator) the config's ``eos_token_id``, for a
    model trained from a config on a tokenizer of the run's (a pretrained model keeps its own ids).
    """
    from diloco.models.hf import CausalLM, _transformers

    assert isinstance(model, CausalLM), type(model)
    transformers = _transformers()
    folder = Path(folder)
    hf = model.hf
    if tokenizer_json is not None and set_eos and eod_token:
        from tokenizers import Tokenizer

        eod = Tokenizer.from_str(tokenizer_json).token_to_id(eod_token)
        hf.config.eos_token_id = eod
        if getattr(hf, "generation_config", None) is not None:
            hf.generation_config.eos_token_id = eod
    generation = getattr(hf, "generation_config", None)
    for name in ("bos_token_id", "eos_token_id", "pad_token_id") if generation is not None else ():
        value = getattr(generation, name, None)  # a default of the original tokenizer (GPT-2's 50256)
        if isinstance(value, int) and value >= hf.config.vocab_size:
            setattr(generation, name, getattr(hf.config, name, None))
    hf.save_pretrained(folder)
    if tokenizer_json is not None:
        from tokenizers import Tokenizer

        fast = transformers.PreTrainedTokenizerFast(
            tokenizer_object=Tokenizer.from_str(tokenizer_json), eos_token=eod_token
        )
        fast.save_pretrained(folder)


def save_transformer(model: nn.Module, folder: Path | str, *, tokenizer_json: str | None = None) -> None:
    """The project's Transformer as ``config.json`` + ``model.safetensors`` (+ ``tokenizer.json``)."""
    from diloco.models.transformer import Transformer

    assert isinstance(model, Transformer), type(model)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    _safetensors_torch().save_model(model, str(folder / "model.safetensors"))
    write_json(
        folder / "config.json", {"diloco_model": TRANSFORMER_FORMAT, "model_config": dataclasses.asdict(model.config)}
    )
    _write_tokenizer_json(folder, tokenizer_json)


def load_transformer(folder: Path | str, *, device: str | torch.device = "cpu") -> nn.Module:
    """The Transformer :func:`save_transformer` wrote to ``folder``, in eval mode (a ValueError if it is not one)."""
    from diloco.models.transformer import ModelConfig, Transformer

    folder = Path(folder)
    path = folder / "config.json"
    if not path.is_file():
        raise ConfigError(f"{folder} has no config.json: not a model folder written by `diloco export`")
    cfg: Any = read_json(path)
    if not isinstance(cfg, dict) or cfg.get("diloco_model") != TRANSFORMER_FORMAT:
        hint = (
            " (it is a Hugging Face model: load it with transformers.AutoModelForCausalLM.from_pretrained)"
            if isinstance(cfg, dict) and "model_type" in cfg
            else ""
        )
        raise ConfigError(f"{path} does not describe the project's Transformer{hint}")
    fields = {f.name for f in dataclasses.fields(ModelConfig)}
    model = Transformer(ModelConfig(**{k: v for k, v in cfg["model_config"].items() if k in fields}))
    missing, unexpected = _safetensors_torch().load_model(
        model, str(folder / "model.safetensors"), strict=False, device=str(device)
    )
    if missing or unexpected:
        raise ConfigError(
            f"{folder}/model.safetensors does not match its config.json (missing {sorted(missing)[:4]}, "
            f"unexpected {sorted(unexpected)[:4]})"
        )
    return model.to(device).eval()


def save_module(model: nn.Module, folder: Path | str, *, tokenizer_json: str | None = None) -> None:
    """Any module's parameters and buffers as ``model.safetensors`` (+ ``tokenizer.json``)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    _safetensors_torch().save_model(model, str(folder / "model.safetensors"))
    _write_tokenizer_json(folder, tokenizer_json)


def describe_folder(folder: Path | str) -> dict[str, Any]:
    """The files of an exported folder and their sizes (what ``diloco export`` prints)."""
    folder = Path(folder)
    return {p.name: p.stat().st_size for p in sorted(folder.iterdir()) if p.is_file()}
