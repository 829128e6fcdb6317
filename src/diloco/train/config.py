"""A training run's configuration: one frozen, validated dataclass, read from JSON presets.

Presets are JSON files (never executed) in ``diloco/configs``; ``--set key=value``
overrides are parsed by the field's type. The resolved config is written beside
the run's results (``config.json``), so every number can be traced to its settings.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from dataclasses import dataclass, field, fields
from importlib import resources
from pathlib import Path
from typing import Any

import diloco.decoupled_choices as dc
from diloco.algorithm.choices import INNER_OPTIMIZERS, InnerOptimizer
from diloco.algorithm.guard import GUARD_ACTIONS, GuardAction, guard_errors
from diloco.algorithm.schedule import SCHEDULE_NAMES, config_schedule_errors
from diloco.decoupled_choices import OUTER_SCALES, OuterScale
from diloco.errors import ConfigError
from diloco.layout import PATTERNS, FragmentPattern, fragment_errors
from diloco.methods import METHODS, WORKER_SHARDING, Method, WorkerSharding, cooperation_errors
from diloco.train.budget import budget_errors
from diloco.train.divergence import evaluation_errors
from diloco.train.lr import optimizer_errors
from diloco.train.threads import threads_errors
from diloco.wire.sizes import NAMES as CODEC_NAMES_ALL
from diloco.wire.sizes import TOPK_TABLES, WIRE_FORMAT_NAMES, CodecName, TopkTables, WireFormatName


def setting(default: Any, doc: str, *, section: str, choices: tuple[str, ...] = ()) -> Any:
    """A :class:`TrainConfig` field with its one line of meaning (and, for a choice, its values).

    The meaning lives here and nowhere else: ``diloco train --help``, ``diloco config`` and the
    documentation's reference page all read it (:func:`reference`). ``choices``: the tuple defined beside
    the component that takes the value (its ``Literal`` type is the field's annotation).
    """
    return field(default=default, metadata={"doc": doc, "section": section, "choices": tuple(choices)})


def _section(title: str) -> Any:
    """:func:`setting` for the fields of one section of the help and the reference (declared, in this order)."""
    return functools.partial(setting, section=title)


_train = _section("what to train")
_cooperate = _section("how workers cooperate")
_budget = _section("budget (exactly one of steps and tokens)")
_inner = _section("inner optimizer (AdamW, linear warmup, cosine decay to min_lr_ratio)")
_outer = _section("outer optimizer (Nesterov SGD)")
_runtime = _section("evaluation, checkpoints, runtime")


#: The choice fields whose values the config checks itself; the guard and the decoupled ones are checked by
#: their components' check functions (:func:`~diloco.algorithm.guard.check_guard`, the decoupled runtime's,
#: :func:`~diloco.wire.config_checks.codec_errors`).
_CHECKED_CHOICES = ("method", "worker_sharding", "fragment_pattern", "inner_optimizer")

#: ``checkpoint_every = -1`` (the default): at the first outer-sync boundary after every this many steps.
AUTO_CHECKPOINT_STEPS = 100


@dataclass(frozen=True)
class TrainConfig:
    size: str = _train("cpu-1m", "named model size of the project's transformer (diloco.models.sizes; e.g. cpu-1m)")
    model: str = _train(
        "",
        "empty: the project's transformer of `size`; hf:PATH (a Hugging Face folder); module:function or file.py:function",
    )
    vocab_size: int = _train(4096, "the BPE's vocabulary size; for token files, the vocabulary their ids index")
    seq_len: int = _train(128, "tokens per training sequence (the context length)")
    sources: tuple[str, ...] = _train(
        ("shakespeare", "bible"),
        "training data: bundled names (shakespeare, bible, large), text files, folders, globs, or .bin/.npy token files",
    )
    tokenizer: str = _train(
        "", "empty: train the project's BPE on the text (cached); or a tokenizer.json (Hugging Face tokenizers)"
    )
    eod_token: str = _train("", "that tokenizer's end-of-document token (default: the first known one it has)")
    token_dtype: str = _train("uint16", "id type of .bin token files")
    z_loss: float = _train(1e-4, "weight of the z-loss on the softmax normaliser (stabilises the logits; 0 = off)")
    method: Method = _cooperate(
        "diloco",
        "how replicas cooperate: dp (data-parallel), diloco, streaming (Streaming DiLoCo), decoupled (learners on their own clocks)",
        choices=METHODS,
    )
    replicas: int = _cooperate(2, "M: the number of workers (replicas); each trains on its own shard")
    ranks_per_worker: int = _cooperate(1, "R: under torchrun, the data-parallel processes of one worker (launch M x R)")
    worker_sharding: WorkerSharding = _cooperate(
        "replicate",
        "how a worker's R ranks hold its model: replicate (each a full copy) or fsdp (sharded with fully_shard)",
        choices=WORKER_SHARDING,
    )
    fsdp_mixed_precision: bool = _cooperate(
        False, "with worker_sharding=fsdp: bf16 forward/backward, fp32 gradient reduction and master weights"
    )
    sync_every: int = _cooperate(
        30, "H: inner steps between two outer syncs (of each fragment); measured best: >= 80 outer steps a run"
    )
    num_fragments: int = _cooperate(1, "P: fragments of the model that sync on a staggered schedule (streaming)")
    fragment_pattern: FragmentPattern = _cooperate(
        "strided", "how blocks map to fragments: strided (block i -> 1 + i mod (P-1)) or sequential", choices=PATTERNS
    )
    fragments: tuple[str, ...] = _cooperate(
        (), "explicit fragments: one group of parameter-name prefixes (a|b) per fragment; empty: the fragmenter's"
    )
    schedule: str = _cooperate(
        "even",
        "when each fragment syncs: even, torchft (torchft 0.2.0's offsets), or P comma-separated first-send steps",
    )
    overlap_steps: int = _cooperate(0, "tau: inner steps an exchange overlaps before it is merged (streaming)")
    merge_alpha: float = _cooperate(0.0, "alpha: merge as alpha * local + (1 - alpha) * global (streaming)")
    codec: CodecName = _cooperate(
        "fp32",
        "what outer gradients travel as (a wire format; stat2, stat4 and topk compress, for use with ef_decay)",
        choices=CODEC_NAMES_ALL,
    )
    eager: bool = _cooperate(
        False,
        "eager updates (needs overlap_steps = sync_every): apply this worker's share of the outer gradient at once, the others' one outer step later",
    )
    ef_decay: float = _cooperate(
        0.0,
        "beta of the error-feedback accumulator e <- beta e + Delta that keeps what the codec dropped (0 = off; SparseLoCo 0.95, MuLoCo 0.9)",
    )
    topk_density: float = _cooperate(
        0.015625, "share of each 4096-value chunk the topk codec sends (1/64: 64 values, 12-bit indices, 2-bit values)"
    )
    topk_tables: TopkTables = _cooperate(
        "payload",
        "where the topk codec's 2-bit values take their bin means: payload (one table) or chunk (one per chunk, +0.03 bits)",
        choices=TOPK_TABLES,
    )
    guard: GuardAction = _cooperate(
        "drop",
        "outer-gradient norm guard (each worker its own; decoupled: the syncer): drop, clip one above guard_ratio x reference, or off",
        choices=GUARD_ACTIONS,
    )
    guard_ratio: float = _cooperate(
        10.0,
        "guard's bar on norm / reference (round's median, else running median of accepted norms); healthy runs measured < 3",
    )
    quorum: int = _cooperate(
        0, "K (decoupled): learners a merge needs at least; 0 = all (synchronous), 1 = whoever reports first"
    )
    merge: dc.MergeName = _cooperate(
        "rda",
        "decoupled: how the syncer merges: rda (radial-directional; measured best at outer_lr 0.7/sqrt(M)) or mean (token-weighted)",
        choices=dc.MERGE_NAMES,
    )
    outer_scale: OuterScale = _cooperate(
        "auto",
        "decoupled: outer step share of a merge of k of M learners: auto (mean: share, rda: sqrt-share), share (k/M), sqrt-share, none (1)",
        choices=OUTER_SCALES,
    )
    outer_gradient: dc.OuterGradient = _cooperate(
        "global",
        "decoupled: a learner's outer gradient: global (Theta - theta_m) or own (base_m - theta_m, its own progress; kinder to stragglers)",
        choices=dc.OUTER_GRADIENTS,
    )
    grace_gamma: float = _cooperate(
        0.2,
        "decoupled: gamma of the wait for more learners after the quorum, gamma x (tau x step time - quorum time - sync time)",
    )
    grace_ema_decay: float = _cooperate(
        0.9, "decoupled: decay of the grace window's moving averages of step, quorum and sync times"
    )
    ride_out_steps: int = _cooperate(
        0, "decoupled: steps a learner trains on while a reply is late (a syncer restarting) before it waits; 0 = wait"
    )
    late_reports: dc.LateReports = _cooperate(
        "next",
        "decoupled, K < M: a report after its slot's merge waits for the next quorum (next) or merges alone at once (alone)",
        choices=dc.LATE_REPORTS,
    )
    learner_lease: float = _cooperate(
        0.0,
        "decoupled: seconds a learner's heartbeats may stop before it leaves the quorum; 0 = auto (5 s above the slowest step)",
    )
    overwrite_after: dc.OverwriteAfter = _cooperate(
        "send",
        "decoupled: a learner overwrites a fragment tau steps after sending it (send) or after its reply arrives (arrival)",
        choices=dc.OVERWRITE_AFTER,
    )
    decoupled_transport: dc.Transport = _cooperate(
        "threads",
        "decoupled: where the syncer runs: threads (a thread of this process) or ray (a named Ray actor)",
        choices=dc.TRANSPORTS,
    )
    syncer_device: str = _cooperate(
        "cpu",
        "decoupled: where the syncer's state and merge math live: cpu, auto (cuda if its host has a GPU) or cuda[:N]",
    )
    syncer_shards: int = _cooperate(
        1, "decoupled: S syncers, each owning fragments p with p % S == s (its own thread or Ray actor); S divides P"
    )
    learner_budget: dc.LearnerBudget = _cooperate(
        "steps",
        "decoupled: each learner trains `steps` (steps), or all together steps x global_batch sequences, a fast one more (tokens)",
        choices=dc.LEARNER_BUDGETS,
    )
    ray_address: str = _cooperate(
        "", "decoupled_transport=ray: the Ray cluster to join; empty: start a local Ray instance"
    )
    learner: int = _cooperate(
        -1, "decoupled site job: the one learner (0..replicas-1) this job runs, joining syncer; -1 = every learner here"
    )
    syncer: str = _cooperate(
        "", "decoupled site job: NAME@ADDRESS of the running diloco syncer to join (it prints it); empty: start one"
    )
    dp_codec: WireFormatName = _cooperate(
        "fp32", "what gradients travel as in data-parallel (a wire format)", choices=WIRE_FORMAT_NAMES
    )
    global_batch: int = _budget(16, "sequences per step over all workers (global_batch / replicas per worker)")
    steps: int = _budget(0, "training steps (set exactly one of steps and tokens)")
    tokens: int = _budget(
        0, "training tokens, converted to steps of global_batch x seq_len (exactly one of steps and tokens)"
    )
    inner_optimizer: InnerOptimizer = _inner(
        "adamw",
        "adamw, or muon: torch.optim.Muon on the 2-D hidden matrices (AdamW-matched lr), AdamW on embeddings, head, norms and biases",
        choices=INNER_OPTIMIZERS,
    )
    inner_lr: float = _inner(2e-3, "peak learning rate of the inner AdamW (linear warmup, cosine decay)")
    warmup_steps: int = _inner(50, "steps of linear learning-rate warmup")
    min_lr_ratio: float = _inner(0.05, "the cosine decays to inner_lr x this at the last step")
    weight_decay: float = _inner(0.1, "AdamW weight decay (inner optimizer)")
    beta1: float = _inner(0.9, "AdamW beta1 (inner optimizer)")
    beta2: float = _inner(0.99, "AdamW beta2 (inner optimizer)")
    grad_clip: float = _inner(1.0, "clip each worker's gradient norm to this (0 = no clipping)")
    outer_lr: float = _outer(0.7, "learning rate of the outer Nesterov SGD on the averaged outer gradient")
    outer_momentum: float = _outer(
        0.9, "momentum of the outer SGD (the papers: 0.9; studies/outer-steps: 0.5 for diloco, 0.9 for streaming)"
    )
    outer_nesterov: bool = _outer(True, "Nesterov momentum for the outer SGD (false: heavy-ball)")
    eval_every: int = _runtime(100, "steps between evaluations of the global parameters on held-out tokens")
    eval_batches: int = _runtime(16, "batches of global_batch sequences per evaluation")
    eval_sequences: int = _runtime(
        0,
        "validation windows per evaluation, the same at every global_batch (0: eval_batches x global_batch ones)",
    )
    diverge_factor: float = _runtime(
        3.0,
        "stop (exit 3, no checkpoint) on a non-finite loss or an eval above this x min(first eval, ln vocab); 0 = off",
    )
    checkpoint_every: int = _runtime(
        -1,
        "steps between checkpoints; -1 = auto (every 100, rounded up to a multiple of sync_every), 0 = only at the end",
    )
    keep_checkpoints: int = _runtime(2, "K: the last K checkpoints are kept (an unreadable newest one falls back)")
    checkpoint_async: bool = _runtime(
        False,
        "with worker_sharding=fsdp: write each checkpoint in the background (dcp.async_save), committed at the next step",
    )
    seed: int = _runtime(0, "seed of the model's initialisation and the data order")
    bf16: bool = _runtime(False, "bf16 autocast of forward and loss (weights, grads and optimizer state stay fp32)")
    compile: bool = _runtime(False, "torch.compile each replica's model (parameter names unchanged)")
    threads: int = _runtime(0, "torch intra-op threads per replica; 0 = auto (the cores other work leaves free)")
    step_time: float = _runtime(
        0.0,
        "pad each inner step to at least this many seconds with a sleep (an accelerator's step on a CPU); 0 = off",
    )
    slowdown: str = _runtime(
        "",
        "stragglers: per replica, its (padded) step time multiplied by F >= 1, e.g. 1,1,3; empty = all 1",
    )
    val_fraction: float = _runtime(0.02, "share of the tokens held out for evaluation")
    tensorboard: bool = _runtime(False, "also write TensorBoard event files to OUT/tb")
    metrics_port: int = _runtime(
        -1, "serve each step's figures in Prometheus' format on this port, token-protected (0: a free one; -1: none)"
    )

    def __post_init__(self) -> None:
        from diloco.data.sources import data_errors
        from diloco.models.sizes import size_blocks
        from diloco.train.checkpoint import checkpoint_errors
        from diloco.train.pace import pace_errors  # the trainer's callback: after torch, nearly free
        from diloco.train.prometheus import metrics_port_errors
        from diloco.train.sharding import sharding_errors
        from diloco.wire.config_checks import codec_errors  # torch: only when a config is built

        errors = [  # the choices the config checks itself (the others: their components' checks)
            f"{f.name}={getattr(self, f.name)!r}: choose one of {', '.join(f.metadata['choices'])}"
            for f in fields(self)
            if f.name in _CHECKED_CHOICES and getattr(self, f.name) not in f.metadata["choices"]
        ]
        blocks, size_errors = size_blocks(self.size)
        errors += size_errors + codec_errors(self) + guard_errors(self) + budget_errors(self) + sharding_errors(self)
        for f in fields(self):  # every number is finite; counts and rates are never negative
            value = getattr(self, f.name)
            if isinstance(value, float) and not math.isfinite(value):
                errors.append(f"{f.name}={value}: must be a finite number")
        errors += optimizer_errors(self)
        errors += cooperation_errors(self) + fragment_errors(self, blocks) + _method_errors(self)
        errors += pace_errors(self) + dc.learner_budget_errors(self) + metrics_port_errors(self)
        errors += evaluation_errors(self) + checkpoint_errors(self) + threads_errors(self) + data_errors(self)
        if not errors:  # the schedule resolves only against valid H, P and tau
            errors += config_schedule_errors(self)
        if errors:
            raise ConfigError("invalid training config:\n  " + "\n  ".join(errors))

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
        for DiLoCo, streaming and decoupled the first multiple of ``sync_every`` at or above it, so checkpoints
        fall on outer-sync boundaries. A kill -9 then loses at most that many steps.
        """
        if self.checkpoint_every >= 0:
            return self.checkpoint_every
        if self.method == "dp":
            return AUTO_CHECKPOINT_STEPS
        return -(-AUTO_CHECKPOINT_STEPS // self.sync_every) * self.sync_every

    @property
    def warnings(self) -> list[str]:
        """Settings that run but that a study found costly (:mod:`diloco.outer_steps`); empty if none."""
        from diloco.outer_steps import outer_steps_warning

        w = outer_steps_warning(
            method=self.method,
            total_steps=self.total_steps,
            sync_every=self.sync_every,
            num_fragments=self.num_fragments,
            eager=self.eager,
        )
        return [w] if w else []

    @property
    def job_replicas(self) -> int:
        """The replicas one job of this run holds (its checkpoints' files): every one, or one for a decoupled site
        job (``learner`` >= 0)."""
        return 1 if self.learner >= 0 else self.replicas

    @property
    def batch_per_replica(self) -> int:
        return self.global_batch // self.replicas

    @property
    def batch_per_rank(self) -> int:
        """Sequences each process computes per step: its worker's batch split over ranks_per_worker."""
        return self.batch_per_replica // self.ranks_per_worker

    @property
    def slowdown_factors(self) -> tuple[float, ...]:
        """``slowdown`` as numbers, one per replica (empty: none slowed); a ValueError if it does not parse."""
        return tuple(float(v) for v in self.slowdown.split(",") if v.strip())

    @property
    def schedule_spec(self) -> str | tuple[int, ...]:
        """``schedule`` as ``StreamingDiLoCo(schedule=...)`` takes it: a name, or a tuple of offsets."""
        if self.schedule in SCHEDULE_NAMES:
            return self.schedule
        try:
            return tuple(int(v) for v in self.schedule.split(",") if v.strip())
        except ValueError:
            return self.schedule  # resolve_schedule names the forms that work

    def make_codec(self) -> Any:
        """The codec outer gradients travel as: ``codec`` with its top-k settings (imports torch)."""
        from diloco.wire.registry import get_codec

        return get_codec(self.codec, topk_density=self.topk_density, topk_tables=self.topk_tables)

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
            raise ConfigError(f"unknown config keys {unknown}; valid keys: {', '.join(sorted(known))}")
        data = dict(data)
        for key in ("sources", "fragments"):
            if key in data:
                data[key] = tuple(data[key])
        return cls(**data)

    def with_overrides(self, overrides: dict[str, Any]) -> TrainConfig:
        return TrainConfig.from_dict({**self.to_dict(), **overrides})


def _method_errors(cfg: TrainConfig) -> list[str]:
    """What the method's runtime cannot run with (:meth:`diloco.train.runtime.MethodRuntime.config_errors`)."""
    from diloco.train.runtime import PLUGINS, runtime_for

    return runtime_for(cfg.method).config_errors(cfg) if cfg.method in PLUGINS else []


@dataclass(frozen=True)
class FieldDoc:
    """One configuration key as the help and the documentation show it."""

    name: str
    type: str
    default: Any
    doc: str
    section: str
    choices: tuple[str, ...] = ()


def reference() -> list[FieldDoc]:
    """Every :class:`TrainConfig` key in declaration order, with its type, default, meaning and section.

    The single source of ``diloco train --help``'s key list and the documentation's reference page.
    """
    out = []
    for f in fields(TrainConfig):
        assert "doc" in f.metadata, f"TrainConfig.{f.name} has no documentation: declare it with setting()"
        default = list(f.default) if isinstance(f.default, tuple) else f.default
        choices = f.metadata["choices"]
        typ = "str" if choices else str(f.type)  # a choice's annotation is its Literal type
        out.append(FieldDoc(f.name, typ, default, f.metadata["doc"], f.metadata["section"], choices))
    return out


def parse_override(item: str) -> tuple[str, Any]:
    """Parse ``key=value`` against the field's type: ``--set sync_every=100``."""
    if "=" not in item:
        raise ConfigError(f"override {item!r} must look like key=value, e.g. sync_every=100")
    key, raw = item.split("=", 1)
    key = key.strip()
    types = {f.name: f.type for f in fields(TrainConfig)}
    if key not in types:
        raise ConfigError(f"unknown config key {key!r}; valid keys: {', '.join(sorted(types))}")
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
        raise ConfigError(f"{key}={raw!r}: expected a value of type {typ}") from None
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
            raise ConfigError(
                f"unknown preset {name_or_path!r}; presets: {', '.join(preset_names())} "
                f"(or give a path to a .json file)"
            )
        text = res.read_text()
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"preset {name_or_path!r} is not valid JSON: {exc}") from None
    if "base" not in data:
        data = {"base": data}
    data.setdefault("methods", {})
    data["base"].pop("_comment", None)
    return data
