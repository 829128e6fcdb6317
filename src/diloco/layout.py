"""Which fragment each repeated block belongs to: pure arithmetic, no torch.

The trainer's fragmenter (``diloco.algorithm.fragments``) and the simulator
(``diloco.sim``) must split a model the same way. This module holds the rule
without importing torch, so ``import diloco.sim`` stays light; the
fragmenter's own ``block_groups`` gives the same answer (a test checks it).

With P = 1 everything is one fragment. With P >= 2, fragment 0 holds the
parameters outside the blocks and the L blocks go to the G = P - 1 other
fragments: block i to group ``i mod G`` (strided, the Streaming DiLoCo
default) or in contiguous runs differing in length by at most one
(sequential).
"""

from __future__ import annotations

from typing import Any, Literal, get_args

from diloco.errors import ConfigError

#: Ways of assigning blocks to block groups.
FragmentPattern = Literal["strided", "sequential"]
PATTERNS: tuple[FragmentPattern, ...] = get_args(FragmentPattern)

#: The fragment that holds the parameters outside the blocks (embeddings, final norm, head).
NON_BLOCK_FRAGMENT = 0


def check_pattern(pattern: str) -> str:
    """``pattern`` if it is one of :data:`PATTERNS`, else a ValueError naming the choices."""
    if pattern not in PATTERNS:
        raise ConfigError(f"fragment_pattern must be one of {', '.join(PATTERNS)}, got {pattern!r}")
    return pattern


def block_groups(num_blocks: int, num_groups: int, pattern: str = "strided") -> list[int]:
    """Block i -> its block group: ``i mod G`` (strided) or contiguous runs (sequential)."""
    check_pattern(pattern)
    if not (isinstance(num_groups, int) and 1 <= num_groups <= num_blocks):
        raise ConfigError(f"need 1 <= block groups <= blocks={num_blocks}, got {num_groups!r}")
    if pattern == "strided":
        return [i % num_groups for i in range(num_blocks)]
    return [(i * num_groups) // num_blocks for i in range(num_blocks)]


def block_fragments(num_blocks: int, num_fragments: int, pattern: str = "strided") -> list[int]:
    """Fragment of each of ``num_blocks`` blocks; what lies outside the blocks is :data:`NON_BLOCK_FRAGMENT`.

    P = 1: every block in fragment 0. P >= 2: block i in fragment ``1 + group(i)`` over
    P - 1 block groups; needs P - 1 <= L.
    """
    L, P = num_blocks, num_fragments
    check_pattern(pattern)
    if P < 1:
        raise ConfigError(f"num_fragments (P) must be >= 1, got P={P}")
    if P == 1:
        return [NON_BLOCK_FRAGMENT] * L
    if P - 1 > L:
        raise ConfigError(
            f"num_fragments={P} needs {P - 1} block fragments but the model has only {L} blocks "
            f"(fragment 0 holds the non-block parameters); use num_fragments <= {L + 1}"
        )
    return [1 + g for g in block_groups(L, P - 1, pattern)]


def fragment_errors(cfg: Any, blocks: int | None) -> list[str]:
    """What is wrong with a training config's fragments (each message names the value and the fix).

    ``blocks``: the blocks of the config's model size (None: unknown, not checked against).
    """
    errors = []
    if blocks is not None and cfg.num_fragments >= 2 and not cfg.model and not cfg.fragments:
        if cfg.num_fragments - 1 > blocks:
            errors.append(
                f"num_fragments={cfg.num_fragments} needs {cfg.num_fragments - 1} block fragments but "
                f"size={cfg.size!r} has {blocks} blocks (fragment 0 holds the non-block parameters); "
                f"use num_fragments <= {blocks + 1} or a deeper size"
            )
    if cfg.fragments and len(cfg.fragments) != cfg.num_fragments:
        errors.append(
            f"fragments={list(cfg.fragments)} names {len(cfg.fragments)} fragments but num_fragments="
            f"{cfg.num_fragments}: give one comma-separated group of parameter-name prefixes per fragment"
        )
    return errors


__all__ = [
    "NON_BLOCK_FRAGMENT",
    "PATTERNS",
    "FragmentPattern",
    "block_fragments",
    "block_groups",
    "check_pattern",
    "fragment_errors",
]
