"""Which model to train: the project's Transformer, a Hugging Face causal LM, or your own factory.

``model`` (``TrainConfig.model``, ``--set model=...``) is one string:

* ``""`` (default): the project's :class:`~diloco.models.Transformer` of the named ``size``;
* ``"hf:PATH"``: a ``transformers`` causal LM from a local folder (its safetensors weights when it
  has them, and its tokenizer.json) or config JSON file (:mod:`diloco.models.hf`; nothing downloaded);
* ``"MODULE:FUNCTION"`` or ``"path/to/file.py:FUNCTION"``: your code, called as
  ``FUNCTION(vocab_size=..., seq_len=...)``; it returns an ``nn.Module`` whose ``forward(idx,
  targets)`` returns ``(logits, loss)`` (a ``transformers`` ``PreTrainedModel`` is wrapped in
  :class:`~diloco.models.hf.CausalLM` for you). The module is imported, i.e. your code runs:
  name only code you trust. Presets stay JSON and are never executed.

:func:`build_model` seeds torch first, so every process builds the same initial weights.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from diloco.errors import ConfigError

__all__ = ["build_model", "check_model", "describe_model", "load_factory"]

_FACTORY = re.compile(r"^(?P<module>[A-Za-z_][\w.]*|.+\.py):(?P<func>[A-Za-z_]\w*)$")


def describe_model(spec: str) -> str:
    """``"transformer"``, ``"hf"`` or ``"factory"``; a ValueError for a spec that is none of them."""
    if not isinstance(spec, str):
        raise ConfigError(
            f"model={spec!r}: give a string: '' (the project's Transformer), 'hf:PATH' or 'module:function'"
        )
    if spec == "":
        return "transformer"
    if spec.startswith("hf:"):
        if not spec[3:]:
            raise ConfigError(
                "model='hf:': name the config, e.g. model=hf:configs/llama-tiny (a folder with "
                "config.json) or model=hf:llama.json"
            )
        return "hf"
    if _FACTORY.match(spec):
        return "factory"
    raise ConfigError(
        f"model={spec!r} is not a model: use '' for the project's Transformer (its size from "
        f"size=...), 'hf:PATH' for a Hugging Face config, or 'module:function' / 'file.py:function' "
        f"for your own factory"
    )


def check_model(spec: str) -> str:
    """What can be checked of ``spec`` before the data exists: its form, the HF config, the factory's import."""
    kind = describe_model(spec)
    if kind == "hf":
        from diloco.models.hf import check_model_type, has_weights

        check_model_type(spec[3:])
        has_weights(spec[3:])  # a pickled checkpoint in the folder is refused now
    elif kind == "factory":
        load_factory(spec)
    return kind


def load_factory(spec: str) -> Callable[..., Any]:
    """The function ``spec`` ("module:function" or "file.py:function") names; imports it (runs your code)."""
    m = _FACTORY.match(spec)
    if m is None:
        describe_model(spec)  # raises with the forms that work
    module_name, func = m["module"], m["func"]
    if module_name.endswith(".py"):
        path = Path(module_name).expanduser()
        if not path.is_file():
            raise ConfigError(f"model={spec!r}: {path} does not exist; give the path of your .py file")
        unique = f"diloco_user_model_{abs(hash(str(path.resolve())))}"
        mod_spec = importlib.util.spec_from_file_location(unique, path)
        assert mod_spec is not None and mod_spec.loader is not None
        module = importlib.util.module_from_spec(mod_spec)
        sys.modules[unique] = module
        mod_spec.loader.exec_module(module)
    else:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            raise ConfigError(
                f"model={spec!r}: cannot import module {module_name!r} ({exc}); put it on PYTHONPATH "
                f"or give the file: model=path/to/{module_name.rsplit('.', 1)[-1]}.py:{func}"
            ) from None
    fn = getattr(module, func, None)
    if not callable(fn):
        raise ConfigError(
            f"model={spec!r}: {module_name} has no function {func!r}; name a function that returns an nn.Module"
        )
    return fn


def _is_hf_pretrained(model: nn.Module) -> bool:
    try:
        from transformers import PreTrainedModel
    except ImportError:
        return False
    return isinstance(model, PreTrainedModel)


def build_model(
    spec: str, *, size: str, vocab_size: int, seq_len: int, seed: int, z_loss: float = 1e-4, load_weights: bool = True
) -> nn.Module:
    """The model ``spec`` names (see the module docstring), initialised after ``torch.manual_seed(seed)``.

    ``load_weights=False``: an ``hf:`` folder's architecture without reading its weights (a skeleton to
    load a checkpoint into)."""
    kind = describe_model(spec)
    torch.manual_seed(seed)
    if kind == "transformer":
        from diloco.models import Transformer, make_config

        return Transformer(make_config(size, vocab_size=vocab_size, seq_len=seq_len, z_loss=z_loss))
    if kind == "hf":
        from diloco.models.hf import build_hf_model

        return build_hf_model(spec[3:], vocab_size=vocab_size, seq_len=seq_len, load_weights=load_weights)
    model = load_factory(spec)(vocab_size=vocab_size, seq_len=seq_len)
    if _is_hf_pretrained(model):
        from diloco.models.hf import CausalLM

        model = CausalLM(model)
    if not isinstance(model, nn.Module):
        raise ConfigError(
            f"model={spec!r} returned a {type(model).__name__}, not a torch.nn.Module; return the "
            f"model (forward(idx, targets) -> (logits, loss))"
        )
    if not any(p.requires_grad for p in model.parameters()):
        raise ConfigError(f"model={spec!r} returned a module with no trainable parameters")
    return model
