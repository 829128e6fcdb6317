"""Loaders of the larger bundled corpus: English text from Debian packages (``make setup`` installs them).

Each loader reads files a Debian package installs under ``/usr/share`` (no download at run time) and
returns :class:`~diloco.data.corpus.Document` objects in a fixed order; the sources, their packages
and licences are registered in :data:`diloco.data.corpus.SOURCES` and described in docs/guides/data.md.

* ``gcide`` (``dict-gcide``): the Collaborative International Dictionary of English (Webster's
  1913 and WordNet), ``/usr/share/dictd/gcide.dict.dz``: one document per initial letter, the
  entries in the dictionary's order. Entries are found through the dictd index (headword, offset,
  length in dictd's base-64); the ``00-database-*`` header entries are left out. Three lines of
  the file are not UTF-8: decoded with U+FFFD replacement.
* ``linux-doc`` (``linux-doc``; Debian 12: ``linux-doc-6.1``): the kernel's documentation, one document per ``.rst`` / ``.txt``
  file under ``Documentation/`` (gzipped), in path order. Device-tree YAML schemas, SVG and the
  rendered HTML are left out: they are data, not prose.
* ``python-doc`` (``python3-doc``; Debian 12: ``python3.11-doc``): the Python documentation's reStructuredText sources
  (``html/_sources/**/*.rst.txt``), one document per page.
* ``jargon`` (``jargon-text``): the Jargon File 4.4.7, one document.
* ``fortunes`` (``fortunes``, ``fortunes-min``): the fortune cookie files, one document per file
  (``%`` lines separate the cookies, as in the files).
"""

from __future__ import annotations

import gzip
from pathlib import Path

from diloco.data.corpus import Document, MissingSourceError, normalize_text
from diloco.errors import ConfigError

__all__ = [
    "DICTD_B64",
    "dictd_number",
    "load_fortunes",
    "load_gcide",
    "load_jargon",
    "load_linux_doc",
    "load_python_doc",
]

DICTD_B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
_B64_VALUE = {c: i for i, c in enumerate(DICTD_B64)}


def dictd_number(text: str) -> int:
    """An offset or length of a dictd ``.index`` file (base 64, most significant digit first)."""
    n = 0
    for ch in text:
        if ch not in _B64_VALUE:
            raise ConfigError(f"{text!r} is not a dictd base-64 number (digit {ch!r})")
        n = n * 64 + _B64_VALUE[ch]
    return n


def _need(path: Path, source: str) -> None:
    if not path.exists():
        from diloco.data.corpus import SOURCES

        raise MissingSourceError(
            f"{path} is missing: the corpus source {source!r} looks incomplete; "
            f"reinstall it with: {SOURCES[source].install}"
        )


def load_gcide(root: Path) -> list[Document]:
    """``root`` = /usr/share/dictd: one document per initial letter (a..z, then ``other``)."""
    data_path, index_path = root / "gcide.dict.dz", root / "gcide.index"
    _need(data_path, "gcide")
    _need(index_path, "gcide")
    data = gzip.decompress(data_path.read_bytes())  # dictzip is gzip with a random-access table
    entries: dict[int, tuple[str, int]] = {}  # offset -> (headword, length); several headwords share an entry
    for line in index_path.read_text(encoding="utf-8").splitlines():
        word, offset, length = line.split("\t")
        if word.startswith("00-"):  # 00-database-info etc.: the file's header, not dictionary text
            continue
        entries.setdefault(dictd_number(offset), (word, dictd_number(length)))
    letters: dict[str, list[str]] = {}
    for offset in sorted(entries):
        word, length = entries[offset]
        first = word[:1].lower()
        key = first if "a" <= first <= "z" else "other"
        letters.setdefault(key, []).append(data[offset : offset + length].decode("utf-8", errors="replace"))
    order = [chr(c) for c in range(ord("a"), ord("z") + 1)] + ["other"]
    return [Document(k, "gcide", normalize_text("\n".join(letters[k]))) for k in order if k in letters]


def _read_maybe_gz(path: Path) -> str:
    raw = path.read_bytes()
    if path.suffix == ".gz":
        raw = gzip.decompress(raw)
    return raw.decode("utf-8", errors="replace")


def load_linux_doc(root: Path) -> list[Document]:
    """``root`` = /usr/share/doc/linux-doc-<version>/Documentation: every .rst/.txt file (gzipped or not)."""
    _need(root, "linux-doc")
    suffixes = (".rst", ".txt", ".rst.gz", ".txt.gz")
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.name.endswith(suffixes))
    return [
        Document(str(p.relative_to(root)).removesuffix(".gz"), "linux-doc", normalize_text(_read_maybe_gz(p)))
        for p in files
    ]


def load_python_doc(root: Path) -> list[Document]:
    """``root`` = /usr/share/doc/python3.<minor>/html/_sources: the .rst.txt page sources."""
    _need(root, "python-doc")
    files = sorted(p for p in root.rglob("*.rst.txt") if p.is_file())
    return [
        Document(
            str(p.relative_to(root)).removesuffix(".txt"),
            "python-doc",
            normalize_text(p.read_text(encoding="utf-8", errors="replace")),
        )
        for p in files
    ]


def load_jargon(root: Path) -> list[Document]:
    """``root`` = /usr/share/doc/jargon-text: jargon.txt.gz, one document."""
    path = root / "jargon.txt.gz"
    _need(path, "jargon")
    return [Document("jargon", "jargon", normalize_text(_read_maybe_gz(path)))]


def load_fortunes(root: Path) -> list[Document]:
    """``root`` = /usr/share/games/fortunes: each cookie file (not the .dat indexes nor .u8 links)."""
    _need(root, "fortunes")
    files = sorted(p for p in root.iterdir() if p.is_file() and not p.is_symlink() and not p.suffix)
    return [
        Document(p.name, "fortunes", normalize_text(p.read_bytes().decode("utf-8", errors="replace"))) for p in files
    ]
