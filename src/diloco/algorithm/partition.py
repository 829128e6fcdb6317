"""Which block goes to which block group: pure arithmetic (no torch) shared by the fragmenter and the simulator."""

from __future__ import annotations

PATTERNS = ("strided", "sequential")


def block_groups(num_blocks: int, num_groups: int, pattern: str = "strided") -> list[int]:
    """Block i -> its block group: ``i mod G`` (strided) or contiguous runs differing by at most one (sequential).

    Pure arithmetic shared by the fragmenter and the simulator, so both split a model the same way.
    """
    if pattern not in PATTERNS:
        raise ValueError(f"fragment_pattern must be 'strided' or 'sequential', got {pattern!r}")
    if pattern == "strided":
        return [i % num_groups for i in range(num_blocks)]
    return [(i * num_groups) // num_blocks for i in range(num_blocks)]
