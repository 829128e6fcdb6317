"""A run's global (outer) parameters as a model folder: ``diloco export RUN --out DIR``.

What is exported is what the run evaluates: the global parameters of a checkpoint (the latest
readable one, or ``step``), as every replica's file holds them (``algorithm["global"]``, one flat FP32
vector per fragment; for data-parallel the replicas' parameters, which are the global ones), never a
replica's local parameters. Buffers come from replica 0's model. A decoupled run's final checkpoint with a
token budget (``learner_budget=tokens``: its learners end at steps of their own) holds the syncer's final global
parameters by name (:data:`~diloco.train.budget_checkpoints.FINAL_GLOBAL`): those are exported.

The model is rebuilt from the run's ``config.json`` (``model=hf:PATH`` reads that folder's config, not
its weights) at the vocabulary the run trained with (kept in every checkpoint), replica 0's state is
loaded into it, and each fragment's flat global vector is copied into the fragment's parameters in
the order :class:`~diloco.algorithm.streaming.StreamingDiLoCo` flattened them. The folder
(:mod:`diloco.models.saving`):

* a Hugging Face model: ``save_pretrained``'s folder with the run's tokenizer (``tokenizer.json`` +
  ``tokenizer_config.json``): ``AutoModelForCausalLM.from_pretrained(DIR)`` loads it;
* the project's Transformer: ``config.json`` + ``model.safetensors`` + ``tokenizer.json``, loaded by
  :func:`diloco.models.saving.load_transformer`;
* a model of your factory: ``model.safetensors`` (+ ``tokenizer.json``).

Every check (a run without a checkpoint, a damaged one, an ``--out`` holding files) comes before anything
is written; the folder is written beside ``out`` and renamed into place at the end, so an interrupted
export leaves no half-written model.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from diloco.errors import ConfigError
from diloco.train import checkpoint as ckpt
from diloco.train.budget_checkpoints import FINAL_GLOBAL

__all__ = ["ExportResult", "export_run", "global_model"]


@dataclass(frozen=True)
class ExportResult:
    out: Path
    step: int
    model_kind: str  # "hf", "transformer" or "factory"
    files: dict[str, int]  # name -> bytes
    skipped: tuple[str, ...] = ()  # newer checkpoints passed over as damaged (one line each)

    def to_dict(self) -> dict[str, Any]:
        return {
            "out": str(self.out),
            "step": self.step,
            "model_kind": self.model_kind,
            "files": self.files,
            "skipped_damaged": list(self.skipped),
        }


def _checkpoint_meta(run_dir: Path, step: int | None) -> tuple[dict[str, Any], tuple[str, ...]]:
    """The record of the checkpoint to export, every replica file checked against its SHA-256, and the
    newer checkpoints skipped as damaged (``step`` None: the newest readable one)."""
    if not run_dir.is_dir():
        raise ConfigError(f"{run_dir} is not a folder; give the --out folder of a `diloco train` run")
    steps = ckpt.saved_steps(run_dir)
    if not steps:
        raise ConfigError(
            f"{run_dir} has no checkpoint ({ckpt.checkpoint_dir(run_dir)} holds none): nothing to "
            f"export. Train it (a checkpoint is written at the end and every checkpoint_every steps) "
            f"or --resume it if it was interrupted before its first checkpoint"
        )
    if step is None:
        found = ckpt.find_resumable(run_dir)  # the newest readable one; raises naming every damaged one
        return found.meta, found.skipped
    if step not in steps:
        raise ConfigError(
            f"{run_dir} has no checkpoint of step {step}; its checkpoints: "
            f"{', '.join(map(str, steps))} (leave out --step for the latest)"
        )
    meta = ckpt._step_meta(run_dir, step)
    for rank in meta.get("folder_replicas", range(int(meta.get("num_replicas", 1)))):  # this folder's replicas
        ckpt.verify_replica(run_dir, rank, step, meta)
    return meta, ()


def _vocab_and_tokenizer(
    run_dir: Path, cfg: Any, meta: dict[str, Any], cache_dir: Path | None
) -> tuple[int, str | None, str | None]:
    """The run's vocabulary size, tokenizer JSON and end-of-document token.

    Written into the run since this version (``tokenizer.json``, the checkpoint's ``vocab_size``); for
    older runs they are rebuilt from the run's data (cached by content)."""
    tok_file = run_dir / "tokenizer.json"
    vocab = meta.get("vocab_size")
    tok_json = tok_file.read_text(encoding="utf-8") if tok_file.is_file() else None
    if vocab is None or (tok_json is None and not _token_sources(cfg)):
        from diloco.data import prepare_data
        from diloco.files import default_cache_dir
        from diloco.train.inputs import run_tokenizer

        tokenizer, _ = run_tokenizer(cfg)
        data = prepare_data(
            cfg.sources,
            vocab_size=cfg.vocab_size,
            cache_dir=cache_dir or default_cache_dir(),
            val_fraction=cfg.val_fraction,
            tokenizer=tokenizer,
            eod_token=cfg.eod_token or None,
            token_dtype=cfg.token_dtype,
        )
        vocab = data.vocab_size
        tok_json = data.tokenizer.to_json() if data.tokenizer is not None else None
    eod = None
    if tok_json is not None:
        from tokenizers import Tokenizer

        from diloco.data.tokenizer import KNOWN_EOD_TOKENS

        tok = Tokenizer.from_str(tok_json)
        eod = cfg.eod_token or next((t for t in KNOWN_EOD_TOKENS if tok.token_to_id(t) is not None), None)
    return int(vocab), tok_json, eod


def _token_sources(cfg: Any) -> bool:
    from diloco.data.sources import are_token_files

    try:
        return are_token_files(cfg.sources)
    except ValueError:
        return False


def global_model(
    run_dir: Path | str, *, step: int | None = None, cache_dir: Path | None = None
) -> tuple[nn.Module, dict[str, Any], Any]:
    """The run's model holding the global parameters of checkpoint ``step`` (default: the latest readable).

    Returns ``(model, checkpoint record, TrainConfig)``; the model is on the CPU, in eval mode. The record's
    ``"skipped_damaged"`` lists newer checkpoints passed over as damaged.
    """
    from diloco.algorithm.fragments import split_fragments
    from diloco.models.factory import build_model
    from diloco.train.config import TrainConfig
    from diloco.train.inputs import run_fragments
    from diloco.train.speed import unwrap_compiled

    run_dir = Path(run_dir)
    meta, skipped = _checkpoint_meta(run_dir, step)
    meta = {**meta, "skipped_damaged": list(skipped)}
    cfg = TrainConfig.from_dict(meta["config"])
    vocab, _, _ = _vocab_and_tokenizer(run_dir, cfg, meta, cache_dir)
    model = unwrap_compiled(
        build_model(
            cfg.model,
            size=cfg.size,
            vocab_size=vocab,
            seq_len=cfg.seq_len,
            seed=cfg.seed,
            z_loss=cfg.z_loss,
            load_weights=False,
        )
    )
    if meta.get("format") == "dcp":  # FSDP workers: worker 0's shards read whole
        return _load_sharded(run_dir, model, meta, cfg), meta, cfg
    # the global parameters are the same in every replica's file: replica 0's, or (a machine's own folder, without a
    # shared file system) the first this folder holds
    state = ckpt.load_replica(run_dir, int(meta.get("folder_replicas", [0])[0]), int(meta["step"]))
    try:
        model.load_state_dict(state["model"])
    except RuntimeError as exc:
        raise ConfigError(
            f"the checkpoint of {run_dir} does not fit the model its config builds now "
            f"(model={cfg.model!r}: was its config changed since the run?): {str(exc)[:300]}"
        ) from None
    if cfg.method != "dp":  # DP's parameters are the global ones; else each fragment's flat global copy
        groups = run_fragments(cfg, model)
        frags = split_fragments(model, cfg.num_fragments, pattern=cfg.fragment_pattern, fragments=groups)
        flats = state["algorithm"]["global"]
        assert len(flats) == len(frags), (len(flats), len(frags))
        with torch.no_grad():  # the parameters themselves: a tied weight takes the global value under every name
            for frag, flat in zip(frags, flats, strict=True):
                assert flat.numel() == sum(p.numel() for p in frag.params), frag.names[:2]
                offset = 0
                for p in frag.params:
                    p.copy_(flat[offset : offset + p.numel()].view(p.shape))
                    offset += p.numel()
    if FINAL_GLOBAL in meta.get("files", {}):  # a token budget's final checkpoint: the syncer's, not learner 0's copy
        _load_final_global(run_dir, model, meta)
    return model.eval(), meta, cfg


def _load_final_global(run_dir: Path, model: nn.Module, meta: dict[str, Any]) -> None:
    """The run's final global parameters (:data:`~diloco.train.budget_checkpoints.FINAL_GLOBAL`, checked against
    its record) into ``model``, by name."""
    step = int(meta["step"])
    ckpt.verify_files(run_dir, step, meta, names=[FINAL_GLOBAL])
    final = torch.load(ckpt.step_dir(run_dir, step) / FINAL_GLOBAL, map_location="cpu", weights_only=True)
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}  # the syncer's (a tied weight once)
    if sorted(params) != sorted(final):
        raise ConfigError(
            f"{ckpt.step_dir(run_dir, step) / FINAL_GLOBAL} does not hold the parameters of the model the run's "
            f"config builds now (was its config changed since the run?)"
        )
    with torch.no_grad():
        for name, value in final.items():
            params[name].copy_(value.view(params[name].shape))


def _load_sharded(run_dir: Path, model: torch.nn.Module, meta: dict[str, Any], cfg: Any) -> torch.nn.Module:
    """The global parameters of a sharded (FSDP workers') checkpoint in ``model``, on the CPU, in eval mode."""
    from diloco.train.sharded_checkpoint import read_full

    full = read_full(run_dir, int(meta["step"]), 0)
    try:
        model.load_state_dict({k[len("model/") :]: v for k, v in full.items() if k.startswith("model/")})
    except RuntimeError as exc:
        raise ConfigError(
            f"the checkpoint of {run_dir} does not fit the model its config builds now "
            f"(model={cfg.model!r}: was its config changed since the run?): {str(exc)[:300]}"
        ) from None
    with torch.no_grad():  # a tied weight is one parameter: it takes the global value under every name
        for name, p in model.named_parameters():
            p.copy_(full[f"global/{name}"])
    return model.eval()


def _check_out(out: Path, run_dir: Path, overwrite: bool) -> None:
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} is a file; give a folder (new or empty) for the model")
    resolved, run = out.resolve(), run_dir.resolve()
    if resolved == run or resolved in run.parents:
        raise ConfigError(
            f"--out {out} holds the run {run_dir} itself; export to another folder (e.g. {run_dir}/model)"
        )
    held = sorted(p.name for p in out.iterdir()) if out.is_dir() else []
    if held and not overwrite:
        shown = ", ".join(held[:5]) + (", ..." if len(held) > 5 else "")
        raise ConfigError(
            f"--out {out} already holds files ({shown}); choose a new or empty folder, or pass "
            f"--overwrite to replace the folder and everything in it"
        )


def export_run(
    run_dir: Path | str,
    *,
    out: Path | str,
    step: int | None = None,
    overwrite: bool = False,
    cache_dir: Path | None = None,
) -> ExportResult:
    """Write the run's global parameters (checkpoint ``step``, default the latest) as a model folder ``out``."""
    from diloco.models.factory import describe_model
    from diloco.models.hf import CausalLM, has_weights
    from diloco.models.saving import describe_folder, save_hf, save_module, save_transformer
    from diloco.models.transformer import Transformer

    run_dir, out = Path(run_dir), Path(out)
    _check_out(out, run_dir, overwrite)  # before the (slower) checks of the checkpoint: nothing is read yet
    model, meta, cfg = global_model(run_dir, step=step, cache_dir=cache_dir)
    _, tok_json, eod = _vocab_and_tokenizer(run_dir, cfg, meta, cache_dir)
    kind = describe_model(cfg.model)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.export-", dir=out.parent))
    try:
        if isinstance(model, CausalLM):
            pretrained = kind == "hf" and has_weights(cfg.model[3:])
            save_hf(model, tmp, tokenizer_json=tok_json, eod_token=eod, set_eos=not pretrained)
        elif isinstance(model, Transformer):
            save_transformer(model, tmp, tokenizer_json=tok_json)
        else:
            save_module(model, tmp, tokenizer_json=tok_json)
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return ExportResult(out, int(meta["step"]), kind, describe_folder(out), tuple(meta["skipped_damaged"]))
