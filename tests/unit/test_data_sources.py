"""Your data: text files / folders / globs, token files (nanoGPT .bin, .npy), your tokenizer.json; and bad input."""

from __future__ import annotations

import json
import pydoc

import numpy as np
import pytest

from diloco.data import ShardSampler, prepare_data, resolve_paths, train_tokenizer
from diloco.data.corpus import normalize_text
from diloco.data.sources import load_text_documents

# Real English text that is not the bundled corpus: the documentation of a few standard-library modules.
MODULES = ("argparse", "json", "logging", "pathlib", "subprocess", "unittest")


def _doc(name: str) -> str:
    return pydoc.render_doc(name, renderer=pydoc.plaintext)


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("my-corpus")
    (root / "guides").mkdir()
    for i, name in enumerate(MODULES[:4]):
        (root / ("guides" if i % 2 else ".") / f"{name}.txt").write_text(_doc(name), encoding="utf-8")
    (root / "notes.md").write_text("# Notes\n\n" + _doc(MODULES[4]), encoding="utf-8")
    rows = [{"text": para, "id": k} for k, para in enumerate(_doc(MODULES[5]).split("\n\n")) if para.strip()]
    (root / "rows.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    (root / ".hidden").mkdir()
    (root / ".hidden" / "skip.txt").write_text("not read", encoding="utf-8")
    return root


def test_folder_glob_and_file_name_the_same_documents(corpus_dir):
    files = resolve_paths(str(corpus_dir))
    assert [str(f.relative_to(corpus_dir)) for f in files] == [
        "argparse.txt",
        "guides/json.txt",
        "guides/pathlib.txt",
        "logging.txt",
        "notes.md",
        "rows.jsonl",
    ]
    assert all(".hidden" not in str(f) for f in files)
    docs = load_text_documents([str(corpus_dir)])
    by_glob = load_text_documents(
        [str(corpus_dir / "**" / "*.txt"), str(corpus_dir / "*.md"), str(corpus_dir / "rows.jsonl")]
    )
    assert sorted(d.text for d in docs) == sorted(d.text for d in by_glob)
    jsonl = [d for d in docs if ":" in d.name.rsplit("/", 1)[-1]]
    assert len(jsonl) > 5 and all(d.name.split(":")[0].endswith("rows.jsonl") for d in jsonl)
    # a folder named twice counts once
    assert len(load_text_documents([str(corpus_dir), str(corpus_dir / "*.md")])) == len(docs)


def test_text_sources_train_a_bpe_cached_by_content(corpus_dir, tmp_path):
    cache = tmp_path / "cache"
    data = prepare_data([str(corpus_dir)], vocab_size=400, cache_dir=cache, val_fraction=0.1)
    assert data.tokenizer is not None and data.vocab_size == data.tokenizer.vocab_size <= 400
    assert data.metadata["tokenizer_trained_now"] and data.train.size > 5 * data.val.size > 0
    text = corpus_dir / "argparse.txt"
    # held-out split per document: each document's validation tail decodes to the end of its text
    span = next(s for s in data.documents if s.name == str(text))
    tail = data.tokenizer.decode(data.val[span.val_start : span.val_end])
    assert normalize_text(text.read_text(encoding="utf-8")).endswith(tail) and len(tail) > 100
    again = prepare_data([str(corpus_dir)], vocab_size=400, cache_dir=cache, val_fraction=0.1)
    assert again.metadata["from_cache"] and np.array_equal(again.train, data.train)
    other = tmp_path / "other"
    other.mkdir()
    (other / "a.txt").write_text(text.read_text(encoding="utf-8") + "\nOne more line.\n", encoding="utf-8")
    changed = prepare_data([str(other)], vocab_size=400, cache_dir=cache, val_fraction=0.1)
    assert changed.metadata["tokenizer_file"] != data.metadata["tokenizer_file"]  # keyed by content


def test_your_tokenizer_json_is_used_as_it_is(corpus_dir, tmp_path):
    docs = load_text_documents([str(corpus_dir)])
    mine = train_tokenizer([d.text for d in docs], 300)
    path = tmp_path / "tok" / "tokenizer.json"
    path.parent.mkdir()
    path.write_text(mine.to_json(), encoding="utf-8")
    data = prepare_data([str(corpus_dir)], vocab_size=4096, cache_dir=tmp_path / "c", tokenizer=str(path.parent))
    assert data.vocab_size == mine.vocab_size and data.tokenizer.eod_token == "<|endoftext|>"
    assert data.tokenizer.to_json() == mine.to_json()
    assert data.train[:50].tolist() == mine.encode(docs[0].text[:2000])[:50]
    assert data.metadata["tokenizer_source"] == str(path)
    cached = prepare_data([str(corpus_dir)], vocab_size=4096, cache_dir=tmp_path / "c", tokenizer=str(path))
    assert cached.metadata["from_cache"] and cached.tokenizer.eod_id == data.tokenizer.eod_id


def test_nanogpt_bin_is_memory_mapped_and_split_per_file(tmp_path):
    ids = np.random.default_rng(0).integers(0, 1000, size=5000).astype(np.uint16)
    ids.tofile(tmp_path / "shard.bin")
    data = prepare_data([str(tmp_path / "shard.bin")], vocab_size=1000, cache_dir=tmp_path / "c", val_fraction=0.1)
    assert isinstance(data.train, np.memmap) and data.tokenizer is None and data.vocab_size == 1000
    assert np.array_equal(np.concatenate([data.train, data.val]), ids) and data.val.size == 500
    # nanoGPT's folder layout: train.bin and val.bin give the split
    folder = tmp_path / "owt"
    folder.mkdir()
    ids[:4000].tofile(folder / "train.bin")
    ids[4000:].tofile(folder / "val.bin")
    split = prepare_data([str(folder)], vocab_size=1000, cache_dir=tmp_path / "c")
    assert np.array_equal(split.train, ids[:4000]) and np.array_equal(split.val, ids[4000:])


def test_npy_uint32_and_resume_positions_are_exact(tmp_path):
    ids = np.random.default_rng(1).integers(0, 70000, size=6000).astype(np.uint32)
    np.save(tmp_path / "ids.npy", ids)
    data = prepare_data([str(tmp_path / "ids.npy")], vocab_size=70000, cache_dir=tmp_path / "c")
    assert data.train.dtype == np.uint32 and isinstance(data.train, np.memmap)
    samplers = [ShardSampler(data.train, rank=r, world_size=2, batch_size=3, seq_len=16, seed=0) for r in range(2)]
    assert not set(samplers[0].window_starts) & set(samplers[1].window_starts)  # disjoint shards
    for _ in range(5):
        samplers[0].next_batch()
    state = samplers[0].state_dict()
    expected = [samplers[0].next_batch()[0] for _ in range(200)]  # crosses an epoch
    resumed = ShardSampler(data.train, rank=0, world_size=2, batch_size=3, seq_len=16, seed=0)
    resumed.load_state_dict(state)
    assert all((resumed.next_batch()[0] == e).all() for e in expected)


# -- bad input: a ValueError naming the value and the fix --------------------------------------


def test_bad_sources_name_the_value_and_the_fix(tmp_path):
    cache = tmp_path / "c"
    cases = []
    cases.append(([str(tmp_path / "nope.txt")], r"nope.txt'?: no such file or folder.*give an existing file"))
    (tmp_path / "empty").mkdir()
    cases.append(([str(tmp_path / "empty")], r"the folder holds no .*put your text in"))
    (tmp_path / "blank").mkdir()
    (tmp_path / "blank" / "a.txt").write_text("  \n\n", encoding="utf-8")
    cases.append(([str(tmp_path / "blank")], r"every file is empty.*add text"))
    (tmp_path / "latin1.txt").write_bytes("caf\xe9 au lait\n".encode("latin-1"))
    cases.append(([str(tmp_path / "latin1.txt")], r"latin1.txt is not UTF-8 text: byte 0xe9 at offset 3.*iconv"))
    (tmp_path / "bad.jsonl").write_text('{"text": "fine"}\n{"body": "no text"}\n', encoding="utf-8")
    cases.append(([str(tmp_path / "bad.jsonl")], r'bad.jsonl:2 has no string "text" field'))
    (tmp_path / "data.csv").write_text("a,b\n", encoding="utf-8")
    cases.append(([str(tmp_path / "data.csv")], r"unknown file type '.csv'.*\.txt/\.md/\.jsonl"))
    cases.append(([str(tmp_path / "*.parquet")], r"the glob matches no .*check the pattern"))
    cases.append(
        (["shakespear"], r"'shakespear': no such file or folder; the bundled sources are bible, fortunes, gcide")
    )
    np.arange(10, dtype=np.uint16).tofile(tmp_path / "t.bin")
    cases.append(([str(tmp_path / "t.bin"), "bible"], r"cannot be mixed with text"))
    for sources, message in cases:
        with pytest.raises(ValueError, match=message):
            prepare_data(sources, vocab_size=300, cache_dir=cache)
    assert not cache.exists()  # nothing was written for any of them


def test_token_ids_at_or_above_the_vocabulary_are_refused(tmp_path):
    np.array([1, 2, 511, 512, 3], dtype=np.uint16).tofile(tmp_path / "ids.bin")
    with pytest.raises(
        ValueError,
        match=r"ids.bin holds token id 512, which is >= vocab_size=512; set vocab_size "
        r"to at least 513",
    ):
        prepare_data([str(tmp_path / "ids.bin")], vocab_size=512, cache_dir=tmp_path / "c")
    (tmp_path / "odd.bin").write_bytes(b"\x01\x00\x02")
    with pytest.raises(ValueError, match=r"odd.bin has 3 bytes, not a whole number of uint16 ids"):
        prepare_data([str(tmp_path / "odd.bin")], vocab_size=512, cache_dir=tmp_path / "c")


def test_a_tokenizer_without_an_end_of_document_token_is_refused(tmp_path):
    from tokenizers import Tokenizer, models

    path = tmp_path / "tokenizer.json"
    Tokenizer(models.BPE()).save(str(path))
    (tmp_path / "a.txt").write_text("hello world\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"has none of the end-of-document tokens.*eod_token="):
        prepare_data([str(tmp_path / "a.txt")], vocab_size=300, cache_dir=tmp_path / "c", tokenizer=str(path))
    with pytest.raises(ValueError, match=r"tokenizer='.*missing.json': no such file"):
        prepare_data(
            [str(tmp_path / "a.txt")],
            vocab_size=300,
            cache_dir=tmp_path / "c",
            tokenizer=str(tmp_path / "missing.json"),
        )
