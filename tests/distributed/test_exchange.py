"""The cross-replica mean on gloo at M = 2, 3, 4 processes: both exchanges, bytes, bits, rounding, drops.

For M >= 3 the default exchange is the reduce-scatter (all-to-all of encoded
shards, FP32 sum at each shard's owner, all-gather of the encoded means); M = 2
keeps the all-gather. Checked against references computed here, in the test
process, from the same vectors (``exchange_values``):

* bytes: what the communicator counted (from the traffic function) equals the
  closed forms of :mod:`diloco.traffic` for the codec's shard sizes, and equals
  what it really handed to gloo for other ranks (``wire_*``);
* fp32: every rank's mean is bit-identical and equal to the FP32 mean summed in
  rank order (what the all-gather computes), for both exchanges;
* lossy codecs: the mean is exactly one more codec round trip of the FP32 mean of
  the decoded shard contributions, and its error is within the codec's bound;
* a non-finite contribution is dropped by every rank, and a sync where all are
  non-finite gives no mean.
"""

from __future__ import annotations

import math
from functools import partial

import pytest
import torch
from _replicas import exchange_cases, exchange_values, single_thread

from diloco.comm.local import run_replicas
from diloco.distributed import run_processes
from diloco.traffic import all_gather_bytes, reduce_scatter_bytes, shard_sizes
from diloco.wire.registry import get_codec
from diloco.wire.scaled import BlockScaledCodec

pytestmark = pytest.mark.timeout(120)

NUMEL = 1001  # not a multiple of M or of a block: uneven shards, partial blocks
LOSSY = ["bf16", "fp8_e4m3", "int8", "fp4_e3m0", "fp4_e2m1"]


def cases_for(m: int) -> list[dict]:
    cases = [
        {"codec": "fp32", "numel": NUMEL, "seed": 1},
        {"codec": "fp32", "numel": NUMEL, "seed": 1, "exchange": "all_gather"},
        {"codec": "fp32", "numel": NUMEL, "seed": 2, "poison": [1]},
        {"codec": "fp4_e2m1", "numel": NUMEL, "seed": 3, "poison": [m - 1]},
        {"codec": "int8", "numel": NUMEL, "seed": 4, "poison": list(range(m))},  # nothing left
        {"codec": "fp8_e4m3", "numel": 2, "seed": 5},
    ]  # fewer values than replicas when m >= 3
    cases += [{"codec": c, "numel": NUMEL, "seed": 10 + i, "scale": 10.0 ** (i - 2)} for i, c in enumerate(LOSSY)]
    # the compressing codecs: stat2 reduces like the others; sparse top-k is all-gathered at every M
    cases += [
        {"codec": "stat2", "numel": NUMEL, "seed": 30},
        {"codec": "topk", "numel": NUMEL, "seed": 31},
        {"codec": "topk", "numel": NUMEL, "seed": 32, "poison": [0]},
    ]
    return cases


@pytest.fixture(scope="module", params=[2, 3, 4])
def run(request):
    m = request.param
    cases = cases_for(m)
    return m, cases, run_processes(exchange_cases, m, args=(cases,), timeout_s=90)


def expected_exchange(m: int, case: dict) -> str:
    if not get_codec(case["codec"]).reduces_in_place:  # sparse payloads do not sum in place
        return "all_gather"
    wanted = case.get("exchange", "all_gather" if m <= 2 else "reduce_scatter")
    return "reduce_scatter" if wanted == "reduce_scatter" and m >= 3 and case["numel"] >= m else "all_gather"


def analytic_link(m: int, case: dict, rank: int) -> tuple[int, int]:
    codec, n = get_codec(case["codec"]), case["numel"]
    if expected_exchange(m, case) == "all_gather":
        lb = all_gather_bytes(codec.num_bytes(n), m)
    else:
        lb = reduce_scatter_bytes([codec.num_bytes(s) for s in shard_sizes(n, m)], rank)
    return lb.sent, lb.received


def reference(m: int, case: dict) -> tuple[torch.Tensor | None, list[int]]:
    """The mean the exchange must give, from the vectors, codec and shard cut alone."""
    codec, n = get_codec(case["codec"]), case["numel"]
    values = [exchange_values(r, n, case) for r in range(m)]
    dropped = [r for r in range(m) if not torch.isfinite(values[r]).all()]
    kept = [r for r in range(m) if r not in dropped]
    if not kept:
        return None, dropped
    if expected_exchange(m, case) == "all_gather":
        total = None
        for r in kept:
            v = codec.decode(codec.encode(values[r]), n)
            total = v if total is None else total.add_(v)
        return total.div_(len(kept)), dropped
    pieces = []
    for j, size in enumerate(shard_sizes(n, m)):
        start = sum(shard_sizes(n, m)[:j])
        total = None
        for r in kept:
            v = codec.decode(codec.encode(values[r][start : start + size]), size)
            total = v if total is None else total.add_(v)
        pieces.append(total.div_(len(kept)))
    return torch.cat(pieces), dropped


def test_every_rank_counts_the_traffic_function_and_hands_gloo_exactly_that(run):
    m, cases, results = run
    for rank, res in enumerate(results):
        for case, got in zip(cases, res, strict=True):
            assert got["exchange"] == expected_exchange(m, case), case
            sent, received = analytic_link(m, case, rank)
            assert got["link"] == (sent, received)
            assert got["counted"] == {
                "bytes_sent": sent,
                "bytes_received": received,
                "wire_sent": sent,
                "wire_received": received,
            }, case
            assert got["in_flight_after"] == 0
    if m >= 3:  # the reduce-scatter moves 2(M-1)/M of a payload each way, the all-gather (M-1)
        n_bytes = 4 * NUMEL
        rs = results[0][0]["link"][0]
        assert abs(rs - 2 * (m - 1) * n_bytes / m) <= 2 * (m - 1) * 4  # uneven shards: a value or so
        assert results[0][1]["link"][0] == (m - 1) * n_bytes


def test_fp32_mean_is_bit_identical_everywhere_and_equals_the_rank_order_mean(run):
    m, cases, results = run
    for i in (0, 1, 2):
        want, dropped = reference(m, cases[i])
        for res in results:
            assert res[i]["dropped"] == dropped
            assert torch.equal(res[i]["mean"], want), (res[i]["mean"] - want).abs().max()
    # both exchanges, same vectors: the same bits
    for res in results:
        assert torch.equal(res[0]["mean"], res[1]["mean"])


def test_a_nonfinite_contribution_is_dropped_by_every_rank(run):
    m, cases, results = run
    assert all(res[2]["dropped"] == [1] for res in results)
    assert all(res[3]["dropped"] == [m - 1] for res in results)
    for res in results:
        assert torch.isfinite(res[2]["mean"]).all() and torch.isfinite(res[3]["mean"]).all()
        assert res[4]["mean"] is None and res[4]["dropped"] == list(range(m))  # all dropped: no mean
    want, _ = reference(m, cases[3])  # the mean of the others, rounded once more per shard for m >= 3
    if m >= 3:
        want = round_per_shard(get_codec("fp4_e2m1"), want, m)
    assert torch.equal(results[0][3]["mean"], want)


def round_per_shard(codec, x: torch.Tensor, m: int) -> torch.Tensor:
    """One codec round trip of each of the m shards of ``x``: what the shard owners send."""
    return torch.cat([codec.decode(codec.encode(p), len(p)) for p in x.split(shard_sizes(x.numel(), m))])


def test_the_in_process_backend_gives_the_same_bits_and_bytes(run):
    m, cases, results = run
    with single_thread():
        local = run_replicas(partial(exchange_cases, cases=cases), m, timeout=60)
    for a, b in zip(local, results, strict=True):
        for x, y in zip(a, b, strict=True):
            assert (x["exchange"], x["dropped"], x["counted"]) == (y["exchange"], y["dropped"], y["counted"])
            assert (x["mean"] is None and y["mean"] is None) or torch.equal(x["mean"], y["mean"])


def rounding_bound_ok(codec, x: torch.Tensor, y: torch.Tensor) -> bool:
    """Is ``y`` within ``codec``'s bound of one rounding of ``x``?

    bf16: |y - x| <= 2^-8 |x| (round to nearest, 8 significand bits). Block-scaled codecs: per
    block, the chosen scale's squared error is at most that of ``s_up`` (the smallest scale that
    clips nothing), under which each element is off by at most half the largest gap g between
    element magnitudes: ||y_b - x_b||_2 <= sqrt(B) * g/2 * s_up * 2^k.
    """
    if codec.name == "bf16":
        return bool(((y - x).abs() <= x.abs() * 2.0**-8).all())
    assert isinstance(codec, BlockScaledCodec)
    B = codec.block_size
    pad = -x.numel() % B
    xb = torch.nn.functional.pad(x, (0, pad)).view(-1, B)
    eb = torch.nn.functional.pad(y - x, (0, pad)).view(-1, B)
    k = codec._tensor_exponent(x.abs().max())
    scale = 2.0 ** k.item()
    s_up = codec._block_scales(xb.abs().amax(dim=1) / scale).to(torch.float32)
    mags = {"int8": [0.0, 1.0], "fp8_e4m3": [416.0, 448.0]}.get(codec.name) or list(codec.magnitudes)
    gap = max(b - a for a, b in zip(mags, mags[1:]))
    bound = math.sqrt(B) * gap / 2 * s_up * scale
    return bool((eb.norm(dim=1) <= bound * (1 + 1e-5)).all())


def test_lossy_codecs_round_the_mean_once_more_within_the_codec_bound(run):
    m, cases, results = run
    for i, case in enumerate(cases):
        if case["codec"] == "fp32" or case.get("poison") or case["numel"] < m:
            continue
        codec = get_codec(case["codec"])
        exact, _ = reference(m, case)  # FP32 mean of the decoded contributions
        got = results[0][i]["mean"]
        for res in results[1:]:
            assert torch.equal(res[i]["mean"], got), case  # the same bits everywhere
        if expected_exchange(m, case) == "all_gather":
            assert torch.equal(got, exact)  # no extra rounding
            continue
        # exactly one codec round trip of each shard's mean, and so within the codec's bound
        sizes = shard_sizes(case["numel"], m)
        assert torch.equal(got, round_per_shard(codec, exact, m)), case
        assert not torch.equal(got, exact)  # the rounding is real
        if codec.name == "bf16" or isinstance(codec, BlockScaledCodec):  # the wire formats' bounds
            for p, q in zip(exact.split(sizes), got.split(sizes), strict=True):
                assert rounding_bound_ok(codec, p, q), case


def test_gloo_all_to_all_single_and_the_pairwise_rounds_give_the_same_bits():
    cases = [
        {"codec": c, "numel": NUMEL, "seed": 20 + i, "pairwise": p, "poison": [1] if i == 2 else []}
        for i, c in enumerate(["fp32", "fp4_e3m0", "int8"])
        for p in (True, False)
    ]
    results = run_processes(exchange_cases, 4, args=(cases,), timeout_s=90)
    for res in results:
        for a, b in zip(res[0::2], res[1::2], strict=True):
            assert a["exchange"] == b["exchange"] == "reduce_scatter"
            assert torch.equal(a["mean"], b["mean"]) and a["dropped"] == b["dropped"]
            assert a["counted"] == b["counted"]
    assert results[0][4]["dropped"] == [1]
