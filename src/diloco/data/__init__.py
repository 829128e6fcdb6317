"""The data pipeline: a bundled English corpus, a locally trained byte-level BPE, per-replica shards.

``prepare_data`` takes any source (bundled names, your text files / folders / globs, token files,
your tokenizer.json; see :mod:`diloco.data.sources`), ``prepare_tokens`` gives the train/validation token streams (cached), ``ShardSampler`` each
replica's disjoint, resumable batches, ``eval_batches`` the fixed validation batches.
See docs/guides/data.md.
"""

from diloco.data.corpus import SOURCES, Document, MissingSourceError, corpus_fingerprint, load_documents
from diloco.data.shards import ShardSampler, eval_batches
from diloco.data.sources import load_text_documents, load_token_files, prepare_data, resolve_paths
from diloco.data.tokenizer import EOD_TOKEN, BPETokenizer, get_tokenizer, load_tokenizer_file, train_tokenizer
from diloco.data.tokens import DocumentSpan, TokenData, prepare_tokens, split_point

__all__ = [
    "BPETokenizer",
    "Document",
    "DocumentSpan",
    "EOD_TOKEN",
    "MissingSourceError",
    "SOURCES",
    "ShardSampler",
    "TokenData",
    "corpus_fingerprint",
    "eval_batches",
    "get_tokenizer",
    "load_documents",
    "load_text_documents",
    "load_token_files",
    "load_tokenizer_file",
    "prepare_data",
    "prepare_tokens",
    "resolve_paths",
    "split_point",
    "train_tokenizer",
]
