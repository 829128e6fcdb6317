import pytest
from _tiny import make_model
from torch import nn

from diloco.algorithm.fragments import split_fragments


def names_by_fragment(model, P, pattern="strided"):
    return [set(f.names) for f in split_fragments(model, P, pattern=pattern)]


@pytest.mark.parametrize("P", [1, 2, 3, 5, 7])
@pytest.mark.parametrize("pattern", ["strided", "sequential"])
def test_every_trainable_parameter_in_exactly_one_fragment(P, pattern):
    model = make_model(n_blocks=6)
    frags = split_fragments(model, P, pattern=pattern)
    assert len(frags) == P
    listed = [n for f in frags for n in f.names]
    assert sorted(listed) == sorted(n for n, p in model.named_parameters() if p.requires_grad)
    assert sum(f.numel for f in frags) == sum(p.numel() for p in model.parameters())


def test_strided_and_sequential_assignment_of_blocks():
    model = make_model(n_blocks=6)
    strided = names_by_fragment(model, 4)  # fragment 0 = non-block; 3 block groups
    assert {n.split(".")[1] for n in strided[1]} == {"0", "3"}
    assert {n.split(".")[1] for n in strided[2]} == {"1", "4"}
    seq = names_by_fragment(model, 4, "sequential")
    assert {n.split(".")[1] for n in seq[1]} == {"0", "1"}
    assert {n.split(".")[1] for n in seq[3]} == {"4", "5"}
    assert strided[0] == {"embed.weight", "norm.weight", "norm.bias", "head.weight"}


def test_frozen_parameters_are_not_synced():
    model = make_model()
    model.embed.weight.requires_grad_(False)
    assert "embed.weight" not in {n for f in split_fragments(model, 2) for n in f.names}


def test_explicit_fragments_any_module():
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    frags = split_fragments(model, 2, fragments=[[model[0]], ["2.weight", model[2].bias]])
    assert frags[0].names == ("0.weight", "0.bias") and frags[1].names == ("2.weight", "2.bias")
    with pytest.raises(ValueError, match="in no fragment"):
        split_fragments(model, 1, fragments=[[model[0]]])
    with pytest.raises(ValueError, match="fragment 0 and in fragment 1"):
        split_fragments(model, 2, fragments=[[model[0], model[2]], [model[2]]])


def test_errors_name_the_values():
    with pytest.raises(ValueError, match="only 4 blocks"):
        split_fragments(make_model(n_blocks=4), 6)
    with pytest.raises(ValueError, match="explicit fragments"):
        split_fragments(nn.Linear(2, 2), 2)
    with pytest.raises(ValueError, match="one of strided, sequential, got 'random'"):
        split_fragments(make_model(), 2, pattern="random")


@pytest.mark.parametrize(
    "pattern, expected", [("strided", [[0, 2, 4], [1, 3, 5]]), ("sequential", [[0, 1, 2], [3, 4, 5]])]
)
def test_a_bare_stack_of_blocks_splits_its_blocks_over_every_fragment(pattern, expected):
    """Nothing trains outside the blocks: no fragment is kept empty for it (it used to fail: "fragment 0 is empty")."""
    stack = nn.ModuleList(nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4)) for _ in range(6))
    frags = split_fragments(stack, 2, pattern=pattern)
    blocks_of = [sorted({int(n.split(".")[0]) for n in f.names}) for f in frags]
    assert blocks_of == expected
    assert sum(f.numel for f in frags) == sum(p.numel() for p in stack.parameters())
    with pytest.raises(ValueError, match="num_fragments=7 needs at least as many blocks, the model has 6"):
        split_fragments(stack, 7)
