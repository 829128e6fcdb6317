"""Resumable hyperparameter sweeps over model size, method and replicas: one JSONL file of results.

A :class:`GridSpec` expands into plain-dict run configs, each with a stable ``run_id`` (a hash of
the config). :func:`run_sweep` calls a *run function* on every config whose ``run_id`` has no
finished record yet and appends one JSON line per finished run, flushed and fsync'ed, so a crash or
Ctrl-C loses at most the run in progress and a restart picks up where it stopped. The run
function is looked up by name in :data:`RUNNERS`: ``"train"`` (the real trainer,
``diloco.train.sweep_runner.run_config``) or ``"synthetic"`` (a known noisy law, for tests and demos).
Where the runs execute (this process, one process per run locally, or SLURM jobs) is the
executor's business (:mod:`diloco.scaling.executors`); this module is the only writer of the file.

The record format is documented in docs/guides/scaling-sweeps.md.
"""

from __future__ import annotations

import copy
import fcntl
import hashlib
import json
import math
import os
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from tqdm import tqdm

from diloco.errors import ConfigError
from diloco.files import append_jsonl, read_jsonl
from diloco.methods import METHODS
from diloco.scaling.synthetic import synthetic_run

RunFn = Callable[[dict[str, Any]], dict[str, Any]]

SWEEP_METHODS = METHODS  # the trainer's methods (diloco.methods)

# Parameter counts N by size name (tokens per run = tokens_per_param * N). A grid may override or
# extend them with its own ``num_params`` mapping; other names are looked up in the model zoo
# (``diloco.models.sizes``), which counts non-embedding parameters. Prefilled with the scaling-laws
# paper's nominal sizes (arXiv 2503.09799, Tables 3-4; Table 3 labels 335M as 330M), so that
# tokens = 20 N reproduces its budgets (35M -> 700M tokens). Those nominal counts include the tied
# embedding (see diloco.models.sizes); the CPU sizes are named by their non-embedding count.
SIZE_PARAMS: dict[str, int] = {
    "35M": 35_000_000,
    "90M": 90_000_000,
    "180M": 180_000_000,
    "335M": 335_000_000,
    "330M": 330_000_000,
    "550M": 550_000_000,
    "1.3B": 1_300_000_000,
    "2.4B": 2_400_000_000,
    "4B": 4_000_000_000,
    "10B": 10_000_000_000,
}


def train_runner(config: dict[str, Any]) -> dict[str, Any]:
    """The real trainer (:func:`diloco.train.sweep_runner.run_config`); imported when a run starts, not
    when this module is (it pulls in torch)."""
    from diloco.train.sweep_runner import run_config

    return run_config(config)


#: Run functions by name (``diloco sweep --runner NAME``). Module-level functions, so that the
#: process executors can send them to a child by name.
RUNNERS: dict[str, RunFn] = {
    "synthetic": synthetic_run,
    "train": train_runner,
}


def register_runner(name: str, fn: RunFn) -> None:
    """Make ``fn`` available as ``diloco sweep --runner NAME`` (a module-level function for process executors)."""
    if not callable(fn):
        raise ConfigError(f"runner {name!r} must be a callable taking a run config, got {type(fn).__name__}")
    RUNNERS[name] = fn


def get_runner(name: str) -> RunFn:
    if name not in RUNNERS:
        raise ConfigError(f"unknown runner {name!r}; registered runners: {', '.join(sorted(RUNNERS))}")
    return RUNNERS[name]


def ladder(start: float, stop: float, factor: float | str) -> tuple[float, ...]:
    """start, start*f, start*f^2, ... up to stop (inclusive); f = 2, sqrt(2) ("sqrt2") or any number > 1.

    Values are rounded to 6 significant digits so that they print, hash and compare cleanly.
    """
    named = {"sqrt2": math.sqrt(2.0), "2": 2.0}
    f = named.get(factor) if isinstance(factor, str) else float(factor)
    if f is None or not f > 1.0:
        raise ConfigError(f"ladder factor {factor!r}: use 'sqrt2', '2' or a number > 1")
    if not 0 < start <= stop:
        raise ConfigError(f"ladder start={start}, stop={stop}: need 0 < start <= stop")
    count = int(math.floor(math.log(stop / start) / math.log(f) + 1e-9)) + 1
    return tuple(float(f"{start * f**k:.6g}") for k in range(count))


def _values(raw: Any, what: str, kind: type = float) -> tuple[Any, ...]:
    """A list of distinct numbers, or a ladder {"start", "stop", "factor"}, as a tuple of ``kind``."""
    if isinstance(raw, Mapping):
        unknown = set(raw) - {"start", "stop", "factor"}
        if unknown or not {"start", "stop", "factor"} <= set(raw):
            raise ConfigError(
                f"{what}: a ladder is {{'start': x, 'stop': y, 'factor': 'sqrt2' | '2' | number}}, "
                f"got keys {sorted(raw)}"
            )
        raw = ladder(float(raw["start"]), float(raw["stop"]), raw["factor"])
    elif isinstance(raw, (int, float)):
        raw = (raw,)
    if not isinstance(raw, Sequence) or isinstance(raw, str) or not raw:
        raise ConfigError(f"{what}: expected a non-empty list of numbers or a ladder, got {raw!r}")
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in raw):
        raise ConfigError(f"{what}: every value must be a number, got {list(raw)}")
    values = tuple(kind(v) for v in raw)
    if kind is int and any(v != int(v) for v in raw):
        raise ConfigError(f"{what}: {list(raw)} must be whole numbers")
    if len(set(values)) != len(values):
        raise ConfigError(f"{what}: {list(raw)} repeats a value (each grid point would run twice)")
    return values


def _per_size(raw: Any, sizes: Sequence[str], what: str, kind: type = float) -> dict[str, tuple[Any, ...]]:
    """One list for every size, or a mapping size -> list (to centre a grid on each size's optimum)."""
    if isinstance(raw, Mapping) and not {"start", "stop", "factor"} & set(raw):
        missing = [s for s in sizes if s not in raw]
        extra = [s for s in raw if s not in sizes]
        if missing or extra:
            raise ConfigError(
                f"{what}: per-size values must name exactly the grid's sizes (missing {missing}, not in sizes {extra})"
            )
        return {s: _values(raw[s], f"{what}[{s}]", kind) for s in sizes}
    values = _values(raw, what, kind)
    return {s: values for s in sizes}


def model_zoo_params(size: str, base: Mapping[str, Any]) -> int | None:
    """Non-embedding parameters of a named size of ``diloco.models.sizes`` (e.g. "cpu-1m"), or None.

    Imported only when needed: it pulls in torch. The count does not depend on the vocabulary or
    sequence length, but the CPU sizes need both to build a config, so ``base``'s are used if given.
    """
    try:
        from diloco.models.sizes import SIZES, make_config
        from diloco.models.transformer import count_params
    except ImportError:  # the model zoo is optional for sweeps of other run functions
        return None
    if size not in SIZES:
        return None
    config = make_config(size, vocab_size=int(base.get("vocab_size", 4096)), seq_len=int(base.get("seq_len", 128)))
    return int(count_params(config, embeddings=False))


@dataclass(frozen=True)
class GridSpec:
    """A sweep: every combination of the fields below (DiLoCo-only fields are ignored for DP).

    ``inner_lr`` and ``global_batch`` take one list for all sizes, a ladder
    ``{"start", "stop", "factor"}`` (powers of sqrt 2 for learning rates and of 2 for batches, as in
    the paper), or a mapping size -> list. Tokens per run are ``tokens_per_param * N``.
    ``base`` holds settings fixed across the grid, passed through to the run function untouched.
    """

    sizes: tuple[str, ...]
    inner_lr: Any
    global_batch: Any
    methods: tuple[str, ...] = ("dp", "diloco")
    replicas: tuple[int, ...] = (1, 2, 4, 8)  # M, for DiLoCo; DP runs once with M = 1
    outer_lr: tuple[float, ...] = (0.7,)
    sync_every: tuple[int, ...] = (30,)  # H
    tokens_per_param: float = 20.0
    num_params: Mapping[str, int] = field(default_factory=dict)  # size -> N, overrides SIZE_PARAMS
    seed: int = 0
    runner: str = "train"
    base: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        set_ = lambda name, value: object.__setattr__(self, name, value)
        if isinstance(self.sizes, str) or not self.sizes or len(set(self.sizes)) != len(self.sizes):
            raise ConfigError(f"sizes={self.sizes!r}: give a non-empty list of distinct size names")
        for name in ("sizes", "methods"):
            set_(name, tuple(getattr(self, name)))
        set_("replicas", _values(self.replicas, "replicas", int))
        set_("outer_lr", _values(self.outer_lr, "outer_lr"))
        set_("sync_every", _values(self.sync_every, "sync_every", int))
        set_("inner_lr", _per_size(self.inner_lr, self.sizes, "inner_lr"))
        set_("global_batch", _per_size(self.global_batch, self.sizes, "global_batch", int))
        if not isinstance(self.num_params, Mapping):
            raise ConfigError(f"num_params={self.num_params!r}: give a mapping size name -> parameter count")
        set_("num_params", {str(k): _values(v, f"num_params[{k}]", int)[0] for k, v in self.num_params.items()})
        if not isinstance(self.base, Mapping):
            raise ConfigError(f"base={self.base!r}: give a mapping of settings held fixed over the grid")
        set_("base", dict(self.base))

        bad_methods = [m for m in self.methods if m not in SWEEP_METHODS]
        if bad_methods or not self.methods or len(set(self.methods)) != len(self.methods):
            raise ConfigError(f"methods={list(self.methods)}: choose from {', '.join(SWEEP_METHODS)}")
        if any(m < 1 for m in self.replicas):
            raise ConfigError(f"replicas={list(self.replicas)}: every M must be >= 1")
        if any(h < 1 for h in self.sync_every):
            raise ConfigError(f"sync_every={list(self.sync_every)}: every H must be >= 1")
        if any(not v > 0 for v in self.outer_lr):
            raise ConfigError(f"outer_lr={list(self.outer_lr)}: must be positive")
        if not self.tokens_per_param > 0:
            raise ConfigError(f"tokens_per_param={self.tokens_per_param}: must be positive (the paper uses 20)")
        for s in self.sizes:
            if any(not v > 0 for v in self.inner_lr[s]):
                raise ConfigError(f"inner_lr for {s}: {list(self.inner_lr[s])} must be positive")
            if any(b < 1 for b in self.global_batch[s]):
                raise ConfigError(f"global_batch for {s}: {list(self.global_batch[s])} must be >= 1")
            if any(m != "dp" for m in self.methods):
                bad = [(b, m) for b in self.global_batch[s] for m in self.replicas if b % m]
                if bad:
                    raise ConfigError(
                        f"global_batch for {s}: (batch, M) pairs {bad} do not divide; each "
                        f"replica gets global_batch / M sequences, so use powers of 2 >= max M"
                    )
            self.size_params(s)  # raises for unknown sizes

    def size_params(self, size: str) -> int:
        """Parameter count N of a size name: the grid's ``num_params``, else :data:`SIZE_PARAMS`
        (the paper's nominal sizes), else the model zoo's non-embedding count."""
        if size in self.num_params:
            return self.num_params[size]
        if size in SIZE_PARAMS:
            return SIZE_PARAMS[size]
        counted = model_zoo_params(size, self.base)
        if counted is not None:
            return counted
        raise ConfigError(
            f"unknown size {size!r}: give its non-embedding parameter count in the grid's "
            f'num_params (e.g. "num_params": {{"{size}": 1200000}}) or register it in '
            f"diloco.scaling.sweep.SIZE_PARAMS; known: {', '.join(SIZE_PARAMS)}"
        )

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> GridSpec:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known - {"_comment"})
        if unknown:
            raise ConfigError(f"unknown grid keys {unknown}; valid keys: {', '.join(sorted(known))}")
        missing = sorted({"sizes", "inner_lr", "global_batch"} - set(data))
        if missing:
            raise ConfigError(f"the grid needs {missing}")
        return cls(**{k: v for k, v in data.items() if k in known})

    @classmethod
    def from_json(cls, path: Path) -> GridSpec:
        """Read a grid from a JSON file (data only: config files are never executed)."""
        try:
            data = json.loads(Path(path).read_text())
        except FileNotFoundError:
            raise ConfigError(f"grid file {path} does not exist") from None
        except json.JSONDecodeError as exc:
            raise ConfigError(f"grid file {path} is not valid JSON: {exc}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"grid file {path} must hold a JSON object")
        return cls.from_dict(data)


def run_id_of(config: Mapping[str, Any]) -> str:
    """A stable id: the first 16 hex digits of SHA-256 over the config's canonical JSON."""
    payload = json.dumps({k: v for k, v in config.items() if k != "run_id"}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def expand(grid: GridSpec) -> list[dict[str, Any]]:
    """Every run config of the grid, smallest models first (an interrupted sweep keeps whole sizes)."""
    out = []
    for size in sorted(grid.sizes, key=grid.size_params):
        n = grid.size_params(size)
        for method in grid.methods:
            # DP has no replicas, outer optimizer or H: one run per (lr, batch) with M = 1.
            outer = (
                [(1, None, None)]
                if method == "dp"
                else [(m, o, h) for m in grid.replicas for o in grid.outer_lr for h in grid.sync_every]
            )
            for replicas, outer_lr, sync_every in outer:
                for batch in grid.global_batch[size]:
                    for lr in grid.inner_lr[size]:
                        cfg = {
                            "size": size,
                            "num_params": n,
                            "method": method,
                            "replicas": replicas,
                            "inner_lr": lr,
                            "global_batch": batch,
                            "outer_lr": outer_lr,
                            "sync_every": sync_every,
                            "tokens": int(round(grid.tokens_per_param * n)),
                            "seed": grid.seed,
                            "runner": grid.runner,
                            "base": dict(grid.base),
                        }
                        out.append({"run_id": run_id_of(cfg), **cfg})
    assert len({c["run_id"] for c in out}) == len(out), "GridSpec validation lets no value repeat"
    return out


def expand_grids(grids: Sequence[GridSpec]) -> list[dict[str, Any]]:
    """The runs of several grids (a staged search is one grid per stage and method), in order, each once:
    a point two grids share (the same config, so the same ``run_id``) runs once. The grids must agree on
    the run function, since one sweep calls one."""
    grids = list(grids)
    if not grids:
        raise ConfigError("give at least one grid")
    runners = sorted({g.runner for g in grids})
    if len(runners) > 1:
        raise ConfigError(
            f"the grids name different runners {runners}; sweep them one runner at a time "
            f"(or pass --runner to use one for all)"
        )
    out, seen = [], set()
    for grid in grids:
        for cfg in expand(grid):
            if cfg["run_id"] not in seen:
                seen.add(cfg["run_id"])
                out.append(cfg)
    return out


# -- the results file ---------------------------------------------------------------------------
def read_results(path: Path, *, warn: bool = True) -> list[dict[str, Any]]:
    """All records of a results JSONL file, in order (:func:`diloco.files.read_jsonl`): an unfinished
    last line (a crash mid-write) is skipped with a warning; a corrupt line anywhere else is an
    error naming the file and line, since it means the file was edited."""
    return read_jsonl(path, on_partial=(lambda msg: warnings.warn(msg, stacklevel=3)) if warn else None)


def _drop_partial_tail(f: Any) -> None:
    """Cut an unfinished last line so the next record starts on a line of its own."""
    f.seek(0, os.SEEK_END)
    size = f.tell()
    if size == 0:
        return
    f.seek(max(0, size - 65536))
    tail = f.read()
    if tail.endswith(b"\n"):
        return
    keep = size - len(tail) + tail.rfind(b"\n") + 1 if b"\n" in tail else 0
    f.truncate(keep)


def _lock(f: Any, path: Path) -> None:
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise ConfigError(f"another sweep is writing {path}; wait for it or use another --out") from None


def _follow(f: Any, path: Path) -> Any:
    """The results file as ``path`` names it now: ``f`` itself, or, when ``path`` no longer names ``f``'s file (it was
    replaced or removed while the sweep ran: a ``git stash`` or checkout, an editor's save), ``path`` opened and locked
    anew, with every record line of ``f`` that it lacks appended in order, so that nothing the sweep wrote is lost (a
    warning says how many). Without this the sweep would go on appending to a file no path names."""
    try:
        if os.path.samestat(os.fstat(f.fileno()), os.stat(path)):
            return f
    except FileNotFoundError:
        pass
    new = path.open("a+b")
    try:
        _lock(new, path)
        _drop_partial_tail(new)
        new.seek(0)
        have = set(new.read().splitlines())
        f.seek(0)
        lines = [line for line in f.read().splitlines() if line.endswith(b"}")]
        missing = [line for line in lines if line not in have]
        for line in missing:
            new.write(line + b"\n")
        new.flush()
        os.fsync(new.fileno())
    except BaseException:
        new.close()
        raise
    warnings.warn(
        f"{path} was replaced while the sweep ran (a git stash or checkout, an editor's save?); the sweep writes to "
        f"the new file and added the {len(missing)} record(s) of its own that the new file lacked",
        stacklevel=3,
    )
    f.close()
    return new


@dataclass
class SweepSummary:
    total: int
    skipped: int  # already finished before this call
    ran: int
    failed: int


def _jsonable(value: Any) -> Any:
    """Plain JSON values: non-finite floats become null, numpy scalars Python numbers."""
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if hasattr(value, "item") and callable(value.item):  # numpy / torch scalars
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)


def _record(config: Mapping[str, Any], result: Mapping[str, Any] | None, error: str | None) -> dict[str, Any]:
    if result is not None and not isinstance(result, Mapping):
        result, error = None, error or f"the run function returned {type(result).__name__}, not a dict"
    rec = {**config, **(result or {})}
    loss = rec.get("eval_loss")
    if error is None and not (isinstance(loss, (int, float)) and math.isfinite(loss)):
        error = f"diverged or no result: eval_loss={loss!r}"
    if error is not None:
        rec["eval_loss"] = None
    rec["status"] = "ok" if error is None else "failed"
    rec["error"] = error
    return _jsonable(rec)


def run_sweep(
    grid: GridSpec | Sequence[GridSpec],
    *,
    results_path: Path,
    run_fn: RunFn,
    progress: bool = True,
    retry_failed: bool = False,
    executor: Any = None,
) -> SweepSummary:
    """Run every grid point without a finished record in ``results_path``; append one line per run.

    ``grid`` may be several grids, swept as one (:func:`expand_grids`: a shared point runs once).

    ``executor`` (:mod:`diloco.scaling.executors`; default: this process, one run after another)
    decides where runs execute; records are appended here, by this process alone, as runs finish,
    so each is written once. A run function that raises marks its run "failed" (with the error) and
    the sweep continues; failed runs are retried on the next call only with ``retry_failed``.
    KeyboardInterrupt stops the sweep, losing only the runs in progress. Readers take the last
    record per ``run_id``.
    """
    from diloco.scaling.executors import InlineExecutor

    executor = executor or InlineExecutor()
    configs = expand_grids([grid] if isinstance(grid, GridSpec) else grid)
    results_path = Path(results_path)
    results_path.parent.mkdir(parents=True, exist_ok=True)
    f = results_path.open("a+b")
    try:
        _lock(f, results_path)
        _drop_partial_tail(f)
        finished = {
            r.get("run_id")
            for r in read_results(results_path)
            if r.get("status") == "ok" or (r.get("status") == "failed" and not retry_failed)
        }
        todo = [c for c in configs if c["run_id"] not in finished]
        summary = SweepSummary(total=len(configs), skipped=len(configs) - len(todo), ran=0, failed=0)
        bar = tqdm(
            total=len(configs),
            initial=summary.skipped,
            disable=not progress,
            unit="run",
            desc=f"sweep ({executor.name})",
            dynamic_ncols=True,
        )
        written: set[str] = set()
        try:
            for cfg, result, error in executor.run(run_fn, [copy.deepcopy(c) for c in todo]):
                if cfg["run_id"] in written:  # an executor must not deliver a run twice; never write it twice
                    raise RuntimeError(f"executor {executor.name} delivered run {cfg['run_id']} twice")
                rec = _record(cfg, result, error)
                f = _follow(f, results_path)
                append_jsonl(f, rec)
                written.add(cfg["run_id"])
                summary.ran += 1
                summary.failed += rec["status"] == "failed"
                bar.set_postfix_str(
                    f"{cfg['size']} {cfg['method']} M={cfg['replicas']} "
                    f"lr={cfg['inner_lr']:.3g} B={cfg['global_batch']}"
                )
                bar.update(1)
        finally:
            bar.close()
    finally:
        f.close()
    return summary
