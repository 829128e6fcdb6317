"""A training run's configuration: one frozen, validated dataclass, read from JSON presets.

Presets are JSON files (never executed) in ``diloco/configs``; ``--set key=value``
overrides are parsed by the field's type. The resolved config is written beside
the run's results (``config.json``), so every number can be traced to its settings.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, fields
from importlib import resources
from pathlib import Path
from typing import Any

from diloco.layout import PATTERNS
from diloco.methods import METHODS, schedule_errors

#: ``checkpoint_every = -1`` (the default): at the first outer-sync boundary after every this many steps.
AUTO_CHECKPOINT_STEPS = 100

#: How a worker's R ranks hold its model: each a full copy (gradients averaged), or a shard (FSDP2).
WORKER_SHARDING = ("replicate", "fsdp")


@dataclass(frozen=True)
class TrainConfig:
    # what to train
    size: str = "cpu-1m"
    model: str = ""  # "" = the project's Transformer of `size`; "hf:PATH"; "module:function" (diloco.models.factory)
    vocab_size: int = 4096  # the BPE's size; for token files, the vocabulary their ids index
    seq_len: int = 128
    sources: tuple[str, ...] = ("shakespeare", "bible")  # bundled names, text paths/folders/globs, or token files
    tokenizer: str = ""  # "" = train the project's BPE on the text; or a tokenizer.json (HF tokenizers)
    eod_token: str = ""  # that tokenizer's end-of-document token (default: the first known one it has)
    token_dtype: str = "uint16"  # id type of .bin token files
    z_loss: float = 1e-4
    # how replicas cooperate
    method: str = "diloco"
    replicas: int = 2  # M
    ranks_per_worker: int = 1  # R: under torchrun, each replica (worker) is R data-parallel processes
    worker_sharding: str = "replicate"  # a worker's R ranks: "replicate" (each a full copy) or "fsdp" (fully_shard)
    fsdp_mixed_precision: bool = False  # fsdp: bf16 forward/backward, fp32 gradient reduction and master weights
    sync_every: int = 30  # H
    num_fragments: int = 1  # P
    fragment_pattern: str = "strided"
    fragments: tuple[str, ...] = ()  # explicit fragments: "prefix|prefix" per fragment (parameter-name prefixes)
    schedule: str = "even"  # "even", "torchft" or comma-separated first-send steps (diloco.algorithm.schedule)
    overlap_steps: int = 0  # tau
    merge_alpha: float = 0.0  # alpha
    codec: str = "fp32"  # outer gradients on the wire (DiLoCo / streaming)
    dp_codec: str = "fp32"  # gradients on the wire (data-parallel)
    # budget: exactly one of steps / tokens
    global_batch: int = 16  # sequences per step, split B/M per replica
    steps: int = 0
    tokens: int = 0
    # inner AdamW with linear warmup and cosine decay to min_lr_ratio
    inner_lr: float = 2e-3
    warmup_steps: int = 50
    min_lr_ratio: float = 0.05
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.99
    grad_clip: float = 1.0
    # outer Nesterov SGD
    outer_lr: float = 0.7
    outer_momentum: float = 0.9
    outer_nesterov: bool = True
    # evaluation, checkpoints, runtime
    eval_every: int = 100
    eval_batches: int = 16
    checkpoint_every: int = -1  # steps; -1 = auto (see checkpoint_interval), 0 = only at the end
    keep_checkpoints: int = 2  # K: the last K checkpoints are kept (an unreadable latest falls back)
    seed: int = 0
    bf16: bool = False  # bf16 autocast of forward and loss (weights, grads and optimizer state stay fp32)
    compile: bool = False  # torch.compile each replica's model in place (diloco.train.speed); names unchanged
    threads: int = 0  # torch intra-op threads per replica; 0 = auto (diloco.train.threads.default_threads)
    val_fraction: float = 0.02
    tensorboard: bool = False

    def __post_init__(self) -> None:
        errors: list[str] = []

        def need(ok: bool, msg: str) -> None:
            if not ok:
                errors.append(msg)

        from diloco.algorithm.codecs import CODEC_NAMES  # torch: imported only when a config is built
        from diloco.models.sizes import SIZES, get_size

        need(self.method in METHODS, f"method={self.method!r}: choose one of {', '.join(METHODS)}")
        try:
            blocks = get_size(self.size).n_layers
        except ValueError:
            blocks = None
            errors.append(f"size={self.size!r}: choose one of {', '.join(SIZES)}")
        need(self.codec in CODEC_NAMES, f"codec={self.codec!r}: choose one of {', '.join(CODEC_NAMES)}")
        need(self.dp_codec in CODEC_NAMES, f"dp_codec={self.dp_codec!r}: choose one of {', '.join(CODEC_NAMES)}")
        need(self.replicas >= 1, f"replicas={self.replicas}: need at least 1")
        need(self.ranks_per_worker >= 1, f"ranks_per_worker={self.ranks_per_worker}: need at least 1")
        need(self.worker_sharding in WORKER_SHARDING,
             f"worker_sharding={self.worker_sharding!r}: choose one of {', '.join(WORKER_SHARDING)}")
        if self.worker_sharding == "fsdp":
            need(self.method != "dp",
                 f"worker_sharding='fsdp' runs DiLoCo / streaming workers, not method={self.method!r}: "
                 f"use method='diloco' or 'streaming', or worker_sharding='replicate'")
            need(not self.compile, "compile=true with worker_sharding='fsdp' is not supported: set compile=false "
                                   "or worker_sharding='replicate'")
        need(not self.fsdp_mixed_precision or self.worker_sharding == "fsdp",
             f"fsdp_mixed_precision=true needs worker_sharding='fsdp' (got {self.worker_sharding!r}); "
             f"for replicated workers use bf16=true")
        ranks = self.replicas * max(1, self.ranks_per_worker)
        need(self.global_batch >= ranks and self.global_batch % ranks == 0,
             f"global_batch={self.global_batch} must be a positive multiple of replicas={self.replicas} x "
             f"ranks_per_worker={self.ranks_per_worker} (each replica gets global_batch / replicas sequences, "
             f"split evenly over its ranks)")
        need((self.steps > 0) != (self.tokens > 0),
             f"set exactly one of steps={self.steps} or tokens={self.tokens} to a positive value")
        errors += schedule_errors(self.sync_every, self.num_fragments, self.overlap_steps)
        if blocks is not None and self.num_fragments >= 2 and not self.model and not self.fragments:
            need(self.num_fragments - 1 <= blocks,
                 f"num_fragments={self.num_fragments} needs {self.num_fragments - 1} block fragments but "
                 f"size={self.size!r} has {blocks} blocks (fragment 0 holds the non-block parameters); "
                 f"use num_fragments <= {blocks + 1} or a deeper size")
        if self.method == "diloco":
            need(self.num_fragments == 1 and self.overlap_steps == 0,
                 f"method='diloco' is P=1, tau=0 (got num_fragments={self.num_fragments}, "
                 f"overlap_steps={self.overlap_steps}): use method='streaming' for fragments or overlap")
        need(0.0 <= self.merge_alpha <= 1.0, f"merge_alpha={self.merge_alpha}: need 0 <= alpha <= 1")
        need(self.fragment_pattern in PATTERNS,
             f"fragment_pattern={self.fragment_pattern!r}: choose one of {', '.join(PATTERNS)}")
        need(self.inner_lr > 0, f"inner_lr={self.inner_lr}: must be > 0")
        need(self.outer_lr > 0, f"outer_lr={self.outer_lr}: must be > 0")
        need(0.0 <= self.min_lr_ratio <= 1.0, f"min_lr_ratio={self.min_lr_ratio}: need 0..1")
        need(self.warmup_steps >= 0, f"warmup_steps={self.warmup_steps}: must be >= 0")
        need(self.eval_every >= 1 and self.eval_batches >= 1,
             f"eval_every={self.eval_every}, eval_batches={self.eval_batches}: both must be >= 1")
        need(self.checkpoint_every >= -1,
             f"checkpoint_every={self.checkpoint_every}: steps between checkpoints, 0 = only at the end, "
             f"-1 = auto (every {AUTO_CHECKPOINT_STEPS} steps, rounded up to an outer-sync boundary)")
        need(self.keep_checkpoints >= 1, f"keep_checkpoints={self.keep_checkpoints}: keep at least 1 (default 2)")
        need(self.threads >= 0, f"threads={self.threads}: must be >= 0 (0 = auto)")
        need(self.seq_len >= 8 and self.vocab_size >= 260,
             f"seq_len={self.seq_len}, vocab_size={self.vocab_size}: need seq_len >= 8 and vocab_size >= 260 "
             f"(a byte-level tokenizer needs 256 byte tokens + specials)")
        need(0.0 < self.val_fraction < 0.5, f"val_fraction={self.val_fraction}: need 0 < v < 0.5")
        need(self.token_dtype in ("uint16", "uint32"),
             f"token_dtype={self.token_dtype!r}: use uint16 or uint32 (the id type of your .bin files)")
        need(not self.fragments or len(self.fragments) == self.num_fragments,
             f"fragments={list(self.fragments)} names {len(self.fragments)} fragments but num_fragments="
             f"{self.num_fragments}: give one comma-separated group of parameter-name prefixes per fragment")
        if not errors and self.method != "dp":
            from diloco.algorithm.schedule import resolve_schedule

            try:
                resolve_schedule(self.schedule_spec, self.sync_every, self.num_fragments, self.overlap_steps)
            except ValueError as exc:
                errors.append(f"schedule={self.schedule!r}: {exc}")
        if errors:
            raise ValueError("invalid training config:\n  " + "\n  ".join(errors))

    # -- derived -------------------------------------------------------------
    @property
    def tokens_per_step(self) -> int:
        return self.global_batch * self.seq_len

    @property
    def total_steps(self) -> int:
        return self.steps if self.steps > 0 else max(1, self.tokens // self.tokens_per_step)

    @property
    def checkpoint_interval(self) -> int:
        """Steps between checkpoints (0: only at the end).

        ``checkpoint_every = -1`` (auto): every :data:`AUTO_CHECKPOINT_STEPS` steps for data-parallel;
        for DiLoCo and streaming the first multiple of ``sync_every`` at or above it, so checkpoints
        fall on outer-sync boundaries. A kill -9 then loses at most that many steps.
        """
        if self.checkpoint_every >= 0:
            return self.checkpoint_every
        if self.method == "dp":
            return AUTO_CHECKPOINT_STEPS
        return -(-AUTO_CHECKPOINT_STEPS // self.sync_every) * self.sync_every

    @property
    def batch_per_replica(self) -> int:
        return self.global_batch // self.replicas

    @property
    def batch_per_rank(self) -> int:
        """Sequences each process computes per step: its worker's batch split over ranks_per_worker."""
        return self.batch_per_replica // self.ranks_per_worker

    @property
    def schedule_spec(self) -> str | tuple[int, ...]:
        """``schedule`` as ``StreamingDiLoCo(schedule=...)`` takes it: a name, or a tuple of offsets."""
        if self.schedule in ("even", "torchft"):
            return self.schedule
        try:
            return tuple(int(v) for v in self.schedule.split(",") if v.strip())
        except ValueError:
            return self.schedule  # resolve_schedule names the forms that work

    # -- (de)serialisation ---------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["sources"] = list(self.sources)
        d["fragments"] = list(self.fragments)
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown config keys {unknown}; valid keys: {', '.join(sorted(known))}")
        data = dict(data)
        for key in ("sources", "fragments"):
            if key in data:
                data[key] = tuple(data[key])
        return cls(**data)

    def with_overrides(self, overrides: dict[str, Any]) -> TrainConfig:
        return TrainConfig.from_dict({**self.to_dict(), **overrides})


def parse_override(item: str) -> tuple[str, Any]:
    """Parse ``key=value`` against the field's type: ``--set sync_every=100``."""
    if "=" not in item:
        raise ValueError(f"override {item!r} must look like key=value, e.g. sync_every=100")
    key, raw = item.split("=", 1)
    key = key.strip()
    types = {f.name: f.type for f in fields(TrainConfig)}
    if key not in types:
        raise ValueError(f"unknown config key {key!r}; valid keys: {', '.join(sorted(types))}")
    typ = str(types[key])
    try:
        if typ == "bool":
            low = raw.strip().lower()
            if low not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError
            return key, low in ("true", "1", "yes")
        if typ == "int":
            return key, int(float(raw)) if "e" in raw.lower() else int(raw)
        if typ == "float":
            return key, float(raw)
        if typ.startswith("tuple"):
            return key, tuple(s.strip() for s in raw.split(",") if s.strip())
    except ValueError:
        raise ValueError(f"{key}={raw!r}: expected a value of type {typ}") from None
    return key, raw


# -- presets -----------------------------------------------------------------
def preset_names() -> list[str]:
    root = resources.files("diloco") / "configs"
    return sorted(p.name[:-5] for p in root.iterdir() if p.name.endswith(".json"))


def load_preset(name_or_path: str) -> dict[str, Any]:
    """A preset by name (``diloco/configs/NAME.json``) or a path to a JSON file.

    A preset holds ``base`` (TrainConfig fields) and optionally ``methods`` (name -> overrides) for
    ``diloco compare``; a bare mapping of fields is accepted as ``base``.
    """
    path = Path(name_or_path)
    if path.suffix == ".json" and path.exists():
        text = path.read_text()
    else:
        res = resources.files("diloco") / "configs" / f"{name_or_path}.json"
        if not res.is_file():
            raise ValueError(f"unknown preset {name_or_path!r}; presets: {', '.join(preset_names())} "
                             f"(or give a path to a .json file)")
        text = res.read_text()
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"preset {name_or_path!r} is not valid JSON: {exc}") from None
    if "base" not in data:
        data = {"base": data}
    data.setdefault("methods", {})
    data["base"].pop("_comment", None)
    return data
