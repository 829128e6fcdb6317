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

#: Ways of assigning blocks to block groups.
PATTERNS = ("strided", "sequential")


def block_groups(num_blocks: int, num_groups: int, pattern: str = "strided") -> list[int]:
    """Block i -> its block group: ``i mod G`` (strided) or contiguous runs (sequential)."""
    if pattern not in PATTERNS:
        raise ValueError(f"fragment_pattern must be 'strided' or 'sequential', got {pattern!r}")
    if not (isinstance(num_groups, int) and 1 <= num_groups <= num_blocks):
        raise ValueError(f"need 1 <= block groups <= blocks={num_blocks}, got {num_groups!r}")
    if pattern == "strided":
        return [i % num_groups for i in range(num_blocks)]
    return [(i * num_groups) // num_blocks for i in range(num_blocks)]


__all__ = ["PATTERNS", "block_groups"]
