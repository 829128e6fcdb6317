"""Arguments shared by the commands that train."""

from __future__ import annotations

import argparse
from pathlib import Path

from diloco.files import default_cache_dir
from diloco.train.config import TrainConfig, load_preset, parse_override, preset_names


def add_config_args(p: argparse.ArgumentParser, *, default_preset: str) -> None:
    p.add_argument("--preset", default=default_preset,
                   help=f"named preset ({', '.join(preset_names())}) or a path to a JSON preset "
                        f"(default: {default_preset})")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config field, e.g. --set sync_every=100 (repeatable; validated)")
    p.add_argument("--cache-dir", type=Path, default=None,
                   help="where the tokenizer and tokenized corpus are cached "
                        "(default: $DILOCO_CACHE or ~/.cache/diloco)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def cache_dir(args: argparse.Namespace) -> Path:
    return args.cache_dir if args.cache_dir is not None else default_cache_dir()


def overrides(args: argparse.Namespace) -> dict:
    return dict(parse_override(item) for item in args.overrides)


def resolve(preset: dict, method: str | None, extra: dict) -> TrainConfig:
    """Base config of a preset, then the named method's overrides, then --set overrides."""
    base = dict(preset["base"])
    if method is not None:
        methods = preset["methods"]
        if method not in methods:
            raise ValueError(f"method {method!r} is not in this preset; its methods: {', '.join(methods)}")
        base.update(methods[method])
    return TrainConfig.from_dict({**base, **extra})


__all__ = ["add_config_args", "cache_dir", "overrides", "resolve", "load_preset"]
