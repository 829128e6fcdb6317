"""The training methods' shared terms, defined once: names, H/P/tau limits, fragment layout.

Torch-free (standard library only), so the trainer's config, the algorithm, the
simulator and the planner can all use the same definitions:

* :data:`METHODS`: ``dp`` (data-parallel), ``diloco`` (P = 1, tau = 0) and
  ``streaming`` (Streaming DiLoCo);
* :func:`schedule_errors`: the limits on H = ``sync_every``, P =
  ``num_fragments`` and tau = ``overlap_steps`` (1 <= P <= H, 0 <= tau < H);
* :data:`FRAGMENT_PATTERNS` and :func:`block_fragments`: which fragment each
  of L repeated blocks belongs to. With P = 1 everything is fragment 0. With
  P >= 2, **fragment 0 holds what lies outside the blocks** (embeddings, final
  norm, head) and the blocks are split into the other P - 1 fragments: block i
  goes to fragment ``1 + i mod (P-1)`` (strided) or to contiguous runs
  (sequential). See :mod:`diloco.algorithm.fragments` for why.
"""

from __future__ import annotations

#: The methods the trainer runs.
METHODS: tuple[str, ...] = ("dp", "diloco", "streaming")

#: How repeated blocks are assigned to fragments.
FRAGMENT_PATTERNS: tuple[str, ...] = ("strided", "sequential")

#: The fragment that holds the parameters outside the blocks.
NON_BLOCK_FRAGMENT = 0


def check_method(method: str) -> str:
    """``method`` if it is one of :data:`METHODS`, else a ValueError naming the choices."""
    if method not in METHODS:
        raise ValueError(f"method={method!r}: choose one of {', '.join(METHODS)}")
    return method


def check_fragment_pattern(pattern: str) -> str:
    """``pattern`` if it is one of :data:`FRAGMENT_PATTERNS`, else a ValueError naming the choices."""
    if pattern not in FRAGMENT_PATTERNS:
        raise ValueError(f"fragment_pattern must be 'strided' or 'sequential', got {pattern!r}")
    return pattern


def schedule_errors(sync_every: int, num_fragments: int, overlap_steps: int) -> list[str]:
    """What is wrong with H, P, tau (empty if nothing): each message names the value and the fix."""
    H, P, tau = sync_every, num_fragments, overlap_steps
    errors = []
    if H < 1:
        errors.append(f"sync_every (H) must be >= 1, got H={H}")
        return errors
    if P < 1:
        errors.append(f"num_fragments (P) must be >= 1, got P={P}")
    elif P > H:
        errors.append(f"num_fragments (P={P}) cannot exceed sync_every (H={H}): each fragment needs its own "
                      f"step in every window of H steps; use P <= {H} or raise H to >= {P}")
    if not 0 <= tau < H:
        errors.append(f"overlap_steps (tau={tau}) must satisfy 0 <= tau < sync_every (H={H}) so that a "
                      f"fragment's sync finishes before its next one starts; use 0 <= tau <= {H - 1}")
    return errors


def block_groups(num_blocks: int, num_groups: int, pattern: str = "strided") -> list[int]:
    """Block i -> its block group: ``i mod G`` (strided) or contiguous runs differing by at most one (sequential)."""
    check_fragment_pattern(pattern)
    if pattern == "strided":
        return [i % num_groups for i in range(num_blocks)]
    return [(i * num_groups) // num_blocks for i in range(num_blocks)]


def block_fragments(num_blocks: int, num_fragments: int, pattern: str = "strided") -> list[int]:
    """Fragment of each of ``num_blocks`` blocks; what lies outside the blocks is :data:`NON_BLOCK_FRAGMENT`.

    P = 1: every block in fragment 0. P >= 2: block i in fragment ``1 + group(i)`` over
    P - 1 block groups; needs P - 1 <= L.
    """
    L, P = num_blocks, num_fragments
    check_fragment_pattern(pattern)
    if P < 1:
        raise ValueError(f"num_fragments (P) must be >= 1, got P={P}")
    if P == 1:
        return [NON_BLOCK_FRAGMENT] * L
    if P - 1 > L:
        raise ValueError(
            f"num_fragments={P} needs {P - 1} block fragments but the model has only {L} blocks "
            f"(fragment 0 holds the non-block parameters); use num_fragments <= {L + 1}"
        )
    return [1 + g for g in block_groups(L, P - 1, pattern)]


__all__ = [
    "FRAGMENT_PATTERNS", "METHODS", "NON_BLOCK_FRAGMENT", "block_fragments", "block_groups",
    "check_fragment_pattern", "check_method", "schedule_errors",
]
