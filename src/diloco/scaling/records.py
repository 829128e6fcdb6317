"""What the fits read: a sweep's finished records, checked line by line; the scaling-laws paper's Table 4
as records; and the method keys ("dp", "diloco-m4") results are grouped and labelled by."""

from __future__ import annotations

import json
import math
import warnings
from importlib import resources
from pathlib import Path
from typing import Any

from diloco.errors import ConfigError
from diloco.scaling.sweep import read_results

__all__ = ["is_number", "key_order", "load_records", "method_key", "paper_table4", "paper_table4_records", "split_key"]


def method_key(method: str, replicas: int) -> str:
    """How results are grouped and labelled: "dp", or e.g. "diloco-m4"."""
    return "dp" if method == "dp" else f"{method}-m{int(replicas)}"


def split_key(key: str) -> tuple[str, int]:
    """The inverse of :func:`method_key`: "diloco-m4" -> ("diloco", 4), "dp" -> ("dp", 1)."""
    if key == "dp":
        return "dp", 1
    method, sep, m = key.rpartition("-m")
    if not sep or not m.isdigit():
        raise ConfigError(f"method key {key!r}: expected 'dp' or '<method>-m<M>', e.g. 'diloco-m4'")
    return method, int(m)


def key_order(key: str) -> tuple[int, str, int]:
    """Sort key for method keys: "dp" first, then each method by M."""
    method, m = split_key(key)
    return (0 if method == "dp" else 1, method, m)


def _record_lines(path: Path) -> list[int]:
    """Line numbers (1-based) of the records :func:`read_results` returns, in the same order."""
    lines = Path(path).read_text(encoding="utf-8").split("\n")[:-1]  # the unfinished tail is not a record
    return [i for i, line in enumerate(lines, 1) if line.strip()]


def is_number(value: Any) -> bool:
    """A JSON number (int or float; not a bool)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def load_records(path: Path) -> list[dict[str, Any]]:
    """The finished ("ok") runs of a sweep results file, the last record of each run_id.

    Every record is checked before anything is fitted: a line that is not a JSON object, a record
    without ``method`` or ``num_params``, a ``method`` or ``replicas`` of the wrong kind, or an
    ``eval_loss`` that is not a number is a ValueError naming ``path:line``. A finished record whose
    loss is NaN, infinite or <= 0 is skipped with a warning naming its line (it cannot be fitted
    in log space, and it must not silently remove or keep a law depending on where it sits).
    """
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"results file {path} does not exist; run `diloco sweep --out {path}` first")
    records = read_results(path)
    line_of = _record_lines(path)
    latest: dict[str, tuple[int, dict[str, Any]]] = {}
    for line, rec in zip(line_of, records):
        where = f"{path}:{line}"
        if not isinstance(rec, dict):
            raise ConfigError(
                f"{where}: a record must be a JSON object, got {type(rec).__name__} "
                f"({json.dumps(rec)[:60]}); fix or delete that line"
            )
        if rec.get("status", "ok") != "ok":
            latest[rec.get("run_id") or f"line-{line}"] = (line, rec)
            continue
        for key in ("method", "num_params", "eval_loss"):
            if key not in rec:
                raise ConfigError(
                    f"{where}: the record has no {key!r} (keys: {', '.join(sorted(rec)) or 'none'}); "
                    f"every finished run needs method, num_params and eval_loss"
                )
        if not isinstance(rec["method"], str) or not rec["method"]:
            raise ConfigError(f"{where}: method={rec['method']!r} must be a name such as 'dp' or 'diloco'")
        if not (is_number(rec["num_params"]) and rec["num_params"] > 0):
            raise ConfigError(f"{where}: num_params={rec['num_params']!r} must be a positive number")
        replicas = rec.get("replicas", 1)
        if replicas is not None and not (is_number(replicas) and replicas >= 1 and replicas == int(replicas)):
            raise ConfigError(f"{where}: replicas={replicas!r} must be a whole number >= 1")
        loss = rec["eval_loss"]
        if loss is not None and not is_number(loss):
            raise ConfigError(f"{where}: eval_loss={loss!r} is not a number")
        latest[rec.get("run_id") or f"line-{line}"] = (line, rec)
    ok = []
    for line, rec in latest.values():
        if rec.get("status", "ok") != "ok" or rec.get("eval_loss") is None:
            continue
        loss = float(rec["eval_loss"])
        if not (math.isfinite(loss) and loss > 0):
            warnings.warn(
                f"{path}:{line}: skipped a run with eval_loss={loss!r} (not a finite positive loss)", stacklevel=2
            )
            continue
        ok.append(rec)
    if not ok:
        raise ConfigError(f"{path} holds no finished runs (status 'ok'); run `diloco sweep` first")
    return ok


def paper_table4() -> dict[str, Any]:
    """The scaling-laws paper's Table 4 (best eval loss per size and method), with its source."""
    text = (resources.files("diloco.scaling.data") / "paper_table4.json").read_text()
    return json.loads(text)


def paper_table4_records() -> list[dict[str, Any]]:
    """Table 4 as sweep records (one per size and method, without hyperparameters)."""
    table = paper_table4()
    records = []
    for row in table["rows"]:
        size, n, *losses = row
        for col, loss in zip(table["columns"][2:], losses):
            method, replicas = ("dp", 1) if col == "dp" else ("diloco", int(col.split("-m")[1]))
            records.append(
                {
                    "run_id": f"paper-{size}-{col}",
                    "size": size,
                    "num_params": n,
                    "method": method,
                    "replicas": replicas,
                    "eval_loss": loss,
                    "tokens": 20 * n,
                    "status": "ok",
                    "source": "paper",
                }
            )
    return records
