"""Per-replica shards: what each replica reads, step after step, from the token streams of
:mod:`diloco.data.tokens` (whose names are re-exported here).

``ShardSampler`` cuts the train stream into non-overlapping windows of ``seq_len + 1`` tokens and
deals them to the replicas: window ``w`` belongs to replica ``w mod world_size`` (``"interleaved"``,
the default: every replica sees the same mix of sources, as in the papers' i.i.d. setting) or to
replica ``w // (windows / world_size)`` (``"contiguous"``: replicas read different parts of the
corpus, a non-i.i.d. setting). Each replica's shard is disjoint from the others; within it the
windows are read in a seeded permutation, a new one every epoch. ``state_dict`` is (epoch, index),
so a resumed run reads exactly the batches it would have read.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Literal

import numpy as np
import torch

# the token streams (their own module): re-exported where they were defined before
from diloco.data.tokens import DocumentSpan, TokenData, prepare_tokens, split_point
from diloco.errors import ConfigError

__all__ = ["DocumentSpan", "ShardSampler", "TokenData", "eval_batches", "prepare_tokens", "split_point"]


def _check_int(name: str, value: Any, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise ConfigError(f"{name}={value!r}: need an integer >= {low}")
    return int(value)


def _check_tokens(tokens: Any) -> np.ndarray:
    if not isinstance(tokens, np.ndarray) or tokens.ndim != 1 or not np.issubdtype(tokens.dtype, np.integer):
        raise ConfigError(
            f"tokens: need a 1-D integer numpy array (e.g. TokenData.train), got "
            f"{type(tokens).__name__} {getattr(tokens, 'shape', '')} {getattr(tokens, 'dtype', '')}"
        )
    return tokens


def _gather(tokens: np.ndarray, starts: np.ndarray, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and next-token targets of the windows ``tokens[s : s + seq_len + 1]``."""
    windows = torch.from_numpy(tokens[starts[:, None] + np.arange(seq_len + 1)].astype(np.int64))
    return windows[:, :-1].contiguous(), windows[:, 1:].contiguous()


Partition = Literal["interleaved", "contiguous"]


class ShardSampler:
    """Replica ``rank``'s disjoint, deterministic, resumable stream of ``(inputs, targets)`` batches."""

    def __init__(
        self,
        tokens: np.ndarray,
        *,
        rank: int,
        world_size: int,
        batch_size: int,
        seq_len: int,
        seed: int,
        partition: Partition = "interleaved",
    ) -> None:
        self.tokens = _check_tokens(tokens)
        self.world_size = _check_int("world_size", world_size, 1)
        self.rank = _check_int("rank", rank, 0)
        if self.rank >= self.world_size:
            raise ConfigError(f"rank={rank} with world_size={world_size}: need 0 <= rank < world_size")
        self.batch_size = _check_int("batch_size", batch_size, 1)
        self.seq_len = _check_int("seq_len", seq_len, 1)
        self.seed = _check_int("seed", seed, 0)
        if partition not in ("interleaved", "contiguous"):
            raise ConfigError(f"partition={partition!r}: use 'interleaved' or 'contiguous'")
        self.partition = partition
        span = self.seq_len + 1
        per_rank = tokens.size // span // self.world_size  # equal shards: replicas' epochs stay in step
        if per_rank < self.batch_size:
            raise ConfigError(
                f"{tokens.size} tokens make {tokens.size // span} windows of seq_len+1={span} tokens, "
                f"{per_rank} per replica for world_size={world_size}: fewer than batch_size={batch_size}. "
                f"Lower seq_len or the per-replica batch size, use fewer replicas, or add corpus sources"
            )
        self._num_windows = tokens.size // span
        self.epoch = 0
        self.index = 0  # windows of the current epoch already read
        # Re-cuts of the current epoch (elastic restarts): (world_size, index) of each earlier stage.
        self.cuts: list[tuple[int, int]] = []
        self._set_shard()

    def _set_shard(self) -> None:
        """This replica's windows for the current epoch (and stage), and their order cache reset."""
        windows = np.arange(self._num_windows, dtype=np.int64)
        for stage, (world, index) in enumerate(self.cuts):  # what earlier stages left unread
            read = [
                _deal(windows, r, world, self.partition)[self._permutation(stage, r, world, windows)][:index]
                for r in range(world)
            ]
            windows = np.setdiff1d(windows, np.concatenate(read))
        self.window_starts = _deal(windows, self.rank, self.world_size, self.partition) * (self.seq_len + 1)
        self._order_epoch = -1
        self._order = np.empty(0, dtype=np.int64)

    def _permutation(self, stage: int, rank: int, world: int, windows: np.ndarray) -> np.ndarray:
        size = _deal(windows, rank, world, self.partition).size
        key = [self.seed, rank, self.epoch] + ([stage] if stage else [])  # stage 0: the order of a plain run
        return np.random.default_rng(key).permutation(size)

    @property
    def tokens_per_batch(self) -> int:
        return self.batch_size * self.seq_len

    @property
    def windows_per_epoch(self) -> int:
        return int(self.window_starts.size)

    def _epoch_order(self) -> np.ndarray:
        if self._order_epoch != self.epoch:
            stage = len(self.cuts)
            key = [self.seed, self.rank, self.epoch] + ([stage] if stage else [])
            self._order = np.random.default_rng(key).permutation(self.window_starts.size)
            self._order_epoch = self.epoch
        return self._order

    def next_starts(self) -> np.ndarray:
        """Token offsets of the next batch's windows (advances the sampler)."""
        picked = []
        need = self.batch_size
        while need:
            order = self._epoch_order()
            take = min(need, order.size - self.index)
            picked.append(order[self.index : self.index + take])
            self.index += take
            need -= take
            if self.index == order.size:  # a batch may straddle two epochs
                self.epoch, self.index = self.epoch + 1, 0
                if self.cuts:  # a re-cut lasts until the end of its epoch; then the usual partition
                    self.cuts = []
                    self._set_shard()
        return self.window_starts[np.concatenate(picked)]

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(inputs, targets)``, int64 tensors of shape ``[batch_size, seq_len]``; targets are shifted by one."""
        return _gather(self.tokens, self.next_starts(), self.seq_len)

    def state_dict(self) -> dict[str, Any]:
        state = {
            "epoch": self.epoch,
            "index": self.index,
            "seed": self.seed,
            "rank": self.rank,
            "world_size": self.world_size,
            "batch_size": self.batch_size,
            "seq_len": self.seq_len,
            "num_tokens": int(self.tokens.size),
            "partition": self.partition,
        }
        if self.cuts:  # only after a re-cut, so that states saved before elastic restarts existed are unchanged
            state["cuts"] = [list(c) for c in self.cuts]
        return state

    def _check_same_data(self, state: dict[str, Any], fields: tuple[str, ...]) -> None:
        for field in fields:
            mine = self.state_dict()[field]
            if state.get(field) != mine:
                raise ConfigError(
                    f"sampler state has {field}={state.get(field)!r} but this sampler has {mine!r}; "
                    f"resume with the data and settings the state was saved with"
                )

    def _set_position(self, epoch: Any, index: Any, cuts: list[tuple[int, int]]) -> None:
        self.epoch, self.cuts = epoch, cuts
        self._set_shard()
        if not (
            isinstance(epoch, int) and epoch >= 0 and isinstance(index, int) and 0 <= index < self.windows_per_epoch
        ):
            raise ConfigError(
                f"sampler state epoch={epoch!r}, index={index!r}: need epoch >= 0 and "
                f"0 <= index < {self.windows_per_epoch}"
            )
        self.index = index

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume at a saved position; the sampler must be built with the same data and settings."""
        self._check_same_data(state, ("seed", "rank", "world_size", "batch_size", "seq_len", "num_tokens", "partition"))
        self._set_position(state["epoch"], state["index"], [tuple(c) for c in state.get("cuts", [])])

    def recut_from(self, state: dict[str, Any]) -> None:
        """Continue the epoch of a run of another number of replicas (an elastic restart): see below.

        ``state`` is any one old replica's :meth:`state_dict` (all replicas read in lockstep, so they
        hold the same epoch, index and cuts). The windows the old replicas read in this epoch are
        computed from the seed, their number and ``index`` alone; the rest of the epoch is dealt
        to the new replicas (this one is ``rank`` of ``world_size``) as the partition deals a
        corpus, and read in a new seeded order. No window is read twice in the epoch, and none is
        skipped but the fewer than ``world_size`` left over by equal shards. From the next epoch
        on, the usual partition into ``world_size`` shards applies. With the same number of
        replicas and batch size this is :meth:`load_state_dict`.
        """
        self._check_same_data(state, ("seed", "seq_len", "num_tokens", "partition"))
        old_world, epoch, index = state["world_size"], state["epoch"], state["index"]
        cuts = [tuple(c) for c in state.get("cuts", [])]
        if old_world == self.world_size and state["batch_size"] == self.batch_size:
            self._set_position(epoch, index, cuts)
            return
        if index > 0:  # a stage with nothing read yet leaves nothing to cut away
            cuts.append((old_world, index))
        self._set_position(epoch, 0, cuts)
        if self.windows_per_epoch < self.batch_size:  # the rest of the epoch is too short: start the next
            self._set_position(epoch + 1, 0, [])


def _deal(windows: np.ndarray, rank: int, world: int, partition: Partition) -> np.ndarray:
    """Replica ``rank``'s windows among ``world`` equal shards of the sorted ``windows`` (leftovers unread)."""
    per = windows.size // world
    if partition == "interleaved":
        return windows[rank::world][:per]
    return windows[rank * per : (rank + 1) * per]


def eval_batches(
    tokens: np.ndarray, *, batch_size: int, seq_len: int, max_batches: int | None = None
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Deterministic evaluation batches: consecutive non-overlapping windows from the start of ``tokens``.

    Only full batches are yielded (a plain mean of per-batch losses is then a per-token mean);
    ``max_batches`` caps their number. Raises ValueError if not even one batch fits.
    """
    tokens = _check_tokens(tokens)
    batch_size = _check_int("batch_size", batch_size, 1)
    seq_len = _check_int("seq_len", seq_len, 1)
    if max_batches is not None:
        max_batches = _check_int("max_batches", max_batches, 1)
    span = seq_len + 1
    available = tokens.size // span // batch_size
    if available == 0:
        raise ConfigError(
            f"validation split of {tokens.size} tokens holds {tokens.size // span} windows of "
            f"seq_len+1={span} tokens, fewer than batch_size={batch_size}; "
            f"raise val_fraction or lower seq_len or the batch size"
        )
    count = available if max_batches is None else min(available, max_batches)
    return _eval_iter(tokens, batch_size, seq_len, count)


def _eval_iter(
    tokens: np.ndarray, batch_size: int, seq_len: int, count: int
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    span = seq_len + 1
    for b in range(count):
        starts = (np.arange(batch_size, dtype=np.int64) + b * batch_size) * span
        yield _gather(tokens, starts, seq_len)
