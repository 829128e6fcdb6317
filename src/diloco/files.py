"""Files the project writes and reads: atomic writes, strict JSON, JSONL, the cache folder.

One definition of each, used by the trainer, checkpoints, tokenizer cache,
sweeps, fits and the CLI. Pure standard library (no torch), so the simulator
and planner can use it too.

Rules:

* An atomic write goes to a temporary file in the same folder, is flushed and
  fsync'ed, then renamed over the target: a reader sees the old file or the
  whole new one, never a part, whatever kills the writer.
* JSON is strict: NaN and infinities are refused when writing (``allow_nan=False``);
  callers turn "no value" into ``null`` themselves.
* A JSONL file's last line without a trailing newline is an unfinished write
  (a crash mid-append): :func:`read_jsonl` skips it and says so through
  ``on_partial``; a bad line anywhere else is a :class:`ValueError` naming the
  file and line, since it means the file was edited or damaged.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from diloco.errors import ConfigError

#: Environment variable that overrides the default cache folder.
CACHE_ENV = "DILOCO_CACHE"


def _read_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


#: Read once at import: os.umask can only be read by setting it, which would race with other threads.
FILE_MODE = 0o666 & ~_read_umask()


def default_cache_dir() -> Path:
    """``$DILOCO_CACHE`` if set, else ``~/.cache/diloco``: tokenizers and token files are cached here."""
    env = os.environ.get(CACHE_ENV)
    return Path(env) if env else Path.home() / ".cache" / "diloco"


def atomic_write_bytes(path: Path | str, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see the old file or the whole new one, never a part."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, FILE_MODE)  # mkstemp makes 0600; give the file the usual mode
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_with(path: Path | str, write: Callable[[Any], None]) -> None:
    """Like :func:`atomic_write_bytes`, but ``write(binary_file)`` produces the content (e.g. ``torch.save``)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, FILE_MODE)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def dumps_strict(obj: Any, *, indent: int | None = 2) -> str:
    """``json.dumps`` that refuses NaN and infinities (strict JSON), naming the failure."""
    try:
        return json.dumps(obj, indent=indent, allow_nan=False)
    except ValueError as exc:
        raise ConfigError(f"refusing to write non-strict JSON (NaN or infinity; use null): {exc}") from None


def write_json(path: Path | str, obj: Any, *, indent: int | None = 2) -> None:
    """Atomically write ``obj`` as strict JSON (with a final newline)."""
    atomic_write_bytes(path, (dumps_strict(obj, indent=indent) + "\n").encode("utf-8"))


def read_json(path: Path | str) -> Any:
    """Read a JSON file; a parse error is a ValueError naming the file and position."""
    path = Path(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: not valid JSON ({exc})") from None


def read_jsonl(path: Path | str, *, on_partial: Callable[[str], None] | None = None) -> list[Any]:
    """All records of a JSONL file, in order (``[]`` if the file does not exist).

    The text after the last newline, if any, is an unfinished write and is
    skipped; ``on_partial`` (e.g. ``warnings.warn``) is told so with the file
    and line number. Blank lines are skipped. Any other line that is not JSON
    raises ValueError naming ``path:line``.
    """
    path = Path(path)
    if not path.exists():
        return []
    lines = path.read_text(encoding="utf-8").split("\n")
    complete, tail = lines[:-1], lines[-1]
    records = []
    for i, line in enumerate(complete, 1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{path}:{i} is not valid JSON ({exc}); fix or delete that line") from None
    if tail.strip() and on_partial is not None:
        on_partial(f"{path}:{len(lines)}: skipped an unfinished last line (no newline; a crash mid-write?)")
    return records


def append_jsonl(fh: Any, record: Any) -> None:
    """Append one strict-JSON record to an open text or binary file, flushed and fsync'ed."""
    line = dumps_strict(record, indent=None) + "\n"
    fh.write(line.encode("utf-8") if "b" in getattr(fh, "mode", "") else line)
    fh.flush()
    os.fsync(fh.fileno())


__all__ = [
    "CACHE_ENV",
    "append_jsonl",
    "atomic_write_bytes",
    "atomic_write_with",
    "default_cache_dir",
    "dumps_strict",
    "read_json",
    "read_jsonl",
    "write_json",
]
