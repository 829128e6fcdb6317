"""What a run directory holds, and what a training command may do to it: decided before anything is written.

A run directory (``--out``) holds one run: ``config.json``, ``tokenizer.json``, ``metrics.jsonl``,
``summary.json``, ``checkpoints/`` and optionally ``tb/``. :func:`plan_run_dir`
only reads it and says what to do:

* empty or absent: start a new run;
* ``--resume``: continue from the newest readable checkpoint, if the saved
  config matches (``steps`` / ``tokens`` may grow; :data:`RUNTIME_KEYS`, which do
  not change what is trained, may differ and take the new value); a run that already reached
  its last step is *finished* and nothing is written;
* another run (any config) without ``--resume``: an error naming the keys that
  differ, unless ``--overwrite`` says to replace it.

Once the data is built, :func:`check_same_data` refuses a resume on token ids whose SHA-256 differs
from the checkpoint's. So a typo on the command line can never truncate, overwrite or delete results.


While a run trains, its process holds :class:`RunDirLock` on the folder: a second training command on the
same ``--out`` (a second terminal, a sweep started again while a run of the first is still alive) is refused
before it reads or writes anything, instead of two processes writing one run's files.
"""

from __future__ import annotations

import fcntl
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from diloco.errors import ConfigError
from diloco.files import read_json
from diloco.train import checkpoint as ckpt
from diloco.train.budget_checkpoints import final_plan_error
from diloco.train.config import TrainConfig

#: What a run writes into its directory; ``--overwrite`` deletes exactly these.
RUN_FILES: tuple[str, ...] = (
    "config.json",
    "tokenizer.json",
    "metrics.jsonl",
    "summary.json",
    "checkpoints",
    "tb",
    "merges.jsonl",
)  # the last: method=decoupled

#: Settings a resume may change: the budget (to train further).
RESUMABLE_CHANGES: tuple[str, ...] = ("steps", "tokens")

#: Settings that do not change what is trained: two runs differing only in these are the same run.
RUNTIME_KEYS: tuple[str, ...] = (
    "checkpoint_every",
    "keep_checkpoints",
    "checkpoint_async",
    "tensorboard",
    "metrics_port",
    "diverge_factor",
)

#: Settings a resume of FSDP workers may change: their sharded checkpoints load onto any R (resharding).
RESHARD_KEYS: tuple[str, ...] = ("ranks_per_worker",)

#: Settings an elastic restart changes: the number of workers is the launch's (see docs/guides/elastic.md).
ELASTIC_KEYS: tuple[str, ...] = ("replicas",)

Action = Literal["new", "overwrite", "resume", "finished"]


@dataclass(frozen=True)
class RunDirPlan:
    """What a training command will do to ``out_dir``; see the module docstring."""

    out_dir: Path
    action: Action
    start_step: int = 0
    meta: dict[str, Any] | None = None  # the checkpoint's record (resume, finished)
    notices: tuple[str, ...] = ()  # what the user should be told (e.g. a damaged checkpoint skipped)

    @property
    def summary(self) -> dict[str, Any] | None:
        """The finished run's summary.json (action "finished")."""
        return read_json(self.out_dir / "summary.json") if self.action == "finished" else None


class RunDirLock:
    """An exclusive lock on a run directory, held by the process that trains in it.

    The lock is ``flock`` on the folder itself, so nothing is written into the user's folder for it, and the
    system drops it when the process ends however it ends (kill -9 included): a stale lock cannot exist.
    :meth:`acquire` does nothing while the folder does not exist yet (a new run takes it right after creating
    the folder, before writing into it).
    """

    def __init__(self, out_dir: Path) -> None:
        self.out_dir = Path(out_dir)
        self._fd: int | None = None

    def acquire(self) -> None:
        if self._fd is not None or not self.out_dir.is_dir():
            return
        fd = os.open(self.out_dir, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise ConfigError(
                f"--out {self.out_dir}: another process is training in this folder right now (it holds "
                f"the folder's lock); wait for it to finish, or stop it and continue the run with "
                f"--resume, or choose another --out"
            ) from None
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the folder's descriptor drops its lock
            self._fd = None


def existing_run_files(out_dir: Path) -> list[str]:
    out_dir = Path(out_dir)
    return [name for name in RUN_FILES if (out_dir / name).exists()]


def config_differences(old: dict[str, Any], new: dict[str, Any], *, ignore: tuple[str, ...] = ()) -> list[str]:
    """``key: old -> new`` for every setting that differs (keys missing on one side shown as such)."""
    out = []
    for key in sorted(set(old) | set(new)):
        if key in ignore:
            continue
        a, b = old.get(key, "<unset>"), new.get(key, "<unset>")
        if a != b:
            out.append(f"{key}: {a!r} -> {b!r}")
    return out


def _with_defaults(saved: dict[str, Any]) -> dict[str, Any]:
    """A saved config with the fields added since it was written at their defaults (as it trained)."""
    try:
        return TrainConfig.from_dict(saved).to_dict()
    except (ValueError, TypeError):  # written by another version: compare it as it is
        return saved


def _saved_config(out_dir: Path) -> dict[str, Any] | None:
    path = out_dir / "config.json"
    if not path.exists():
        return None
    data = read_json(path)
    if not isinstance(data, dict):
        raise ConfigError(f"{path} is not a JSON object; is --out the right folder?")
    return _with_defaults(data)


def plan_run_dir(
    out_dir: Path,
    cfg: TrainConfig,
    *,
    resume: bool = False,
    overwrite: bool = False,
    reuse: bool = False,
    elastic: bool = False,
    replace_flag: str = "--overwrite",
    upto: int | None = None,
) -> RunDirPlan:
    """Decide what to do with ``out_dir`` without writing anything; a ValueError says why not and how to fix it.

    ``reuse`` (for compare and sweeps, which rerun a list of configs): a run of this same config
    is taken as it is when finished and resumed when interrupted (started again if it stopped
    before its first checkpoint); a run of another config is still an error.

    ``elastic`` (a restart under TorchElastic): ``reuse`` where the number of workers (``replicas``)
    may differ from the saved run's; the checkpoint's own number is in the plan's ``meta``.
    ``replace_flag``: the caller's option that replaces a run, named in the error (``diloco compare``: --fresh).
    ``upto``: resume no later than this step (the step the workers' folders agree on, :mod:`diloco.train.run_folders`).
    """
    out_dir = Path(out_dir)
    extra = ELASTIC_KEYS if elastic else ()
    if elastic and (resume or overwrite):
        raise ConfigError("an elastic launch resumes by itself: drop --resume / --overwrite (or --elastic)")
    reuse = reuse or elastic
    if sum((resume, overwrite, reuse)) > 1:
        raise ConfigError(
            "--resume continues the run in --out, --overwrite replaces it (and reuse takes a "
            "finished one as it is): choose one"
        )
    if out_dir.exists() and not out_dir.is_dir():
        raise ConfigError(f"--out {out_dir} is a file, not a folder; choose another --out")
    present = existing_run_files(out_dir)
    new = cfg.to_dict()
    if resume:
        return _plan_resume(out_dir, cfg, present, extra, upto)
    if not present:
        return RunDirPlan(out_dir, "new")
    if overwrite:
        return RunDirPlan(
            out_dir, "overwrite", notices=(f"{replace_flag}: replacing the run in {out_dir} ({', '.join(present)})",)
        )
    saved = _saved_config(out_dir)
    replace = f"choose another --out, or pass {replace_flag} to replace it (deletes {', '.join(present)})"
    if saved is None:
        raise ConfigError(
            f"--out {out_dir} already holds run files ({', '.join(present)}) without a config.json; {replace}"
        )
    diff = config_differences(saved, new, ignore=RUNTIME_KEYS + extra)
    if diff:
        raise ConfigError(
            f"--out {out_dir} holds another run; its config differs in:\n  " + "\n  ".join(diff) + f"\n{replace}"
        )
    if reuse:
        if (out_dir / "summary.json").exists():
            return RunDirPlan(out_dir, "finished", notices=(f"reusing the finished run in {out_dir}",))
        if _any_committed(out_dir):
            return _plan_resume(out_dir, cfg, present, extra, upto)
        return RunDirPlan(
            out_dir,
            "overwrite",
            notices=(
                f"{out_dir} holds this config, stopped before its first checkpoint was committed: starting it again",
            ),
        )
    if (out_dir / "summary.json").exists():
        raise ConfigError(
            f"--out {out_dir} already holds this run, finished (summary.json); nothing to do. "
            f"To train it again, {replace}"
        )
    raise ConfigError(
        f"--out {out_dir} holds an unfinished run of this config; continue it with --resume, or {replace}"
    )


def _any_committed(out_dir: Path) -> bool:
    """A checkpoint was committed (``latest.json`` or a step's record): a kill while the first checkpoint was
    being written leaves only step folders, which is a run to start again, not one to resume."""
    root = ckpt.checkpoint_dir(out_dir)
    return root.is_dir() and ((root / "latest.json").exists() or any(root.glob("step-*.json")))


def _plan_resume(
    out_dir: Path, cfg: TrainConfig, present: list[str], extra: tuple[str, ...] = (), upto: int | None = None
) -> RunDirPlan:
    found = ckpt.find_resumable(out_dir, upto=upto)  # raises "nothing to resume" when there is no checkpoint
    saved = _with_defaults(found.meta.get("config", {}))
    check_format(found.meta, cfg, out_dir)
    if cfg.worker_sharding == "fsdp":  # sharded checkpoints reshard onto any number of ranks per worker
        extra = (*extra, *RESHARD_KEYS)
    diff = config_differences(saved, cfg.to_dict(), ignore=RESUMABLE_CHANGES + RUNTIME_KEYS + extra)
    if diff:
        raise ConfigError(
            f"--resume: the checkpoint in {out_dir} was written by a different config; it differs in:"
            f"\n  " + "\n  ".join(diff) + f"\nresume with the same settings (see {out_dir}/config.json)"
        )
    notices = tuple(f"skipped a damaged checkpoint, {line}" for line in found.skipped)
    if found.skipped:
        notices += (f"resuming from step {found.step}, the newest readable checkpoint",)
    step, total = found.step, cfg.total_steps
    if found.meta.get("final"):  # learner_budget=tokens: every learner has ended (diloco.train.budget_checkpoints)
        new = cfg.to_dict()
        changed = [f"{k}: {saved.get(k)!r} -> {new[k]!r}" for k in RESUMABLE_CHANGES if saved.get(k) != new[k]]
        finished = (out_dir / "summary.json").exists() and not found.skipped
        error = final_plan_error(found.meta, out_dir, changed=changed, finished=finished)
        if error is not None:
            raise ConfigError(error)
        ended = f"its learners ended at steps {found.meta.get('learner_steps')}"
        notice = (
            f"the run in {out_dir} is already finished ({ended}); nothing to do. Its results: {out_dir}/summary.json"
        )
        return RunDirPlan(out_dir, "finished", start_step=step, meta=found.meta, notices=(notice,))
    if step > total and cfg.learner_budget != "tokens":  # a token budget's learners may checkpoint past `steps`
        raise ConfigError(
            f"--resume: the checkpoint in {out_dir} is at step {step}, past this config's "
            f"{total} steps; set steps >= {step} (or the matching tokens) to continue it"
        )
    if step == total and (out_dir / "summary.json").exists() and not found.skipped:
        return RunDirPlan(
            out_dir,
            "finished",
            start_step=step,
            meta=found.meta,
            notices=(
                f"the run in {out_dir} is already finished (step {step} of {total}); "
                f"nothing to do. Its results: {out_dir}/summary.json",
            ),
        )
    return RunDirPlan(out_dir, "resume", start_step=step, meta=found.meta, notices=notices)


def check_format(meta: dict[str, Any], cfg: TrainConfig, out_dir: Path) -> None:
    """A checkpoint resumes only into workers of its own kind: sharded (DCP) for FSDP, one file per worker else."""
    sharded = meta.get("format") == "dcp"
    step = meta.get("step")
    if cfg.worker_sharding == "fsdp" and not sharded:
        raise ConfigError(
            f"--resume: the checkpoint of step {step} in {out_dir} holds one file per worker (replicated workers, "
            f"worker_sharding='replicate'); FSDP workers resume only from sharded checkpoints. Resume it with "
            f"--set worker_sharding=replicate (and its ranks_per_worker), or start the FSDP run in another --out"
        )
    if cfg.worker_sharding != "fsdp" and sharded:
        raise ConfigError(
            f"--resume: the checkpoint of step {step} in {out_dir} is sharded (written by FSDP workers); resume it "
            f"with --set worker_sharding=fsdp under torchrun, or start afresh in another --out"
        )


def clear_run(out_dir: Path) -> None:
    """Delete what a run wrote into ``out_dir`` (:data:`RUN_FILES`); other files are left alone."""
    for name in RUN_FILES:
        path = Path(out_dir) / name
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()


def check_same_data(plan: RunDirPlan, digest: str, out_dir: Path) -> None:
    """A resume continues on the data its checkpoint was trained on, or not at all: the sampler's state
    indexes token positions, so other data (a corpus package upgraded between sittings, an edited text
    file) would silently train on different batches than the run began with."""
    saved = (plan.meta or {}).get("data_sha256")
    if plan.action == "resume" and saved is not None and saved != digest:
        raise ConfigError(
            f"--resume: the data differs from what the run in {out_dir} was trained on (token SHA-256 "
            f"{digest[:16]}... now, {saved[:16]}... in its checkpoint), so the resumed run would not continue "
            f"the same run. Restore the data it used (for the bundled corpora: the same versions of the "
            f"packages listed in docs/guides/data.md), or train afresh in another --out (this run is left as it is)"
        )


__all__ = [
    "ELASTIC_KEYS",
    "RESHARD_KEYS",
    "RUNTIME_KEYS",
    "RUN_FILES",
    "RunDirPlan",
    "check_format",
    "check_same_data",
    "clear_run",
    "config_differences",
    "existing_run_files",
    "plan_run_dir",
]
