"""The `diloco` command line. Thin: it parses arguments and calls the library.

Each sub-command lives in its own module of this package and exposes
``register(subparsers)``, which adds its parser and sets ``func`` (a callable
taking the parsed ``argparse.Namespace`` and returning an exit code).
"""

from __future__ import annotations

import argparse
import importlib
import sys

# Sub-command modules, in the order `diloco --help` lists them.
COMMANDS = ("train", "compare", "simulate", "sweep", "fit", "report")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="diloco",
        description=(
            "Train language models with data-parallel, DiLoCo and Streaming DiLoCo; "
            "simulate compute utilization over slow links; fit scaling laws."
        ),
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"diloco.cli.{name}")
        except ModuleNotFoundError as exc:  # a command not built yet
            if exc.name != f"diloco.cli.{name}":
                raise
            continue
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except ValueError as exc:  # a user error: say what and how to fix it, no traceback
        print(f"diloco {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
