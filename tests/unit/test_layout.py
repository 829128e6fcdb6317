"""diloco.layout (torch-free) splits blocks into fragments exactly as the trainer's fragmenter does."""

import pytest

from diloco.algorithm.fragments import block_groups as trainer_block_groups
from diloco.layout import PATTERNS, block_groups


@pytest.mark.parametrize("pattern", PATTERNS)
def test_same_groups_as_the_fragmenter(pattern):
    for blocks in range(1, 40):
        for groups in range(1, blocks + 1):
            assert block_groups(blocks, groups, pattern) == trainer_block_groups(blocks, groups, pattern)


def test_every_group_is_used_and_sizes_differ_by_at_most_one():
    for pattern in PATTERNS:
        g = block_groups(10, 4, pattern)
        sizes = [g.count(i) for i in range(4)]
        assert min(sizes) >= 1 and max(sizes) - min(sizes) <= 1


def test_bad_arguments():
    with pytest.raises(ValueError, match="fragment_pattern"):
        block_groups(4, 2, "random")
    with pytest.raises(ValueError, match="block groups"):
        block_groups(4, 5)
