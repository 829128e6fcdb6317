"""Hugging Face ``transformers`` causal LMs (Llama, GPT-2, Qwen2, ...) from a local folder or config.

An optional extra (``pip install -e ".[hf]"``). Nothing is downloaded. The model comes from

* a folder as ``save_pretrained`` writes it: ``config.json`` and, when present, its weights
  (``model.safetensors``, or shards named by ``model.safetensors.index.json``), which are loaded:
  *pretrained in*. Only safetensors are read (a ``pytorch_model.bin`` is a pickle, which can run
  code: convert it with ``save_pretrained``). The folder's ``tokenizer.json`` is the run's
  tokenizer unless ``tokenizer=`` names another (:func:`folder_tokenizer`); or
* a folder with only ``config.json``, a ``.json`` file of config fields with a ``model_type``
  (``{"model_type": "llama", "hidden_size": 256, ...}``), or that mapping itself: random weights.

From a config, ``vocab_size`` defaults to the data's (the tokenizer's) and must not be smaller, and
dropout fields you do not set are 0 (pretraining, and a resumed run repeats the same steps bit for
bit). Pretrained, the folder's config is used as saved: its ``vocab_size`` must cover the data's ids.
Either way the context (``max_position_embeddings`` / ``n_positions``) must cover the training
sequence length.

The model is wrapped in :class:`CausalLM`, whose ``forward(idx, targets)`` returns ``(logits,
loss)`` like :class:`diloco.models.Transformer`, so the trainer, the evaluation and the
fragmenter use it unchanged: the fragmenter finds its blocks (``model.layers`` in Llama and Qwen2,
``transformer.h`` in GPT-2; see :func:`diloco.algorithm.fragments.find_blocks`).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from diloco.errors import ConfigError

__all__ = [
    "CausalLM",
    "WEIGHT_FILES",
    "build_hf_model",
    "check_model_type",
    "folder_tokenizer",
    "has_weights",
    "load_hf_config_fields",
]

INSTALL = 'pip install "transformers>=4.46" (or: pip install -e ".[hf]")'

#: What ``save_pretrained`` writes as weights: one safetensors file, or the index of its shards.
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json")
_PICKLED_WEIGHTS = ("pytorch_model.bin", "pytorch_model.bin.index.json", "model.pt", "model.pth")

# Context-length fields of the common configs, and dropout fields, by name.
_CONTEXT_FIELDS = ("max_position_embeddings", "n_positions", "n_ctx", "seq_length")
_DROPOUT_FIELDS = (
    "attention_dropout",
    "hidden_dropout",
    "resid_pdrop",
    "embd_pdrop",
    "attn_pdrop",
    "summary_first_dropout",
    "dropout",
    "hidden_dropout_prob",
    "attention_probs_dropout_prob",
)


def _transformers():
    try:
        import transformers
    except ImportError:
        raise ConfigError(
            f"a Hugging Face model needs the transformers package, which is not installed; install it with: {INSTALL}"
        ) from None
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

    def forward(
        self, idx: torch.Tensor, targets: torch.Tensor | None = None
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
            raise ConfigError(
                f"Hugging Face config {str(spec)!r}: no such file{' (config.json)' if path.is_dir() else ''}; "
                f"give a folder holding config.json or a .json file of config fields with a "
                f'model_type, e.g. {{"model_type": "llama", "hidden_size": 256}}'
            )
        try:
            fields = json.loads(file.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ConfigError(f"{file} is not a JSON config ({exc}); write it as JSON (it is never executed)") from None
        where = str(file)
        if not isinstance(fields, dict):
            raise ConfigError(f"{file} holds a {type(fields).__name__}, not a JSON object of config fields")
    model_type = fields.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        raise ConfigError(f'{where} has no model_type; add one, e.g. "model_type": "llama" (or gpt2, qwen2, ...)')
    return fields


def check_model_type(spec: str | Path | Mapping[str, Any]) -> str:
    """The config's ``model_type`` if transformers knows it as a causal LM (checked before any data work)."""
    model_type = load_hf_config_fields(spec)["model_type"]
    transformers = _transformers()
    if model_type not in transformers.CONFIG_MAPPING:
        raise ConfigError(
            f"model_type={model_type!r} is not a model type transformers "
            f"{transformers.__version__} knows; use one such as llama, gpt2, qwen2, mistral"
        )
    return model_type


def _folder(spec: str | Path | Mapping[str, Any]) -> Path | None:
    if isinstance(spec, Mapping):
        return None
    path = Path(spec).expanduser()
    return path if path.is_dir() else None


def has_weights(spec: str | Path | Mapping[str, Any]) -> bool:
    """Whether ``spec`` is a folder holding weights (safetensors); a pickled checkpoint there is a ValueError."""
    folder = _folder(spec)
    if folder is None:
        return False
    if any((folder / name).is_file() for name in WEIGHT_FILES):
        return True
    pickled = [name for name in _PICKLED_WEIGHTS if (folder / name).is_file()]
    if pickled:
        raise ConfigError(
            f"{folder} holds weights as {pickled[0]}, a pickle (loading it could run code); only "
            f"safetensors are loaded: convert it once, in a trusted environment, with "
            f"AutoModelForCausalLM.from_pretrained({str(folder)!r}).save_pretrained({str(folder)!r}) "
            f"(writes model.safetensors), or remove it to train from random weights"
        )
    return False


def folder_tokenizer(spec: str | Path | Mapping[str, Any]) -> Path | None:
    """The ``tokenizer.json`` beside a model folder's config, if there is one (the run's default tokenizer)."""
    folder = _folder(spec)
    if folder is None or not (folder / "tokenizer.json").is_file():
        return None
    return folder / "tokenizer.json"


def build_hf_model(
    spec: str | Path | Mapping[str, Any], *, vocab_size: int, seq_len: int, load_weights: bool = True
) -> CausalLM:
    """An ``AutoModelForCausalLM`` from a local folder or config, wrapped in :class:`CausalLM`.

    A folder with weights (:func:`has_weights`) gives the pretrained model in FP32 (``load_weights=False``:
    the same architecture, randomly initialised); anything else a randomly initialised model. Seed torch
    before calling for a reproducible initialisation.
    """
    if has_weights(spec):
        return _pretrained(_folder(spec), vocab_size=vocab_size, seq_len=seq_len, load_weights=load_weights)
    fields = load_hf_config_fields(spec)
    transformers = _transformers()
    model_type = fields.pop("model_type")
    for key in ("architectures", "transformers_version", "_name_or_path", "torch_dtype", "dtype"):
        fields.pop(key, None)
    given_vocab = fields.get("vocab_size")
    if given_vocab is None:
        fields["vocab_size"] = int(vocab_size)
    elif not isinstance(given_vocab, int) or given_vocab < vocab_size:
        raise ConfigError(
            f"the model config's vocab_size={given_vocab!r} is smaller than the data's vocabulary "
            f"({vocab_size} ids); remove vocab_size from the config (it then follows the data) "
            f"or set it to at least {vocab_size}"
        )
    for name in _DROPOUT_FIELDS:
        fields.setdefault(name, 0.0)
    try:
        config = transformers.AutoConfig.for_model(model_type, **fields)
    except ValueError as exc:
        if "Unrecognized model identifier" in str(exc):
            raise ConfigError(
                f"model_type={model_type!r} is not a model type transformers "
                f"{transformers.__version__} knows; use one such as llama, gpt2, qwen2, mistral"
            ) from None
        raise ConfigError(f"invalid {model_type} config: {exc}") from None
    for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value >= config.vocab_size and name not in fields:
            setattr(config, name, None)  # a default from the original tokenizer (e.g. GPT-2's 50256)
    _check_context(config, seq_len, fields)
    try:
        model = transformers.AutoModelForCausalLM.from_config(config)
    except ValueError as exc:
        raise ConfigError(
            f"transformers has no causal LM for model_type={model_type!r} ({exc}); use a decoder "
            f"such as llama, gpt2 or qwen2"
        ) from None
    return CausalLM(model)


def _check_context(config: Any, seq_len: int, fields: Mapping[str, Any]) -> None:
    context = next((getattr(config, f) for f in _CONTEXT_FIELDS if isinstance(getattr(config, f, None), int)), None)
    if context is not None and context < seq_len:
        field = next(
            (f for f in _CONTEXT_FIELDS if f in fields),  # the name the user wrote
            next(f for f in _CONTEXT_FIELDS if getattr(config, f, None) == context),
        )
        raise ConfigError(
            f"the model config's {field}={context} is shorter than seq_len={seq_len}; set {field} "
            f">= {seq_len} in the config or lower seq_len"
        )


@contextlib.contextmanager
def _quiet(transformers: Any) -> Iterator[None]:
    """No progress bars or load reports from transformers (the errors below say what matters)."""
    log = transformers.utils.logging
    verbosity, bars = log.get_verbosity(), log.is_progress_bar_enabled()
    log.set_verbosity_error()
    log.disable_progress_bar()
    try:
        yield
    finally:
        log.set_verbosity(verbosity)
        if bars:
            log.enable_progress_bar()


def _pretrained(folder: Path, *, vocab_size: int, seq_len: int, load_weights: bool) -> CausalLM:
    """The pretrained model of ``folder`` in FP32, checked against the data and its own config."""
    transformers = _transformers()
    fields = load_hf_config_fields(folder)
    check_model_type(folder)
    try:
        config = transformers.AutoConfig.from_pretrained(folder, local_files_only=True)
    except (OSError, ValueError) as exc:
        raise ConfigError(
            f"{folder}/config.json cannot be read by transformers {transformers.__version__} ({exc})"
        ) from None
    if config.vocab_size < vocab_size:
        raise ConfigError(
            f"the data's vocabulary ({vocab_size} ids) is larger than that of the pretrained model in "
            f"{folder} (vocab_size={config.vocab_size}): ids >= {config.vocab_size} have no embedding. "
            f"Use the model's own tokenizer (a tokenizer.json in {folder} is used by default; "
            f"tokenizer=... overrides it) or token files whose ids are < {config.vocab_size}"
        )
    _check_context(config, seq_len, fields)
    if not load_weights:
        return CausalLM(transformers.AutoModelForCausalLM.from_config(config))
    try:
        with _quiet(transformers):
            model, info = transformers.AutoModelForCausalLM.from_pretrained(
                folder,
                config=config,
                local_files_only=True,
                use_safetensors=True,
                output_loading_info=True,
                **_fp32(transformers),
            )
    except RuntimeError as exc:  # size mismatch (transformers prints the details to its logger)
        raise ConfigError(
            f"the weights in {folder} do not match its config.json: "
            f"{_mismatches(folder, config) or exc}; restore the config the weights were saved with "
            f"(save_pretrained writes both)"
        ) from None
    except OSError as exc:
        raise ConfigError(f"cannot read the weights in {folder} ({exc})") from None
    missing, unexpected = sorted(info.get("missing_keys", ())), sorted(info.get("unexpected_keys", ()))
    if missing or unexpected:
        parts = [
            f"{len(keys)} {label} weight(s) ({', '.join(keys[:4])}{', ...' if len(keys) > 4 else ''})"
            for label, keys in (("missing", missing), ("unexpected", unexpected))
            if keys
        ]
        raise ConfigError(
            f"the weights in {folder} do not match its config.json: {'; '.join(parts)}; "
            f"restore the config the weights were saved with (save_pretrained writes both)"
        )
    return CausalLM(model)


def _fp32(transformers: Any) -> dict[str, Any]:
    """FP32 weights whatever the folder was saved in (the trainer's autocast does bf16): the keyword's name
    changed in transformers 4.56 (``torch_dtype`` -> ``dtype``)."""
    major, minor = (int(p) for p in transformers.__version__.split(".")[:2])
    return {"dtype" if (major, minor) >= (4, 56) else "torch_dtype": torch.float32}


def _mismatches(folder: Path, config: Any) -> str:
    """``name: saved shape vs config shape`` for the first weights whose shapes differ (for the error)."""
    from safetensors import safe_open

    transformers = _transformers()
    with torch.device("meta"):
        expected = {
            k: tuple(v.shape) for k, v in transformers.AutoModelForCausalLM.from_config(config).state_dict().items()
        }
    index = folder / "model.safetensors.index.json"
    files = (
        sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.is_file() else ["model.safetensors"]
    )
    out = []
    for name in files:
        with safe_open(folder / name, framework="pt") as f:
            for key in f.keys():
                saved = tuple(f.get_slice(key).get_shape())
                if key in expected and expected[key] != saved:
                    out.append(f"{key} is {list(saved)} in the weights, {list(expected[key])} by the config")
    return "; ".join(out[:3]) + (f" (and {len(out) - 3} more)" if len(out) > 3 else "")
