"""``shard_worker_model``: per-block FSDP units for the project's Transformer and for HF models, with and
without the bf16 mixed-precision policy (1 worker of 2 ranks on gloo).

Each rank trains on its half of a batch; the reference is the unsharded model trained on the whole batch
in the same process, both with SGD (momentum 0.9, lr 0.5), 3 steps. fp32: within 1e-5 (two half-batch
gradients averaged by FSDP's reduce-scatter vs the gradient of the mean: another FP32 order; measured
5e-7 on losses, 6e-8 on parameters). bf16 mixed precision: forward and backward in bf16 (8 bits of
mantissa), so losses and parameters agree to bf16's precision only: within 1e-2 (measured 1.6e-4 on
losses, 1e-3 on parameters); the parameters (master weights) stay fp32.
"""

from __future__ import annotations

import pytest
import torch

from diloco.distributed import run_processes

pytestmark = pytest.mark.timeout(180)

LLAMA = {
    "model_type": "llama",
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 64,
}
VOCAB, SEQ, STEPS = 300, 16, 3


def _model(kind: str) -> torch.nn.Module:
    torch.manual_seed(0)
    if kind == "hf-llama":
        from diloco.models.hf import build_hf_model

        return build_hf_model(dict(LLAMA), vocab_size=VOCAB, seq_len=SEQ)
    from diloco.models import Transformer, make_config

    return Transformer(make_config("tiny", vocab_size=VOCAB, seq_len=SEQ))


def _train(model: torch.nn.Module, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> list[float]:
    # SGD, linear in the gradient: a rounding difference stays as small in the parameters (AdamW's g / sqrt(v)
    # would turn bf16's noise on a near-zero gradient into a step of size lr)
    opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    losses = []
    for x, y in batches:
        loss = model(x, y)[1]
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def rank_fn(comm, cases: list[tuple[str, bool]]) -> list[dict]:
    import copy

    import torch.distributed as dist
    from torch.distributed.fsdp import FSDPModule

    from diloco.algorithm.fragments import find_blocks
    from diloco.comm.mesh import build_layout
    from diloco.train.sharding import full_tensors, shard_worker_model

    mesh = build_layout(1, 2).device_mesh["local"]
    rank = dist.get_rank()
    gen = torch.Generator().manual_seed(1)
    batches = [
        (x, torch.roll(x, -1, 1)) for x in (torch.randint(0, VOCAB, (4, SEQ), generator=gen) for _ in range(STEPS))
    ]
    out = []
    for kind, mixed in cases:
        reference = _model(kind)
        sharded = copy.deepcopy(reference)
        shard_worker_model(sharded, mesh, mixed_precision=mixed)
        blocks = find_blocks(sharded)[1]
        mine = [(x[2 * rank : 2 * rank + 2], y[2 * rank : 2 * rank + 2]) for x, y in batches]
        losses = _train(sharded, mine)
        both = torch.tensor(losses)  # the loss of the whole batch: the mean of the two ranks' half-batch losses
        dist.all_reduce(both)
        out.append(
            {
                "case": (kind, mixed),
                "units": all(isinstance(b, FSDPModule) for b in blocks) and isinstance(sharded, FSDPModule),
                "num_blocks": len(blocks),
                "dtypes": {str(p.dtype) for p in sharded.parameters()},
                "losses": (both / 2).tolist(),
                "reference_losses": _train(reference, batches),
                "params": full_tensors(dict(sharded.named_parameters())),
                "reference_params": {n: p.detach() for n, p in reference.named_parameters()},
            }
        )
    return out


# (The project's Transformer in fp32 is compared through the trainer: test_train_fsdp.py.)
CASES = [("transformer", True), ("hf-llama", False), ("hf-llama", True)]


def test_blocks_are_fsdp_units_and_sharded_training_matches_the_whole_model():
    pytest.importorskip("transformers")
    results = run_processes(rank_fn, 2, args=(CASES,), timeout_s=150)
    for res in results[0]:
        kind, mixed = res["case"]
        # every block its own FSDP unit, then the root
        assert res["units"] and res["num_blocks"] == (3 if kind == "transformer" else 2), res["case"]
        assert res["dtypes"] == {"torch.float32"}, res["case"]  # master weights stay fp32 with mixed precision
        tol = {"rtol": 1e-2, "atol": 1e-2} if mixed else {"rtol": 1e-5, "atol": 1e-5}
        torch.testing.assert_close(
            torch.tensor(res["losses"]), torch.tensor(res["reference_losses"]), **tol, msg=str(res["case"])
        )
        for name, value in res["reference_params"].items():
            torch.testing.assert_close(res["params"][name], value, **tol, msg=f"{res['case']} {name}")
        if not mixed:  # not vacuous: the steps moved the parameters by far more than the tolerance
            start = _model(kind).state_dict()
            assert max((res["params"][n] - start[n]).abs().max().item() for n in start if n in res["params"]) > 1e-2
    # bf16 compute is really used: the mixed-precision losses differ from the fp32 ones (yet agree to ~1e-2)
    by_case = {r["case"]: r for r in results[0]}
    assert by_case[("hf-llama", True)]["losses"] != by_case[("hf-llama", False)]["losses"]
