"""The project's file rules: atomic writes, strict JSON, JSONL with an unfinished last line."""

import json
import math

import pytest

from diloco.files import (
    append_jsonl,
    atomic_write_bytes,
    default_cache_dir,
    dumps_strict,
    read_jsonl,
    write_json,
)


def test_write_json_is_strict_and_leaves_old_file_on_refusal(tmp_path):
    p = tmp_path / "s.json"
    write_json(p, {"a": 1})
    before = p.read_bytes()
    with pytest.raises(ValueError, match="NaN"):
        write_json(p, {"a": math.nan})
    assert p.read_bytes() == before
    assert json.loads(before) == {"a": 1}
    assert list(tmp_path.iterdir()) == [p]  # no temporary left behind


def test_atomic_write_replaces_whole_file(tmp_path):
    p = tmp_path / "x.bin"
    atomic_write_bytes(p, b"old")
    atomic_write_bytes(p, b"new content")
    assert p.read_bytes() == b"new content"


def test_read_jsonl_skips_partial_tail_and_reports_it(tmp_path):
    p = tmp_path / "r.jsonl"
    p.write_text('{"a": 1}\n\n{"a": 2}\n{"a": 3')
    seen = []
    assert read_jsonl(p, on_partial=seen.append) == [{"a": 1}, {"a": 2}]
    assert len(seen) == 1 and "r.jsonl:4" in seen[0]


def test_read_jsonl_bad_middle_line_names_file_and_line(tmp_path):
    p = tmp_path / "r.jsonl"
    p.write_text('{"a": 1}\nnot json\n{"a": 2}\n')
    with pytest.raises(ValueError, match=r"r\.jsonl:2"):
        read_jsonl(p)
    assert read_jsonl(tmp_path / "missing.jsonl") == []


def test_append_jsonl_text_and_binary(tmp_path):
    p = tmp_path / "a.jsonl"
    with open(p, "a") as fh:
        append_jsonl(fh, {"x": 1})
    with open(p, "ab") as fh:
        append_jsonl(fh, {"x": 2})
    assert read_jsonl(p) == [{"x": 1}, {"x": 2}]
    with pytest.raises(ValueError):
        dumps_strict(float("inf"))


def test_cache_dir_honours_env(monkeypatch, tmp_path):
    monkeypatch.setenv("DILOCO_CACHE", str(tmp_path))
    assert default_cache_dir() == tmp_path
    monkeypatch.delenv("DILOCO_CACHE")
    assert default_cache_dir().name == "diloco"


def test_atomic_writes_get_the_usual_mode(tmp_path):
    from diloco.files import FILE_MODE

    p = tmp_path / "m.json"
    write_json(p, {"a": 1})
    assert (p.stat().st_mode & 0o777) == FILE_MODE
