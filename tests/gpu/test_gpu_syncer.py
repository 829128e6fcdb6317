"""``syncer_device=cuda``: the syncer's state on the GPU and what leaves it on the CPU, states that load across
devices, and a merge on the GPU equal to the CPU merge within the codec's tolerance (fp32 / bf16 / FP4, mean / RDA,
K < M so learners hold different copies and the drift of Theta enters each Delta_m)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch
from _gpu import requires_cuda
from _syncers import check_round_trip, check_state_devices, drive, small_syncer

pytestmark = [requires_cuda, pytest.mark.timeout(120)]


def test_the_state_lives_on_the_gpu_and_what_leaves_it_is_on_the_cpu():
    check_state_devices("cuda")


@pytest.mark.parametrize("src, dst", [("cuda", "cpu"), ("cpu", "cuda"), ("cuda", "cuda")])
def test_a_state_round_trips_between_the_gpu_and_the_cpu(src, dst):
    check_round_trip(src, dst)


def _rel_error(a: Sequence[torch.Tensor], b: Sequence[torch.Tensor], start: Sequence[torch.Tensor]) -> float:
    """|a - b| / |b - start| over all tensors: the difference against the distance the merges moved them."""
    diff = sum(float((x.cpu() - y).norm() ** 2) for x, y in zip(a, b, strict=True)) ** 0.5
    moved = sum(float((y - s).norm() ** 2) for y, s in zip(b, start, strict=True)) ** 0.5
    return diff / moved


#: The relative error allowed of a GPU merge against the CPU one: float sums rounded in another order (fp32), and
#: with a lossy codec a reply whose rounding may flip for a value on a quantization boundary.
TOLERANCE = {"fp32": 1e-5, "bf16": 1e-2, "fp4_e3m0": 5e-2}


@pytest.mark.parametrize("merge", ["mean", "rda"])
@pytest.mark.parametrize("codec", sorted(TOLERANCE))
def test_a_merge_on_the_gpu_equals_the_cpu_merge_within_the_codec_tolerance(codec, merge):
    cpu, gpu = small_syncer("cpu", codec=codec, merge=merge), small_syncer("cuda", codec=codec, merge=merge)
    start = [g.detach().clone() for g in cpu.global_flat]
    drive(cpu, rounds=4, codec=codec)
    drive(gpu, rounds=4, codec=codec)
    assert (
        _rel_error([g.detach() for g in gpu.global_flat], [g.detach() for g in cpu.global_flat], start)
        <= (TOLERANCE[codec])
    )
    bases = [(gpu._base[m][p], cpu._base[m][p], start[p]) for m in sorted(cpu._base) for p in range(len(start))]
    assert _rel_error(*zip(*bases, strict=True)) <= TOLERANCE[codec]
    assert [r.learners for r in gpu.records] == [r.learners for r in cpu.records]
    assert [r.weights for r in gpu.records] == [r.weights for r in cpu.records]


def test_a_gpu_syncer_is_checked_against_the_gpus_free_memory():
    from _tiny import make_model

    from diloco.decoupled.capacity import check_syncer_memory, device_available_bytes, syncer_bytes
    from diloco.train.config import TrainConfig, load_preset

    free, _ = torch.cuda.mem_get_info(0)
    assert device_available_bytes(torch.device("cuda:0")) == pytest.approx(free, rel=0.05)
    cfg = TrainConfig.from_dict({**load_preset("tiny")["base"], "method": "decoupled", "syncer_device": "cuda:0"})
    model = make_model()
    need, _ = syncer_bytes(cfg, model, None)
    check_syncer_memory(cfg, model, None, available=int(need) + 1)
    with pytest.raises(ValueError, match=r"cuda:0's free memory .*syncer_device=cpu"):
        check_syncer_memory(cfg, model, None, available=int(need) - 1)
