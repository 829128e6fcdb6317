"""A byte-level BPE tokenizer trained locally on the training split, cached on disk.

Byte-level BPE (GPT-2's scheme, via the ``tokenizers`` library) works on UTF-8 bytes, so every
string round-trips exactly: ``decode(encode(s)) == s`` for any text, with no unknown token. One
special token, ``<|endoftext|>`` (id 0), separates documents in the token stream; it is only ever
inserted by the data pipeline: the same characters inside a text are encoded as ordinary bytes, so
no text can forge a document boundary and the round trip stays exact.

Training takes seconds, so the result is cached as JSON under a cache directory chosen by the
caller, keyed by a hash of the training text, the vocabulary size, this module's format version and
the ``tokenizers`` version (a library upgrade may train a different vocabulary).
"""

from __future__ import annotations

import hashlib
import logging
import time
import warnings
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import tokenizers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from diloco.data.corpus import Document, corpus_fingerprint
from diloco.errors import ConfigError
from diloco.files import atomic_write_bytes

__all__ = [
    "BPETokenizer",
    "EOD_TOKEN",
    "KNOWN_EOD_TOKENS",
    "TOKENIZER_VERSION",
    "get_tokenizer",
    "load_tokenizer_file",
    "tokenizer_key",
    "train_tokenizer",
]

log = logging.getLogger(__name__)

TOKENIZER_VERSION = 1  # bump when the training recipe below changes: old caches stop matching
EOD_TOKEN = "<|endoftext|>"
MIN_VOCAB_SIZE = 257  # 256 byte tokens + the end-of-document token
MAX_VOCAB_SIZE = 2**32  # token arrays are stored as uint16 (vocab <= 65536) or uint32


class BPETokenizer:
    """A trained byte-level BPE: ``encode``, ``decode``, ``vocab_size`` and the end-of-document id."""

    def __init__(
        self,
        tok: Tokenizer,
        *,
        path: Path | None = None,
        from_cache: bool = False,
        train_seconds: float | None = None,
        eod_token: str = EOD_TOKEN,
    ) -> None:
        eod = tok.token_to_id(eod_token)
        if eod is None:
            raise ConfigError(
                f"this tokenizer has no {eod_token!r} token; build it with train_tokenizer() or "
                f"name its end-of-document token (eod_token=...)"
            )
        tok.encode_special_tokens = True  # literal "<|endoftext|>" in text is text (not saved in the JSON)
        self.eod_token = eod_token
        self._tok = tok
        self.vocab_size: int = tok.get_vocab_size()
        self.eod_id: int = eod
        self.path = path  # the cache file it was loaded from or saved to, if any
        self.from_cache = from_cache  # True when get_tokenizer found it on disk instead of training
        self.train_seconds = train_seconds  # wall time of training, when this object trained it

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (no end-of-document token added)."""
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """``encode`` for many texts at once, in parallel threads (what the corpus pipeline uses)."""
        return [e.ids for e in self._tok.encode_batch_fast(list(texts), add_special_tokens=False)]

    def decode(self, ids: Iterable[int] | np.ndarray) -> str:
        """The text of ``ids``; the end-of-document token decodes to ``EOD_TOKEN``."""
        arr = np.asarray(ids if isinstance(ids, np.ndarray) else list(ids), dtype=np.int64).reshape(-1)
        if arr.size and (arr.min() < 0 or arr.max() >= self.vocab_size):
            bad = int(arr[(arr < 0) | (arr >= self.vocab_size)][0])
            raise ConfigError(f"token id {bad} is outside this tokenizer's vocabulary [0, {self.vocab_size})")
        return self._tok.decode(arr.tolist(), skip_special_tokens=False)

    def to_json(self) -> str:
        return self._tok.to_str()

    @classmethod
    def from_file(cls, path: Path | str, *, eod_token: str = EOD_TOKEN) -> BPETokenizer:
        """Load a tokenizer saved by :meth:`save` (raises ValueError if the file is not one)."""
        path = Path(path)
        try:
            tok = Tokenizer.from_str(path.read_text(encoding="utf-8"))
        except Exception as exc:  # tokenizers raises plain Exception on bad JSON
            raise ConfigError(f"{path} is not a readable tokenizer file ({exc}); delete it to retrain") from exc
        return cls(tok, path=path, from_cache=True, eod_token=eod_token)

    def save(self, path: Path | str) -> None:
        """Write the tokenizer as JSON, atomically (a temporary file, then a rename)."""
        path = Path(path)
        atomic_write_bytes(path, self.to_json().encode("utf-8"))
        self.path = path

    def __repr__(self) -> str:
        return f"BPETokenizer(vocab_size={self.vocab_size}, eod_id={self.eod_id}, path={self.path})"


#: End-of-document tokens looked for, in this order, in a user's tokenizer.json when none is named.
KNOWN_EOD_TOKENS = (EOD_TOKEN, "<|end_of_text|>", "</s>", "<eos>", "<|eos|>", "[SEP]")


def load_tokenizer_file(path: Path | str, *, eod_token: str | None = None) -> BPETokenizer:
    """A Hugging Face ``tokenizer.json`` (the ``tokenizers`` format), used as it is; nothing is downloaded.

    ``path`` is the file or a folder holding ``tokenizer.json``. ``eod_token`` separates documents
    in the token stream; by default the first of :data:`KNOWN_EOD_TOKENS` the vocabulary has.
    """
    p = Path(path).expanduser()
    if p.is_dir():
        p = p / "tokenizer.json"
    if not p.is_file():
        raise ConfigError(
            f"tokenizer={str(path)!r}: no such file; give a tokenizer.json (Hugging Face tokenizers "
            f"format) or a folder holding one, or leave tokenizer empty to train the project's BPE"
        )
    try:
        tok = Tokenizer.from_str(p.read_text(encoding="utf-8"))
    except Exception as exc:  # tokenizers raises plain Exception on bad JSON
        raise ConfigError(
            f"tokenizer={str(p)!r} is not a tokenizer.json the tokenizers library can read ({exc}); "
            f"save it with tokenizer.save('tokenizer.json') or leave tokenizer empty"
        ) from exc
    if eod_token:
        if tok.token_to_id(eod_token) is None:
            raise ConfigError(
                f"eod_token={eod_token!r} is not in the vocabulary of {p}; name one of its tokens "
                f"(e.g. {', '.join(repr(t) for t in KNOWN_EOD_TOKENS if tok.token_to_id(t) is not None) or 'its end-of-text token'})"
            )
        eod = eod_token
    else:
        found = [t for t in KNOWN_EOD_TOKENS if tok.token_to_id(t) is not None]
        if not found:
            raise ConfigError(
                f"{p} has none of the end-of-document tokens {', '.join(KNOWN_EOD_TOKENS)}; name the one "
                f"that separates documents with eod_token=... (--set eod_token=...)"
            )
        eod = found[0]
    return BPETokenizer(tok, path=p, eod_token=eod)


def check_vocab_size(vocab_size: int) -> None:
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, (int, np.integer)):
        raise ConfigError(f"vocab_size={vocab_size!r}: need an integer, e.g. 4096")
    if not MIN_VOCAB_SIZE <= vocab_size <= MAX_VOCAB_SIZE:
        raise ConfigError(
            f"vocab_size={vocab_size}: need {MIN_VOCAB_SIZE} <= vocab_size <= {MAX_VOCAB_SIZE} "
            f"(256 byte tokens + end-of-document + merges); 4096-8192 suits a small model"
        )


def train_tokenizer(texts: Iterable[str], vocab_size: int) -> BPETokenizer:
    """Train a byte-level BPE of at most ``vocab_size`` tokens on ``texts`` (deterministic).

    The vocabulary is smaller than asked when the text runs out of pairs to merge.
    """
    check_vocab_size(vocab_size)
    tok = Tokenizer(models.BPE())
    # No normalizer: it would change the text and break the exact round trip.
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=int(vocab_size),
        special_tokens=[EOD_TOKEN],  # first, so its id is 0
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # all 256 bytes, seen or not
        show_progress=False,
    )
    t0 = time.perf_counter()
    tok.train_from_iterator(texts, trainer)
    return BPETokenizer(tok, train_seconds=time.perf_counter() - t0)


def tokenizer_key(fingerprint: str, vocab_size: int) -> str:
    """Cache key of a tokenizer trained on text with this fingerprint (see ``corpus_fingerprint``)."""
    ident = f"{fingerprint}|vocab={vocab_size}|v{TOKENIZER_VERSION}|tokenizers-{tokenizers.__version__}"
    return hashlib.sha256(ident.encode()).hexdigest()[:16]


def get_tokenizer(
    docs_or_corpus: Sequence[Document] | Sequence[str], vocab_size: int, cache_dir: Path | str
) -> BPETokenizer:
    """The tokenizer trained on these documents (or texts), from ``cache_dir`` if it was trained before.

    Pass only training text: whatever is given here is what the vocabulary is fitted to. A cache
    file that cannot be read is retrained and replaced, with a warning.
    """
    check_vocab_size(vocab_size)
    items = list(docs_or_corpus)
    if not items:
        raise ConfigError("get_tokenizer: no documents given; pass the training documents or texts")
    texts = [d.text if isinstance(d, Document) else d for d in items]
    if not all(isinstance(t, str) for t in texts):
        raise ConfigError("get_tokenizer: docs_or_corpus must hold Document objects or str texts")
    key = tokenizer_key(corpus_fingerprint(items), int(vocab_size))
    path = Path(cache_dir) / f"tokenizer-{key}.json"
    if path.is_file():
        try:
            return BPETokenizer.from_file(path)
        except ValueError as exc:
            warnings.warn(f"{exc}; retraining it", RuntimeWarning, stacklevel=2)
    log.info("training a %d-token BPE on %d texts (%.1f MB)", vocab_size, len(texts), sum(map(len, texts)) / 1e6)
    tok = train_tokenizer(texts, int(vocab_size))
    tok.save(path)
    return tok
