"""The model family: config validation, counts against the real module, the loss, causality, training."""

from __future__ import annotations

import math
import re

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from diloco.algorithm.fragments import split_fragments
from diloco.models import (
    CPU_SIZES,
    PAPER_SIZES,
    SIZES,
    ModelConfig,
    Transformer,
    count_params,
    flops_per_token,
    get_size,
    lm_loss,
    make_config,
)
from diloco.models.transformer import apply_rotary, rotary_tables

VOCAB, SEQ = 64, 16


def tiny(**overrides) -> ModelConfig:
    return make_config("tiny", vocab_size=VOCAB, seq_len=SEQ, **overrides)


def build(cfg: ModelConfig, seed: int = 0) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(cfg)


def tokens(batch: int = 2, seq: int = SEQ, vocab: int = VOCAB, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(seed))


# -- configuration ---------------------------------------------------------------------------------

BASE = dict(vocab_size=64, seq_len=16, n_layers=2, n_heads=2, d_model=32, d_mlp=64)


@pytest.mark.parametrize(
    "bad, message",
    [
        (dict(d_model=30, n_heads=4), "d_model=30 is not divisible by n_heads=4"),
        (dict(d_model=30, n_heads=10), "head_dim = d_model / n_heads = 3 is odd"),
        (dict(n_layers=0), "n_layers=0 must be a positive integer"),
        (dict(vocab_size=-5), "vocab_size=-5 must be a positive integer"),
        (dict(d_mlp=2.5), "d_mlp=2.5 must be a positive integer"),
        (dict(z_loss=-1e-4), "z_loss=-0.0001 must be a finite number >= 0"),
        (dict(z_loss=float("nan")), "z_loss=nan"),
        (dict(rope_base=1.0), "rope_base=1.0 must be > 1"),
        (dict(init_std=0.0), "init_std=0.0 must be > 0"),
        (dict(qk_norm="yes"), "qk_norm='yes' must be True or False"),
    ],
)
def test_config_rejects_bad_values_naming_them(bad: dict, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        ModelConfig(**(BASE | bad))


def test_config_lists_every_error_at_once() -> None:
    with pytest.raises(ValueError) as err:
        ModelConfig(**(BASE | dict(seq_len=0, z_loss=-1.0)))
    assert "seq_len=0" in str(err.value) and "z_loss=-1.0" in str(err.value)


def test_unknown_size_lists_valid_names() -> None:
    with pytest.raises(ValueError, match="unknown model size 'cpu-2m'.*cpu-1m.*tiny"):
        get_size("cpu-2m")
    assert get_size("1.3b") is SIZES["1.3B"] and get_size("CPU-1M") is SIZES["cpu-1m"]


def test_make_config_needs_vocab_and_seq_for_cpu_sizes_and_checks_overrides() -> None:
    with pytest.raises(ValueError, match="vocab_size and seq_len from the data"):
        make_config("cpu-1m")
    with pytest.raises(ValueError, match=r"unknown ModelConfig field\(s\) \['dropout'\]"):
        make_config("tiny", vocab_size=64, seq_len=8, dropout=0.1)
    cfg = make_config("cpu-1m", vocab_size=4096, seq_len=128, z_loss=0.0, n_layers=2)
    assert (cfg.vocab_size, cfg.seq_len, cfg.z_loss, cfg.n_layers, cfg.d_model) == (4096, 128, 0.0, 2, 128)
    paper = make_config("35M")
    assert (paper.vocab_size, paper.seq_len, paper.tie_embeddings) == (32_768, 2_048, True)


def test_transformer_rejects_non_config() -> None:
    with pytest.raises(ValueError, match="needs a ModelConfig"):
        Transformer(SIZES["tiny"])  # a shape, not a config


# -- counts ------------------------------------------------------------------------------------------

shapes = st.fixed_dictionaries(
    dict(
        vocab_size=st.integers(2, 97),
        seq_len=st.integers(1, 40),
        n_layers=st.integers(1, 3),
        n_heads=st.integers(1, 4),
        head_half=st.integers(1, 6),
        d_mlp=st.integers(1, 50),
        qk_norm=st.booleans(),
        tie_embeddings=st.booleans(),
    )
)


def config_from(s: dict) -> ModelConfig:
    s = dict(s)
    s["d_model"] = s["n_heads"] * 2 * s.pop("head_half")
    return ModelConfig(**s)


@settings(max_examples=25, deadline=None)
@given(shapes)
def test_count_params_equals_the_module(s: dict) -> None:
    cfg = config_from(s)
    model = Transformer(cfg)
    assert count_params(cfg) == sum(p.numel() for p in model.parameters())
    outside = {id(model.embed.weight), id(model.head.weight)}
    non_embedding = sum(p.numel() for p in model.parameters() if id(p) not in outside)
    assert count_params(cfg, embeddings=False) == non_embedding


@settings(max_examples=15, deadline=None)
@given(shapes, st.integers(1, 3))
def test_flops_per_token_matmul_part_equals_counted_matmuls(s: dict, batch: int) -> None:
    """torch's FlopCounterMode counts every mm/bmm the module runs (its CPU flash-attention kernel is
    not counted, so what it sees is the linear layers): forward and forward+backward."""
    cfg = config_from(s)
    model = Transformer(cfg)
    x = tokens(batch, cfg.seq_len, cfg.vocab_size)
    n_tokens = x.numel()
    direct = sum(2 * m.in_features * m.out_features for m in model.modules() if isinstance(m, nn.Linear))
    assert flops_per_token(cfg, training=False, attention=False) == direct
    with FlopCounterMode(display=False) as fwd:
        model(x)
    assert fwd.get_total_flops() == flops_per_token(cfg, training=False, attention=False) * n_tokens
    with FlopCounterMode(display=False) as train:
        model(x, x)[1].backward()
    assert train.get_total_flops() == flops_per_token(cfg, attention=False) * n_tokens


def test_attention_flops_are_half_the_dense_score_and_value_matmuls() -> None:
    """Counted on an explicit (unfused) attention of the model's shapes: QK^T and AV over the full
    T x T matrix; the causal mask keeps half of it, which is the 2 L T d per token of the convention."""
    cfg = tiny()
    B, H, T, hd = 3, cfg.n_heads, cfg.seq_len, cfg.head_dim
    q = k = v = torch.randn(B, H, T, hd)
    with FlopCounterMode(display=False) as fc:
        torch.softmax(q @ k.transpose(-1, -2), dim=-1) @ v
    dense_per_token = cfg.n_layers * fc.get_total_flops() / (B * T)
    attn = flops_per_token(cfg, training=False) - flops_per_token(cfg, training=False, attention=False)
    assert attn == dense_per_token / 2 == 2 * cfg.n_layers * cfg.seq_len * cfg.d_model
    assert flops_per_token(cfg) == 3 * flops_per_token(cfg, training=False)


def _nominal(name: str) -> float:
    number = re.search(r"(\d+(?:\.\d+)?)([kMBmb])", name)
    assert number is not None
    return float(number[1]) * {"k": 1e3, "m": 1e6, "b": 1e9}[number[2].lower()]


@pytest.mark.parametrize("name", PAPER_SIZES)
def test_paper_shapes_match_their_names_with_tied_embeddings(name: str) -> None:
    """The papers' names count non-embedding parameters plus one (tied) vocab x d_model matrix."""
    cfg = make_config(name)
    assert abs(count_params(cfg) / _nominal(name) - 1) < 0.05
    untied = make_config(name, tie_embeddings=False)
    assert count_params(untied) - count_params(cfg) == 32_768 * cfg.d_model


@pytest.mark.parametrize("name", CPU_SIZES)
def test_cpu_sizes_match_their_names_in_non_embedding_parameters(name: str) -> None:
    cfg = make_config(name, vocab_size=4096, seq_len=128)
    assert abs(count_params(cfg, embeddings=False) / _nominal(name) - 1) < 0.05


def test_tiny_is_tiny() -> None:
    assert 20_000 <= count_params(tiny(), embeddings=False) <= 50_000


# -- the forward pass and the loss ---------------------------------------------------------------


def test_forward_shapes_and_no_loss_without_targets() -> None:
    model = build(tiny())
    x = tokens(3, SEQ - 5)
    logits, loss = model(x)
    assert logits.shape == (3, SEQ - 5, VOCAB) and loss is None
    logits, loss = model(x, x)
    assert loss is not None and loss.shape == ()
    with pytest.raises(ValueError, match=f"sequence length {SEQ + 1} exceeds the model's seq_len={SEQ}"):
        model(tokens(1, SEQ + 1))


def test_blocks_are_a_module_list_and_split_into_fragments() -> None:
    model = build(tiny())
    assert isinstance(model.blocks, nn.ModuleList) and len(model.blocks) == model.config.n_layers
    frags = split_fragments(model, 1 + model.config.n_layers)
    assert set(frags[0].names) == {"embed.weight", "norm.weight", "head.weight"}
    assert all(name.startswith(f"blocks.{i}.") for i, f in enumerate(frags[1:]) for name in f.names)


def test_loss_at_init_is_close_to_uniform() -> None:
    vocab = 1000
    model = build(make_config("tiny", vocab_size=vocab, seq_len=SEQ))
    _, terms = model.loss_terms(tokens(8, vocab=vocab), tokens(8, vocab=vocab, seed=2))
    assert abs(terms.ce.item() - math.log(vocab)) < 0.05


def test_causal_masking() -> None:
    model = build(tiny())
    x = tokens(2)
    j = 9
    y = x.clone()
    y[:, j] = (y[:, j] + 1) % VOCAB
    a, b = model(x)[0], model(y)[0]
    torch.testing.assert_close(a[:, :j], b[:, :j], rtol=0, atol=0)
    assert (a[:, j:] - b[:, j:]).abs().amax(dim=-1).min() > 0


def test_loss_terms_equal_their_formulas() -> None:
    cfg = tiny(z_loss=0.01)
    model = build(cfg)
    x, y = tokens(3), tokens(3, seed=7)
    logits, terms = model.loss_terms(x, y)
    ce = F.cross_entropy(logits.flatten(0, 1), y.flatten())
    z = 0.01 * torch.logsumexp(logits, dim=-1).square().mean()
    torch.testing.assert_close(terms.ce, ce)
    torch.testing.assert_close(terms.z, z)
    torch.testing.assert_close(terms.loss, ce + z)
    torch.testing.assert_close(model(x, y)[1], ce + z)


@settings(max_examples=20, deadline=None)
@given(st.floats(-30, 30), st.integers(2, 50))
def test_z_loss_sees_the_log_partition_of_shifted_logits(shift: float, vocab: int) -> None:
    """Adding c to every logit leaves CE unchanged and moves logsumexp by exactly c."""
    logits = torch.randn(4, 5, vocab, generator=torch.Generator().manual_seed(vocab), dtype=torch.float64)
    targets = torch.randint(0, vocab, (4, 5), generator=torch.Generator().manual_seed(1))
    base = lm_loss(logits, targets, z_loss=1.0)
    moved = lm_loss(logits + shift, targets, z_loss=1.0)
    lse = torch.logsumexp(logits.float(), dim=-1)
    torch.testing.assert_close(moved.ce, base.ce, atol=1e-4, rtol=0)
    torch.testing.assert_close(moved.z, (lse + shift).square().mean(), atol=1e-3, rtol=1e-5)


def test_zero_z_loss_is_plain_cross_entropy() -> None:
    model = build(tiny(z_loss=0.0))
    x, y = tokens(2), tokens(2, seed=3)
    logits, terms = model.loss_terms(x, y)
    assert terms.z.item() == 0.0
    torch.testing.assert_close(terms.loss, F.cross_entropy(logits.flatten(0, 1), y.flatten()))


@settings(max_examples=20, deadline=None)
@given(st.integers(0, 40), st.integers(0, 40), st.integers(-20, 20))
def test_rotary_scores_depend_only_on_relative_position(i: int, j: int, shift: int) -> None:
    i2, j2 = i + shift, j + shift
    if min(i2, j2) < 0:
        return
    hd = 8
    cos, sin = rotary_tables(64, hd)
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 1, 1, hd, generator=g), torch.randn(1, 1, 1, hd, generator=g)

    def score(a: int, b: int) -> torch.Tensor:
        return (apply_rotary(q, cos[a : a + 1], sin[a : a + 1]) * apply_rotary(k, cos[b : b + 1], sin[b : b + 1])).sum()

    torch.testing.assert_close(score(i, j), score(i2, j2), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(apply_rotary(q, cos[i : i + 1], sin[i : i + 1]).norm(), q.norm())


def test_qk_norm_and_tied_embeddings_switch_their_parameters() -> None:
    plain = build(tiny(qk_norm=False))
    assert not any("q_norm" in n or "k_norm" in n for n, _ in plain.named_parameters())
    tied = build(tiny(tie_embeddings=True))
    assert tied.head.weight is tied.embed.weight


def test_bf16_autocast_matches_fp32() -> None:
    model = build(tiny())
    x, y = tokens(2), tokens(2, seed=4)
    _, fp32 = model(x, y)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits, bf16 = model(x, y)
    assert logits.dtype == torch.bfloat16 and bf16.dtype == torch.float32
    assert abs(bf16.item() - fp32.item()) < 0.02
    bf16.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


# -- training and determinism ------------------------------------------------------------------------


def test_adamw_steps_on_a_fixed_batch_reduce_the_loss() -> None:
    model = build(tiny())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x, y = tokens(4), tokens(4, seed=5)
    losses = []
    for _ in range(15):
        _, loss = model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 1.0


def test_initialisation_is_determined_by_the_seed() -> None:
    a, b, c = build(tiny(), seed=3), build(tiny(), seed=3), build(tiny(), seed=4)
    for (name, p), q, r in zip(a.state_dict().items(), b.state_dict().values(), c.state_dict().values()):
        assert torch.equal(p, q), name
        if "norm" not in name:
            assert not torch.equal(p, r), name
    x = tokens(2)
    assert torch.equal(a(x)[0], b(x)[0])


def test_initial_scales() -> None:
    """std 0.02 for matrices, 0.02 / sqrt(2 L) for the residual-branch outputs, 1 for norm scales."""
    cfg = make_config("cpu-1m", vocab_size=512, seq_len=16)
    model = build(cfg)
    std = 0.02 / math.sqrt(2 * cfg.n_layers)
    assert abs(model.blocks[0].attn.out.weight.std().item() / std - 1) < 0.05
    assert abs(model.blocks[0].mlp.proj.weight.std().item() / std - 1) < 0.05
    assert abs(model.blocks[0].attn.qkv.weight.std().item() / 0.02 - 1) < 0.05
    assert torch.equal(model.blocks[0].attn.q_norm.weight, torch.ones(cfg.head_dim))
    assert "rope_cos" not in model.state_dict()
