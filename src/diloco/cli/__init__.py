"""The `diloco` command line. Thin: it parses arguments and calls the library.

Each sub-command lives in its own module of this package and exposes
``register(subparsers)``, which adds its parser and sets ``func`` (a callable
taking the parsed ``argparse.Namespace`` and returning an exit code).

Dispatch is lazy: only the chosen sub-command's module is imported (``diloco
simulate`` and ``diloco plan`` never load torch); ``diloco --help`` lists the
commands from :data:`COMMANDS` without importing any of them.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import traceback

from diloco.errors import ConfigError, RunError

# Sub-command modules and their one-line help, in the order `diloco --help` lists them.
COMMANDS: dict[str, str] = {
    "train": "train one configuration (data-parallel, DiLoCo or Streaming DiLoCo)",
    "export": "write a run's global parameters as a model folder (Hugging Face format / safetensors)",
    "syncer": "run a Decoupled DiLoCo syncer as a service that learner jobs at each site join",
    "status": "the status page of a `diloco syncer` run, rendered from its folder after the run",
    "chaos": "run Decoupled DiLoCo's learners as Ray processes and inject faults (kills, stragglers)",
    "compare": "train several methods on the same data and compare loss against bytes",
    "config": "print the resolved, validated config of a preset, method and --set overrides",
    "simulate": "compute utilization and wall-clock vs bandwidth (data-parallel, DiLoCo, Streaming DiLoCo)",
    "plan": "recommend a method and settings for a model, hardware, workers, link and token budget",
    "sweep": "run a resumable grid of runs (sizes x methods x hyperparameters) into a JSONL file",
    "fit": "fit power laws to sweep results (loss, optimal lr and batch; held-out check)",
    "report": "plots and a Markdown report of the fitted scaling laws",
}

DESCRIPTION = (
    "Train language models with data-parallel, DiLoCo and Streaming DiLoCo; simulate compute "
    "utilization over slow links; plan a run; fit scaling laws."
)


def _top_parser() -> argparse.ArgumentParser:
    epilog = "commands:\n" + "\n".join(f"  {name:<10} {text}" for name, text in COMMANDS.items())
    epilog += "\n\nrun `diloco COMMAND --help` for a command's options"
    parser = argparse.ArgumentParser(
        prog="diloco", description=DESCRIPTION, epilog=epilog, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("command", nargs="?", choices=list(COMMANDS), metavar="COMMAND")
    return parser


def build_parser(command: str) -> argparse.ArgumentParser:
    """The parser of one sub-command (its module imported now, and only it)."""
    if command not in COMMANDS:
        raise ConfigError(f"unknown command {command!r}; choose one of {', '.join(COMMANDS)}")
    parser = argparse.ArgumentParser(prog="diloco", description=DESCRIPTION)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    importlib.import_module(f"diloco.cli.{command}").register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0].startswith("-"):
        top = _top_parser()
        top.parse_args(argv)  # --help exits here; anything else is an option without a command
        top.print_help()
        return 2
    command = argv[0]
    if command not in COMMANDS:
        _top_parser().parse_args(argv[:1])  # exits 2 with "invalid choice", listing the commands
    args = build_parser(command).parse_args(argv)
    from diloco.train.divergence import DivergenceError  # no torch: the guard's module is plain Python

    try:
        return int(args.func(args) or 0)
    except DivergenceError as exc:  # the run stopped itself: what diverged, where, and the usual causes
        print(f"diloco {args.command}: error: {exc}", file=sys.stderr)
        return 3
    except ConfigError as exc:  # the user's to fix: say what and how, no traceback
        print(f"diloco {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except RunError:  # a failure outside the code (a dead peer, a timeout): raised on as before, so that
        raise  # Python, or torchrun's error record, prints its traceback
    except Exception:  # anything else is a bug: the traceback, and where to report it
        traceback.print_exc()
        print(
            f"diloco {args.command}: internal error (a bug, not a mistake of yours): please report it with the "
            f"traceback above, the command line and `pip show diloco torch`",
            file=sys.stderr,
        )
        return 1


if __name__ == "__main__":
    sys.exit(main())
