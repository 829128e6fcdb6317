"""The rule a sharded syncer's shard count obeys: S shards own whole fragments, so S divides P. Torch-free, so the
planner (:mod:`diloco.sim.syncer_cost`) and the config checks apply the syncer's own rule and words."""

from __future__ import annotations

from diloco.errors import ConfigError


def check_syncer_shards(num_shards: int, num_fragments: int) -> int:
    """``num_shards`` if S shards can divide P fragments (1 <= S <= P, S divides P), else a ConfigError."""
    if isinstance(num_shards, bool) or not isinstance(num_shards, int) or num_shards < 1:
        raise ConfigError(f"syncer_shards={num_shards!r}: give the number of syncer shards, at least 1 (1: one syncer)")
    if num_shards > num_fragments:
        raise ConfigError(
            f"syncer_shards={num_shards} with num_fragments={num_fragments}: a shard owns whole fragments, so there "
            f"can be at most {num_fragments}; set syncer_shards to a divisor of {num_fragments} or raise num_fragments"
        )
    if num_fragments % num_shards:
        divisors = [d for d in range(1, num_fragments + 1) if num_fragments % d == 0]
        raise ConfigError(
            f"syncer_shards={num_shards} does not divide num_fragments={num_fragments}: every shard owns the same "
            f"number of fragments; set syncer_shards to one of {divisors} or num_fragments to a multiple of "
            f"{num_shards}"
        )
    return num_shards


__all__ = ["check_syncer_shards"]
