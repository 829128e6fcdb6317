"""The study's corpus as pre-tokenized files, for a machine that cannot build it (no Debian corpus packages).

    .venv/bin/python studies/frontier/token_files.py DIR [--xz]

Writes DIR/train.bin and DIR/val.bin (nanoGPT's layout: raw uint16 ids, the split given by the names) of the
``large`` corpus at vocabulary 4,096, the very arrays every CPU run of the study trained and evaluated on,
and prints their digest (the ``data_sha256`` a run records). A grid whose ``base.sources`` names the two files
trains on the same data without the texts; the record's ``data_sha256`` shows it. ``--xz`` also writes
``train.bin.xz`` (about 20 MB instead of 63), and ``DIR --check`` reads the files back (unpacking
``train.bin.xz`` when ``train.bin`` is missing) and prints the digest again. A file already in DIR with other
contents is refused, before anything is written: nothing of yours is overwritten.
"""

from __future__ import annotations

import argparse
import lzma
import sys
from pathlib import Path

from diloco.data.shards import TokenData
from diloco.data.sources import load_token_files, prepare_data
from diloco.files import atomic_write_bytes, default_cache_dir

ROOT = Path(__file__).resolve().parents[2]

VOCAB = 4096


def export(folder: Path, *, xz: bool) -> str:
    data = prepare_data(["large"], vocab_size=VOCAB, cache_dir=default_cache_dir())
    blobs = {
        name: arr.astype("<u2", copy=False).tobytes()
        for name, arr in (("train.bin", data.train), ("val.bin", data.val))
    }
    for name, blob in blobs.items():
        if (folder / name).exists() and (folder / name).read_bytes() != blob:
            raise SystemExit(f"token_files.py: {folder / name} exists and holds other tokens; choose an empty folder")
    folder.mkdir(parents=True, exist_ok=True)
    for name, blob in blobs.items():
        atomic_write_bytes(folder / name, blob)
    if xz:
        atomic_write_bytes(folder / "train.bin.xz", lzma.compress(blobs["train.bin"], preset=6))
    return data.digest()


def check(folder: Path) -> str:
    train = folder / "train.bin"
    if not train.exists():
        atomic_write_bytes(train, lzma.decompress((folder / "train.bin.xz").read_bytes()))
    data: TokenData = load_token_files([str(train), str(folder / "val.bin")], vocab_size=VOCAB, val_fraction=0.02)
    return data.digest()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--xz", action="store_true", help="also write train.bin.xz")
    parser.add_argument("--check", action="store_true", help="read the files back and print their digest")
    args = parser.parse_args()
    digest = check(args.folder) if args.check else export(args.folder, xz=args.xz)
    print(f"data_sha256 {digest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
