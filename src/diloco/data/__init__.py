"""The data pipeline: a bundled English corpus, a locally trained byte-level BPE, per-replica shards.

``prepare_tokens`` gives the train/validation token streams (cached), ``ShardSampler`` each
replica's disjoint, resumable batches, ``eval_batches`` the fixed validation batches.
See docs/data.md.
"""

from diloco.data.corpus import SOURCES, Document, MissingSourceError, corpus_fingerprint, load_documents
from diloco.data.shards import DocumentSpan, ShardSampler, TokenData, eval_batches, prepare_tokens, split_point
from diloco.data.tokenizer import EOD_TOKEN, BPETokenizer, get_tokenizer, train_tokenizer

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
    "prepare_tokens",
    "split_point",
    "train_tokenizer",
]
