"""Arguments shared by the commands that train."""

from __future__ import annotations

import argparse
import textwrap
from pathlib import Path

from diloco.errors import ConfigError
from diloco.files import default_cache_dir
from diloco.train.config import TrainConfig, load_preset, parse_override, preset_names, reference


def config_keys_help() -> str:
    """Every configuration key with its type, default and meaning, by section (from :func:`reference`)."""
    lines = ["configuration keys (--set KEY=VALUE; tuples comma-separated; see `diloco config` for a preset's values):"]
    section = None
    for f in reference():
        if f.section != section:
            section = f.section
            lines.append(f"\n  {section}:")
        default = ",".join(f.default) if isinstance(f.default, list) else f.default
        default = '""' if default == "" else str(default).lower() if isinstance(default, bool) else default
        typ = "|".join(f.choices) if f.choices else f.type.replace("tuple[str, ...]", "list")
        lines.append(f"    {f.name} ({typ}, default {default})")
        lines.append(f"        {f.doc}")
    return "\n".join(lines)


def add_config_args(p: argparse.ArgumentParser, *, default_preset: str) -> None:
    """--preset, --set, --cache-dir, --no-progress; the help lists every configuration key."""
    p.formatter_class = argparse.RawDescriptionHelpFormatter  # keeps the key list's layout ...
    p.description = textwrap.fill(p.description or "", width=100)  # ... so the description is wrapped here
    p.epilog = config_keys_help()
    p.add_argument(
        "--preset",
        default=default_preset,
        help=f"named preset ({', '.join(preset_names())}) or a path to a JSON preset (default: {default_preset})",
    )
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config field, e.g. --set sync_every=100 (repeatable; validated)",
    )
    p.add_argument(
        "--cache-dir",
        type=Path,
        default=None,
        help="where the tokenizer and tokenized corpus are cached (default: $DILOCO_CACHE or ~/.cache/diloco)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def cache_dir(args: argparse.Namespace) -> Path:
    return args.cache_dir if args.cache_dir is not None else default_cache_dir()


def overrides(args: argparse.Namespace) -> dict:
    return dict(parse_override(item) for item in args.overrides)


def resolve(preset: dict, method: str | None, extra: dict) -> TrainConfig:
    """Base config of a preset, then the named method's overrides, then --set overrides.

    A method the preset does not name but the trainer runs (:data:`diloco.methods.METHODS`, e.g.
    ``decoupled``) is the preset's base with that method.
    """
    from diloco.methods import METHODS

    base = dict(preset["base"])
    if method is not None:
        methods = preset["methods"]
        if method not in methods and method not in METHODS:
            raise ConfigError(
                f"method {method!r} is not in this preset; its methods: {', '.join(methods)} "
                f"(or a method the trainer runs: {', '.join(METHODS)})"
            )
        base.update(methods.get(method, {"method": method}))
    return TrainConfig.from_dict({**base, **extra})


__all__ = ["add_config_args", "cache_dir", "config_keys_help", "overrides", "resolve", "load_preset"]
