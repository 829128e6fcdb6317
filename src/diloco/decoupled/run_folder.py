"""The ``diloco syncer`` service's ``--out`` folder: whether a folder may be used (:func:`plan_out`: new, empty, or a
previous run of the same config, resumed; nothing a user wrote is overwritten) and the run's result written into it
at the end (:func:`write_final_checkpoint`: what ``diloco export`` reads). See :mod:`diloco.decoupled.service`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from diloco.errors import ConfigError


def _config_differences(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    return [
        f"{k}: {old.get(k)!r} there, {new.get(k)!r} now"
        for k in sorted(set(old) | set(new))
        if old.get(k) != new.get(k)
    ]


def plan_out(out: Path, cfg: Any) -> dict[str, Any] | None:
    """Reads only: None for a new or empty ``out``; the previous ``syncer.json`` when ``out`` holds a
    ``diloco syncer`` run of this same config (resumed); else a ConfigError (nothing is overwritten)."""
    from diloco.files import read_json

    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} is a file: give a new or empty folder")
    held = sorted(p.name for p in out.iterdir()) if out.is_dir() else []
    if not held:
        return None
    if not (out / "syncer.json").is_file() or not (out / "config.json").is_file():
        shown = ", ".join(held[:5]) + (", ..." if len(held) > 5 else "")
        raise ConfigError(
            f"--out {out} holds files ({shown}) but no `diloco syncer` run: give a new or empty folder "
            f"(nothing is overwritten)"
        )
    differences = _config_differences(read_json(out / "config.json"), cfg.to_dict())
    if differences:
        raise ConfigError(
            f"--out {out} holds a syncer run of another config ({'; '.join(differences)}): resume it with "
            f"its own settings, or give a new --out"
        )
    return read_json(out / "syncer.json")


def write_final_checkpoint(
    out: Path, cfg: Any, template: Any, named: dict[str, Any], *, vocab_size: int, data_digest: str, step: int
) -> None:
    """The syncer's global parameters ``named`` as replica 0's committed checkpoint of ``step`` in ``out``
    (what ``diloco export`` reads: the model's state with the global values, and each fragment's flat copy)."""
    import copy

    import torch

    from diloco.algorithm.fragments import flatten, split_fragments
    from diloco.train import checkpoint as ckpt
    from diloco.train.inputs import run_fragments

    model = copy.deepcopy(template)
    params = dict(model.named_parameters())
    assert set(named) == set(params), sorted(set(named) ^ set(params))[:4]
    with torch.no_grad():
        for name, value in named.items():
            params[name].copy_(value)
    frags = split_fragments(model, cfg.num_fragments, pattern=cfg.fragment_pattern, fragments=run_fragments(cfg, model))
    state = {"model": model.state_dict(), "algorithm": {"global": [flatten(f.params) for f in frags]}}
    ckpt.save_replica(out, step, 0, state)
    meta = {"config": cfg.to_dict(), "num_replicas": 1, "vocab_size": int(vocab_size), "data_digest": data_digest}
    ckpt.commit(out, step, meta, keep=1)


__all__ = ["plan_out", "write_final_checkpoint"]
