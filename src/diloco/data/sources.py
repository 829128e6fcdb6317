"""Your data: text files, folders and globs, pre-tokenized token files, your tokenizer.

:func:`prepare_data` is the one entry point the trainer uses; it returns the same
:class:`~diloco.data.tokens.TokenData` (train and validation streams) for every kind of source, so
the per-replica shards (:class:`~diloco.data.shards.ShardSampler`: disjoint, seeded, resumable to
the exact batch) and the evaluation batches work the same for all of them.

A *source* is one of:

* a bundled corpus name (``shakespeare``, ``bible``: the default);
* a text file, a folder (searched recursively) or a glob (``data/**/*.txt``) of UTF-8 ``.txt`` /
  ``.md`` files (one document per file) and ``.jsonl`` files (one document per line, from its
  ``"text"`` field). Text is normalised as the bundled corpus is
  (:func:`~diloco.data.corpus.normalize_text`: NFC, LF line ends, no trailing spaces);
* pre-tokenized token files: ``.npy`` (a 1-D uint16/uint32 array) or ``.bin`` (raw ids of
  ``token_dtype``, uint16 by default, as nanoGPT's ``prepare.py`` writes them), memory-mapped, never
  copied when there is one file. A folder holding nanoGPT's ``train.bin`` and ``val.bin`` uses them
  as the split. Their ids must lie below ``vocab_size``.

Held-out split, identical in spirit for every source: the last ``val_fraction`` of each document
(text, cut at a line start) or of each token file is validation; the tokenizer is trained on the
training parts only. The tokenizer is the project's byte-level BPE trained on your text and cached
by content, or your ``tokenizer.json`` (Hugging Face ``tokenizers`` format), used as it is.

Every mistake is a ``ValueError`` naming the path or value and the fix, raised before anything is
trained or written: a missing path, no files, an empty corpus, bytes that are not UTF-8, a JSONL
line without text, a token id >= ``vocab_size``.
"""

from __future__ import annotations

import glob
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from diloco.data.corpus import CORPORA, SOURCES, Document, load_documents, normalize_text
from diloco.data.tokenizer import load_tokenizer_file
from diloco.data.tokens import TokenData, prepare_tokens
from diloco.errors import ConfigError


def data_errors(cfg: Any) -> list[str]:
    """What is wrong with a training config's sequences, vocabulary, split, token files and data order (each
    message names the value and the fix)."""
    errors = []
    if cfg.seed < 0:
        errors.append(f"seed={cfg.seed}: must be >= 0")
    if not (cfg.seq_len >= 8 and cfg.vocab_size >= 260):
        errors.append(
            f"seq_len={cfg.seq_len}, vocab_size={cfg.vocab_size}: need seq_len >= 8 and vocab_size >= 260 "
            f"(a byte-level tokenizer needs 256 byte tokens + specials)"
        )
    if not 0.0 < cfg.val_fraction < 0.5:
        errors.append(f"val_fraction={cfg.val_fraction}: need 0 < v < 0.5")
    if cfg.token_dtype not in TOKEN_DTYPES:
        errors.append(
            f"token_dtype={cfg.token_dtype!r}: use {' or '.join(TOKEN_DTYPES)} (the id type of your .bin files)"
        )
    return errors


__all__ = [
    "data_errors",
    "TEXT_SUFFIXES",
    "TOKEN_SUFFIXES",
    "are_token_files",
    "check_sources",
    "load_text_documents",
    "load_token_files",
    "prepare_data",
    "resolve_paths",
]

TEXT_SUFFIXES = (".txt", ".md", ".jsonl")
TOKEN_SUFFIXES = (".bin", ".npy")
TOKEN_DTYPES = ("uint16", "uint32")
_GLOB_CHARS = set("*?[")


def _suffix(path: Path) -> str:
    return path.suffix.lower()


def resolve_paths(spec: str) -> list[Path]:
    """The files a source names: the file itself, a folder's data files (recursive), or a glob's matches."""
    if not isinstance(spec, str) or not spec.strip():
        raise ConfigError(f"source {spec!r}: give a file, a folder or a glob such as 'data/*.txt'")
    known = TEXT_SUFFIXES + TOKEN_SUFFIXES
    expanded = str(Path(spec).expanduser())
    if _GLOB_CHARS & set(spec):
        files = sorted(Path(p) for p in glob.glob(expanded, recursive=True) if Path(p).is_file())
        files = [f for f in files if _suffix(f) in known]
        if not files:
            raise ConfigError(
                f"source {spec!r}: the glob matches no {'/'.join(known)} file; check the pattern "
                f"(use '**' to search subfolders, e.g. 'data/**/*.txt')"
            )
        return files
    path = Path(expanded)
    if path.is_dir():
        files = sorted(
            f
            for f in path.rglob("*")
            if f.is_file()
            and _suffix(f) in known
            and not any(part.startswith(".") for part in f.relative_to(path).parts)
        )
        if not files:
            raise ConfigError(
                f"source {spec!r}: the folder holds no {'/'.join(known)} file; put your text in "
                f".txt/.md/.jsonl files or your tokens in .bin/.npy files"
            )
        return files
    if path.is_file():
        if _suffix(path) not in known:
            raise ConfigError(
                f"source {spec!r}: unknown file type {path.suffix or '(none)'!r}; text must be "
                f".txt/.md/.jsonl (UTF-8) and token files .bin/.npy"
            )
        return [path]
    bundled = (
        f"; the bundled sources are {', '.join(sorted(SOURCES))} (mixes: {', '.join(sorted(CORPORA))})"
        if "/" not in spec and "." not in spec
        else ""
    )
    raise ConfigError(
        f"source {spec!r}: no such file or folder{bundled}; give an existing file, folder or glob (e.g. 'data/*.txt')"
    )


def _decode(path: Path, data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{path} is not UTF-8 text: byte 0x{data[exc.start]:02x} at offset {exc.start}; convert "
            f"the file to UTF-8 (e.g. iconv -f latin1 -t utf-8) or leave it out of the sources"
        ) from None


def _read_text_file(path: Path, name: str) -> list[Document]:
    text = _decode(path, path.read_bytes())
    if _suffix(path) != ".jsonl":
        return [Document(name, "text", normalize_text(text))]
    docs = []
    for lineno, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ConfigError(
                f"{path}:{lineno} is not valid JSON ({exc.msg}); each line of a .jsonl file must be "
                f'one object such as {{"text": "..."}}'
            ) from None
        if not isinstance(row, dict) or not isinstance(row.get("text"), str):
            raise ConfigError(
                f'{path}:{lineno} has no string "text" field; each line of a .jsonl file must be '
                f'an object such as {{"text": "..."}}'
            )
        docs.append(Document(f"{name}:{lineno}", "text", normalize_text(row["text"])))
    return docs


def load_text_documents(specs: Sequence[str]) -> list[Document]:
    """Every document of the text files the specs name, in order (specs as given, files sorted)."""
    docs: list[Document] = []
    seen: set[Path] = set()
    for spec in specs:
        for path in resolve_paths(spec):
            if _suffix(path) not in TEXT_SUFFIXES:
                raise ConfigError(
                    f"source {spec!r} includes the token file {path}; text and pre-tokenized "
                    f"sources cannot be mixed: give them in separate runs"
                )
            if path.resolve() in seen:
                continue  # a file named twice (a folder and a glob inside it) counts once
            seen.add(path.resolve())
            docs.extend(d for d in _read_text_file(path, str(path)) if d.text)
    if not docs:
        raise ConfigError(
            f"sources {list(specs)}: every file is empty (no text after normalisation); add text "
            f"to the files or name other files"
        )
    return docs


def _open_tokens(path: Path, token_dtype: str) -> np.ndarray:
    if _suffix(path) == ".npy":
        try:
            arr = np.load(path, mmap_mode="r", allow_pickle=False)
        except ValueError as exc:
            raise ConfigError(f"{path} is not a plain numpy array file ({exc}); save it with np.save") from None
        if arr.ndim != 1 or arr.dtype not in (np.uint16, np.uint32):
            raise ConfigError(
                f"{path} holds a {arr.ndim}-D {arr.dtype} array; token files must be 1-D uint16 or "
                f"uint32 (e.g. np.save(path, ids.astype(np.uint16)))"
            )
        return arr
    size = path.stat().st_size
    itemsize = np.dtype(token_dtype).itemsize
    if size % itemsize:
        raise ConfigError(
            f"{path} has {size} bytes, not a whole number of {token_dtype} ids; set token_dtype to "
            f"the type it was written with ({' or '.join(TOKEN_DTYPES)})"
        )
    if size == 0:
        return np.zeros(0, dtype=token_dtype)
    return np.memmap(path, dtype=token_dtype, mode="r")


def _max_id(arr: np.ndarray, chunk: int = 1 << 24) -> int:
    return max((int(arr[i : i + chunk].max()) for i in range(0, arr.size, chunk)), default=-1)


def load_token_files(
    specs: Sequence[str], *, vocab_size: int, val_fraction: float, token_dtype: str = "uint16"
) -> TokenData:
    """Pre-tokenized sources as train/validation streams (memory-mapped when there is one file)."""
    if token_dtype not in TOKEN_DTYPES:
        raise ConfigError(f"token_dtype={token_dtype!r}: use {' or '.join(TOKEN_DTYPES)} (nanoGPT writes uint16)")
    files: list[Path] = []
    for spec in specs:
        for path in resolve_paths(spec):
            if _suffix(path) not in TOKEN_SUFFIXES:
                raise ConfigError(
                    f"source {spec!r} includes the text file {path}; text and pre-tokenized sources "
                    f"cannot be mixed: give them in separate runs"
                )
            files.append(path)
    arrays = {path: _open_tokens(path, token_dtype) for path in files}
    for path, arr in arrays.items():
        top = _max_id(arr)
        if top >= vocab_size:
            raise ConfigError(
                f"{path} holds token id {top}, which is >= vocab_size={vocab_size}; set vocab_size "
                f"to at least {top + 1} (the tokenizer's vocabulary size)"
            )
    names = {p.name for p in files}
    split_by_files = len(files) == 2 and names == {"train.bin", "val.bin"}
    if split_by_files:  # nanoGPT's layout: the split is given
        by_name = {p.name: arrays[p] for p in files}
        train, val = by_name["train.bin"], by_name["val.bin"]
        split = "nanoGPT's train.bin / val.bin"
    else:
        trains, vals = [], []
        for arr in arrays.values():
            cut = arr.size - math.ceil(arr.size * val_fraction)
            trains.append(arr[:cut])
            vals.append(arr[cut:])
        train = trains[0] if len(trains) == 1 else np.concatenate(trains)
        val = vals[0] if len(vals) == 1 else np.concatenate(vals)
        split = "the last val_fraction of each token file is validation"
    if train.size == 0:
        raise ConfigError(f"sources {list(specs)}: the token files hold no training tokens; give non-empty files")
    metadata: dict[str, Any] = {
        "sources": [str(p) for p in files],
        "kind": "tokens",
        "vocab_size": int(vocab_size),
        "val_fraction": val_fraction,
        "split": split,
        "token_dtype": str(train.dtype),
        "train_tokens": int(train.size),
        "val_tokens": int(val.size),
        "from_cache": False,
    }
    return TokenData(train, val, None, (), metadata)


def _is_bundled(spec: str) -> bool:
    return (spec in SOURCES or spec in CORPORA) and not Path(spec).exists()


def check_sources(sources: Sequence[str]) -> None:
    """The cheap checks of :func:`prepare_data` (names, paths, file types, no text mixed with token files),
    reading no file: what a run checks before anything else."""
    if isinstance(sources, str):
        raise ConfigError(f"sources={sources!r}: pass a sequence, e.g. ({sources!r},)")
    specs = list(sources)
    if not specs:
        raise ConfigError(f"sources=(): name at least one of {', '.join(sorted(SOURCES))}, or a file, folder or glob")
    paths = [s for s in specs if not _is_bundled(s)]
    resolved = {s: resolve_paths(s) for s in paths}
    tokens = [s for s, files in resolved.items() if any(_suffix(f) in TOKEN_SUFFIXES for f in files)]
    if tokens and (
        len(tokens) != len(specs) or any(_suffix(f) not in TOKEN_SUFFIXES for s in tokens for f in resolved[s])
    ):
        raise ConfigError(
            f"sources {specs}: token files ({', '.join(tokens)}) cannot be mixed with text; give "
            f"only token files, or only text"
        )


def are_token_files(sources: Sequence[str]) -> bool:
    """Whether ``sources`` are pre-tokenized files (checked as :func:`check_sources` does; reads no file)."""
    check_sources(sources)
    return any(_suffix(f) in TOKEN_SUFFIXES for s in sources if not _is_bundled(s) for f in resolve_paths(s))


def prepare_data(
    sources: Sequence[str],
    *,
    vocab_size: int,
    cache_dir: Path | str,
    val_fraction: float = 0.02,
    tokenizer: str | None = None,
    eod_token: str | None = None,
    token_dtype: str = "uint16",
) -> TokenData:
    """Train and validation token streams of ``sources`` (see the module docstring); cached by content.

    Args:
        sources: bundled corpus names and/or paths, folders or globs of text; or only token files.
        vocab_size: the BPE's size when it is trained here; for token files, the vocabulary the ids index.
        tokenizer: a ``tokenizer.json`` (or a folder holding one) to use instead of training the BPE.
        eod_token: the end-of-document token of that tokenizer (default: the first known one it has).
        token_dtype: the id type of ``.bin`` files.
    """
    check_sources(sources)
    specs = list(sources)
    if not (isinstance(val_fraction, (int, float)) and 0.0 < val_fraction < 0.5):
        raise ConfigError(f"val_fraction={val_fraction!r}: need 0 < val_fraction < 0.5, e.g. 0.02")
    bundled = [s for s in specs if _is_bundled(s)]
    paths = [s for s in specs if not _is_bundled(s)]
    tokens = [s for s in paths if any(_suffix(f) in TOKEN_SUFFIXES for f in resolve_paths(s))]
    if tokens:
        if tokenizer:
            raise ConfigError(
                f"tokenizer={tokenizer!r} is not used with pre-tokenized sources (they are ids "
                f"already); leave tokenizer empty and set vocab_size to their vocabulary size"
            )
        return load_token_files(paths, vocab_size=vocab_size, val_fraction=val_fraction, token_dtype=token_dtype)
    tok = load_tokenizer_file(tokenizer, eod_token=eod_token) if tokenizer else None
    if eod_token and not tokenizer:
        raise ConfigError(
            f"eod_token={eod_token!r} names a token of your tokenizer.json: set tokenizer=PATH too, or "
            f"leave eod_token empty (the project's BPE uses <|endoftext|>)"
        )
    docs: list[Document] = []
    if bundled:
        docs += load_documents(bundled)
    if paths:
        docs += load_text_documents(paths)
    return prepare_tokens(docs, vocab_size, cache_dir, val_fraction=val_fraction, tokenizer=tok)
