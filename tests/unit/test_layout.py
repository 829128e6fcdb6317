"""diloco.layout (torch-free) splits blocks into fragments exactly as the trainer's fragmenter does."""

import pytest
from _tiny import make_model

from diloco.algorithm.fragments import split_fragments
from diloco.layout import NON_BLOCK_FRAGMENT, PATTERNS, block_fragments, block_groups


@pytest.mark.parametrize("pattern", PATTERNS)
def test_same_fragments_as_the_fragmenter(pattern):
    """The fragmenter's split of a real model: block i's parameters in block_fragments(...)[i], the rest in 0."""
    for blocks in (1, 2, 5, 7):
        model = make_model(n_blocks=blocks)
        for P in range(1, blocks + 2):
            want = block_fragments(blocks, P, pattern)
            for frag in split_fragments(model, P, pattern=pattern):
                for name in frag.names:
                    parts = name.split(".")
                    expected = want[int(parts[1])] if parts[0] == "blocks" else NON_BLOCK_FRAGMENT
                    assert frag.index == expected, (blocks, P, name)
        with pytest.raises(ValueError, match=f"use num_fragments <= {blocks + 1}"):
            block_fragments(blocks, blocks + 2, pattern)


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
