"""Token streams: the corpus as ``train`` and ``val`` token ids, cached (:mod:`diloco.data.shards` deals them to
the replicas).

``prepare_tokens`` turns the corpus into two token streams, ``train`` and ``val``, cached as .npy
files. The held-out split is made *inside every document*: the last ``val_fraction`` of each
document's text (cut at a line start) is validation, the rest is training, and the tokenizer is
trained on the training parts only. So validation text is never trained on, and the validation
set has the same mix of sources and works as the training set (a split by whole documents would
put a handful of plays or books, chosen by chance, in validation). Each part ends with the
end-of-document token.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import math
import time
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import tokenizers

from diloco.data.corpus import Document, corpus_fingerprint, load_documents
from diloco.data.tokenizer import EOD_TOKEN, TOKENIZER_VERSION, BPETokenizer, check_vocab_size, get_tokenizer
from diloco.errors import ConfigError
from diloco.files import atomic_write_bytes, dumps_strict

__all__ = ["DocumentSpan", "TokenData", "prepare_tokens", "split_point"]

log = logging.getLogger(__name__)

DATA_VERSION = 1  # bump when the split or the stream layout changes: old caches stop matching


@dataclass(frozen=True)
class DocumentSpan:
    """Where one document went: text ``[0, cut)`` is in ``train[train_start:train_end]`` (then one
    end-of-document token), text ``[cut, chars)`` in ``val[val_start:val_end]`` (then one)."""

    name: str
    source: str
    chars: int
    cut: int
    train_start: int
    train_end: int
    val_start: int
    val_end: int


@dataclass(frozen=True)
class TokenData:
    """The tokenized corpus: train and validation streams, the tokenizer, and how they were made."""

    train: np.ndarray
    val: np.ndarray
    tokenizer: BPETokenizer | None  # None for pre-tokenized data (see diloco.data.sources)
    documents: tuple[DocumentSpan, ...]
    metadata: dict[str, Any]

    @property
    def vocab_size(self) -> int:
        """Size of the vocabulary the ids index: the model's embedding size (every id is below it)."""
        return int(self.metadata["vocab_size"])

    def digest(self) -> str:
        """SHA-256 of the training and validation token ids, in order: what a run trained and evaluated on.

        A run records it (checkpoints, summary.json) and a resume checks it, so a corpus that changed
        between sittings (an upgraded Debian package of the ``large`` corpus, an edited text file) is caught
        instead of silently continuing on other data."""
        h = hashlib.sha256()
        for arr in (self.train, self.val):
            arr = np.ascontiguousarray(arr)
            h.update(f"{arr.dtype.str}:{arr.size}|".encode())
            h.update(memoryview(arr).cast("B"))
        return h.hexdigest()


def split_point(text: str, val_fraction: float) -> int:
    """Where a document's validation tail starts: the last line start that leaves at least
    ``val_fraction`` of its characters to validation (a mid-line cut if no line starts early enough)."""
    target = len(text) - math.ceil(len(text) * val_fraction)
    line_start = text.rfind("\n", 0, target) + 1
    return line_start if line_start > 0 else target


def _dtype_for(vocab_size: int) -> type[np.unsignedinteger]:
    return np.uint16 if vocab_size <= 2**16 else np.uint32


def _npy_bytes(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, arr, allow_pickle=False)
    return buf.getvalue()


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _resolve_documents(sources: Sequence[str] | Sequence[Document]) -> tuple[list[Document], list[str]]:
    if isinstance(sources, str):
        raise ConfigError(f"sources={sources!r}: pass a sequence of names, e.g. ({sources!r},)")
    items = list(sources)
    if items and all(isinstance(s, Document) for s in items):
        docs = [d for d in items if d.text]
        if not docs:
            raise ConfigError("prepare_tokens: every document given is empty")
        return docs, sorted({d.source for d in docs})
    if any(isinstance(s, Document) for s in items):
        raise ConfigError("prepare_tokens: sources must be all source names or all Document objects, not a mix")
    return load_documents(items), items


def prepare_tokens(
    sources: Sequence[str] | Sequence[Document],
    vocab_size: int,
    cache_dir: Path | str,
    *,
    val_fraction: float = 0.02,
    tokenizer: BPETokenizer | None = None,
) -> TokenData:
    """Tokenize the named sources (or the given documents), from ``cache_dir`` when done before.

    ``tokenizer``: a ready tokenizer (e.g. :func:`~diloco.data.tokenizer.load_tokenizer_file`) used
    as it is, instead of training the project's BPE on the training text (``vocab_size`` is then
    the tokenizer's).

    The cache is a directory ``tokens-<key>/`` (train.npy, val.npy, manifest.json) keyed by a hash of
    the corpus text, ``val_fraction``, ``vocab_size`` and the format versions; the manifest holds
    each file's size and SHA-256, and a cache that fails the check is rebuilt with a warning.
    """
    if not (isinstance(val_fraction, (int, float)) and 0.0 < val_fraction < 0.5):
        raise ConfigError(f"val_fraction={val_fraction!r}: need 0 < val_fraction < 0.5, e.g. 0.02")
    check_vocab_size(vocab_size)
    t0 = time.perf_counter()
    docs, source_names = _resolve_documents(sources)
    tok_ident = f"vocab={vocab_size}"
    if tokenizer is not None:
        tok_ident = f"tokenizer={_sha256(tokenizer.to_json().encode('utf-8'))}|eod={tokenizer.eod_token}"
    ident = (
        f"{corpus_fingerprint(docs)}|val={float(val_fraction)!r}|{tok_ident}|data-v{DATA_VERSION}"
        f"|tok-v{TOKENIZER_VERSION}|tokenizers-{tokenizers.__version__}"
    )
    key = hashlib.sha256(ident.encode()).hexdigest()[:16]
    cache_dir = Path(cache_dir)
    folder = cache_dir / f"tokens-{key}"
    data = _load_cached(folder)
    from_cache = data is not None
    if data is None:
        data = _build(docs, source_names, vocab_size, cache_dir, folder, float(val_fraction), key, tokenizer)
    data.metadata["from_cache"] = from_cache
    data.metadata["seconds"] = time.perf_counter() - t0
    return data


def _user_tokenizer_copy(tok: BPETokenizer, cache_dir: Path) -> BPETokenizer:
    """The user's tokenizer, copied into the cache beside the token files that were made with it."""
    blob = tok.to_json().encode("utf-8")
    path = cache_dir / f"tokenizer-file-{_sha256(blob)[:16]}.json"
    if not (path.is_file() and path.read_bytes() == blob):
        atomic_write_bytes(path, blob)
    copy = BPETokenizer.from_file(path, eod_token=tok.eod_token)
    copy.from_cache = True  # not trained here
    return copy


def _build(
    docs: list[Document],
    source_names: list[str],
    vocab_size: int,
    cache_dir: Path,
    folder: Path,
    val_fraction: float,
    key: str,
    tokenizer: BPETokenizer | None = None,
) -> TokenData:
    t0 = time.perf_counter()
    cuts = [split_point(d.text, val_fraction) for d in docs]
    train_texts = [d.text[:c] for d, c in zip(docs, cuts)]
    val_texts = [d.text[c:] for d, c in zip(docs, cuts)]
    if tokenizer is not None:
        tok = _user_tokenizer_copy(tokenizer, cache_dir)
    else:
        tok = get_tokenizer(train_texts, vocab_size, cache_dir)
    t1 = time.perf_counter()
    encoded = tok.encode_batch(train_texts + val_texts)
    t2 = time.perf_counter()
    dtype = _dtype_for(tok.vocab_size)
    streams: dict[str, list[np.ndarray]] = {"train": [], "val": []}
    positions = {"train": 0, "val": 0}
    spans: list[tuple[int, int, int, int]] = []
    eod = np.array([tok.eod_id], dtype=dtype)
    for part, ids in zip(["train"] * len(docs) + ["val"] * len(docs), encoded):
        start = positions[part]
        if ids:  # an empty part (a tiny document) adds nothing, not even a separator
            streams[part] += [np.asarray(ids, dtype=dtype), eod]
            positions[part] += len(ids) + 1
        spans.append((start, start + len(ids)))
    n = len(docs)
    documents = tuple(
        DocumentSpan(d.name, d.source, len(d.text), c, *spans[i], *spans[n + i])
        for i, (d, c) in enumerate(zip(docs, cuts))
    )
    train = np.concatenate(streams["train"]) if streams["train"] else np.zeros(0, dtype)
    val = np.concatenate(streams["val"]) if streams["val"] else np.zeros(0, dtype)

    per_source: dict[str, dict[str, int]] = {}
    for d, span in zip(docs, documents):
        s = per_source.setdefault(d.source, {"documents": 0, "bytes": 0, "train_tokens": 0, "val_tokens": 0})
        s["documents"] += 1
        s["bytes"] += len(d.text.encode("utf-8"))
        s["train_tokens"] += span.train_end - span.train_start
        s["val_tokens"] += span.val_end - span.val_start
    text_tokens = sum(s["train_tokens"] + s["val_tokens"] for s in per_source.values())
    metadata: dict[str, Any] = {
        "key": key,
        "sources": source_names,
        "vocab_size_requested": int(vocab_size),
        "vocab_size": tok.vocab_size,
        "val_fraction": val_fraction,
        "split": "the last val_fraction of each document's text (cut at a line start) is validation",
        "documents": n,
        "bytes": sum(s["bytes"] for s in per_source.values()),
        "train_tokens": int(train.size),
        "val_tokens": int(val.size),
        "bytes_per_token": sum(s["bytes"] for s in per_source.values()) / max(text_tokens, 1),
        "per_source": per_source,
        "tokenizer_file": tok.path.name if tok.path else None,
        "tokenizer_source": "trained here (byte-level BPE)" if tokenizer is None else str(tokenizer.path),
        "eod_token": tok.eod_token,
        "tokenizer_trained_now": not tok.from_cache,
        "tokenizer_train_seconds": tok.train_seconds,
        "encode_seconds": t2 - t1,
        "build_seconds": time.perf_counter() - t0,
        "tokenizers_version": tokenizers.__version__,
    }
    _save(folder, train, val, tok, documents, metadata)
    return TokenData(train, val, tok, documents, metadata)


def _save(
    folder: Path,
    train: np.ndarray,
    val: np.ndarray,
    tok: BPETokenizer,
    documents: tuple[DocumentSpan, ...],
    metadata: dict[str, Any],
) -> None:
    files = {}
    for name, arr in (("train.npy", train), ("val.npy", val)):
        blob = _npy_bytes(arr)
        atomic_write_bytes(folder / name, blob)
        files[name] = {"bytes": len(blob), "sha256": _sha256(blob), "tokens": int(arr.size), "dtype": str(arr.dtype)}
    assert tok.path is not None
    tok_blob = tok.path.read_bytes()
    manifest = {
        "format": DATA_VERSION,
        "files": files,
        "tokenizer": {
            "file": tok.path.name,
            "bytes": len(tok_blob),
            "sha256": _sha256(tok_blob),
            "eod_token": tok.eod_token,
        },
        "metadata": metadata,
        "documents": [asdict(d) for d in documents],
    }
    # The manifest goes last: its presence means every file it lists was completely written.
    atomic_write_bytes(folder / "manifest.json", dumps_strict(manifest, indent=1).encode("utf-8"))


def _load_cached(folder: Path) -> TokenData | None:
    """The cached data if the manifest and every file it lists check out; None (with a warning) if not."""
    manifest_path = folder / "manifest.json"
    if not manifest_path.is_file():
        return None
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        if manifest.get("format") != DATA_VERSION:
            raise ConfigError(f"format {manifest.get('format')!r}, expected {DATA_VERSION}")
        arrays = {}
        for name, info in manifest["files"].items():
            blob = (folder / name).read_bytes()
            if len(blob) != info["bytes"] or _sha256(blob) != info["sha256"]:
                raise ConfigError(f"{name} has {len(blob)} bytes, expected {info['bytes']}, or a wrong checksum")
            arrays[name] = np.load(io.BytesIO(blob), allow_pickle=False)
        tinfo = manifest["tokenizer"]
        tok_path = folder.parent / tinfo["file"]
        tok_blob = tok_path.read_bytes()
        if len(tok_blob) != tinfo["bytes"] or _sha256(tok_blob) != tinfo["sha256"]:
            raise ConfigError(f"{tok_path.name} does not match its recorded size and checksum")
        tok = BPETokenizer.from_file(tok_path, eod_token=tinfo.get("eod_token", EOD_TOKEN))
        documents = tuple(DocumentSpan(**d) for d in manifest["documents"])
        return TokenData(arrays["train.npy"], arrays["val.npy"], tok, documents, dict(manifest["metadata"]))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        warnings.warn(f"token cache {folder} is damaged ({exc}); rebuilding it", RuntimeWarning, stacklevel=3)
        return None
