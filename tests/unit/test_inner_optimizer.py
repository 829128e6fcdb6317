"""Muon as the inner optimizer: only the 2-D hidden matrices take Muon's step, the rest AdamW's."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.testing import assert_close

from diloco.algorithm.inner import CombinedOptimizer, build_inner_optimizer, split_parameters

A, B, C = 3.4445, -4.775, 2.0315  # Muon's Newton-Schulz coefficients


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(11, 6)
        self.fc = nn.Linear(6, 8)  # weight: hidden matrix; bias: AdamW
        self.norm = nn.LayerNorm(8)
        self.proj = nn.Linear(8, 6, bias=False)  # hidden matrix
        self.head = nn.Linear(6, 11, bias=False)  # output head: AdamW

    def forward(self, x):
        return self.head(self.proj(self.norm(torch.tanh(self.fc(self.embed(x))))))


def newton_schulz(g: torch.Tensor) -> torch.Tensor:
    """Muon's orthogonalisation written out: bf16, spectral norm <= 1, five quintic steps."""
    x = g.bfloat16()
    tall = g.shape[0] > g.shape[1]
    if tall:
        x = x.T
    x = x / x.norm().clamp(min=1e-7)
    for _ in range(5):
        gram = x @ x.T
        x = A * x + (B * gram + C * gram @ gram) @ x
    return (x.T if tall else x).float()


def test_split_keeps_embeddings_head_norms_and_biases_on_adamw():
    net = Net()
    matrices, rest = split_parameters(net)
    assert [id(p) for p in matrices] == [id(net.fc.weight), id(net.proj.weight)]
    assert {id(p) for p in rest} == {
        id(p) for p in (net.embed.weight, net.fc.bias, net.norm.weight, net.norm.bias, net.head.weight)
    }


def test_muon_steps_the_matrices_and_adamw_the_rest():
    torch.manual_seed(0)
    net = Net()
    lr, wd = 0.01, 0.1
    opt = build_inner_optimizer(net, name="muon", lr=lr, weight_decay=wd, betas=(0.9, 0.99))
    assert isinstance(opt, CombinedOptimizer) and len(opt.param_groups) == 2
    before = copy.deepcopy(net)
    x = torch.randint(0, 11, (4, 5))
    net(x).square().mean().backward()
    grads = {n: p.grad.clone() for n, p in net.named_parameters()}
    opt.step()

    ref = copy.deepcopy(before)
    adamw_names = ["embed.weight", "fc.bias", "norm.weight", "norm.bias", "head.weight"]
    params = dict(ref.named_parameters())
    for n in adamw_names:
        params[n].grad = grads[n]
    ref_opt = torch.optim.AdamW([params[n] for n in adamw_names], lr=lr, betas=(0.9, 0.99), weight_decay=wd)
    ref_opt.step()
    after = dict(net.named_parameters())
    for n in adamw_names:  # AdamW's rule, bit for bit
        assert torch.equal(after[n], params[n]), n
    for n in ("fc.weight", "proj.weight"):  # Muon's rule: decay, then the orthogonalised step
        w0, g = dict(before.named_parameters())[n].detach(), grads[n]
        scale = 0.2 * max(w0.shape) ** 0.5  # match_rms_adamw
        expected = w0 * (1 - lr * wd) - lr * scale * newton_schulz(g * (1 - 0.95**2))
        # bf16 arithmetic (torch's addmm and this loop round differently): a few % of the step
        assert_close(after[n].detach(), expected, rtol=0, atol=0.05 * lr * scale)
        adamw_like = w0 * (1 - lr * wd) - lr * g.sign()  # AdamW's first step is about lr * sign(g)
        assert (after[n].detach() - adamw_like).abs().max() > 0.5 * lr * scale


def test_combined_state_round_trips_and_rejects_another_optimizer():
    net = Net()
    opt = build_inner_optimizer(net, name="muon", lr=0.01)
    net(torch.randint(0, 11, (2, 3))).sum().backward()
    opt.step()
    state = copy.deepcopy(opt.state_dict())
    other = build_inner_optimizer(copy.deepcopy(net), name="muon", lr=0.01)
    other.load_state_dict(state)
    assert torch.equal(
        other.optimizers["muon"].state_dict()["state"][0]["momentum_buffer"],
        opt.optimizers["muon"].state_dict()["state"][0]["momentum_buffer"],
    )
    with pytest.raises(ValueError, match="inner optimizer it was written with"):
        other.load_state_dict({"adamw": state["adamw"]})
    with pytest.raises(ValueError, match="adamw, muon"):
        build_inner_optimizer(net, name="sgd", lr=0.1)
    with pytest.raises(ValueError, match="no 2-D hidden matrices"):
        build_inner_optimizer(nn.LayerNorm(4), name="muon", lr=0.1)
