"""`diloco export`: a run's global parameters as a model folder (Hugging Face, or the project's Transformer)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "export",
        help="write a run's global parameters as a model folder (Hugging Face format / safetensors)",
        description="Write the global (outer) parameters of a run's checkpoint (the latest readable one, or "
        "--step) as a model folder: for model=hf:... a folder transformers.AutoModelForCausalLM."
        "from_pretrained(DIR) loads (config.json, model.safetensors, the run's tokenizer); for the "
        "project's Transformer config.json + model.safetensors + tokenizer.json, loaded by "
        "diloco.models.saving.load_transformer(DIR); for your factory's model, model.safetensors. "
        "An --out that holds files is refused unless --overwrite.",
    )
    p.add_argument("run", type=Path, metavar="RUN", help="the run's folder (the --out of diloco train)")
    p.add_argument("--out", type=Path, required=True, help="the folder to write (new or empty)")
    p.add_argument("--step", type=int, default=None, help="export this checkpoint's step (default: the latest)")
    p.add_argument("--overwrite", action="store_true", help="replace --out and everything in it")
    p.add_argument(
        "--cache-dir",
        type=Path,
        default=None,
        help="token cache, read only for runs written before tokenizer.json was kept in the run "
        "(default: $DILOCO_CACHE or ~/.cache/diloco)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from diloco.train.export import export_run

    result = export_run(args.run, out=args.out, step=args.step, overwrite=args.overwrite, cache_dir=args.cache_dir)
    for line in result.skipped:
        print(f"diloco export: skipped a damaged checkpoint, {line}; exported step {result.step}", file=sys.stderr)
    print(json.dumps(result.to_dict(), indent=2))
    return 0
