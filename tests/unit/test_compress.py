"""The compressing codecs (stat2, stat4, topk) against loop references, and error feedback's invariant."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from _tiny import batches, make_model
from torch.testing import assert_close

from diloco.algorithm.streaming import StreamingDiLoCo
from diloco.comm.exchange import decode_contribution, encode_contribution, link_bytes
from diloco.comm.local import run_replicas
from diloco.traffic import all_gather_bytes
from diloco.wire import sizes
from diloco.wire.compress import StatisticalCodec, TopKCodec, pack_bits, unpack_bits
from diloco.wire.error_feedback import ErrorFeedback, error_feedback_step_
from diloco.wire.registry import ALL_CODEC_NAMES, COMPRESSING_CODECS, get_codec


# -- references, written as plain loops ------------------------------------------------------------------
def ref_pack(codes, bits):
    stream = [(int(c) >> b) & 1 for c in codes for b in range(bits)]
    stream += [0] * (-len(stream) % 8)
    return np.array([sum(stream[i + j] << j for j in range(8)) for i in range(0, len(stream), 8)], dtype=np.uint8)


def ref_stat(values, bits, r):
    """One group of values -> (codes, table) in float64: 2^bits equal bins over mean +- r std, bin means."""
    v = np.asarray(values, dtype=np.float64)
    levels = 1 << bits
    mu, sigma = v.mean(), v.std()
    lo, width = mu - r * sigma, 2 * r * sigma / levels
    codes = [min(levels - 1, max(0, math.floor((x - lo) / width))) if width > 0 else 0 for x in v]
    table = []
    for level in range(levels):
        members = [x for x, c in zip(v, codes) if c == level]
        table.append(sum(members) / len(members) if members else lo + (level + 0.5) * width)
    return codes, table


def ref_stat_codec(x, bits, block, r):
    codes, out = [], []
    for start in range(0, len(x), block):
        c, t = ref_stat(x[start : start + block], bits, r)
        codes += c
        out += [t[k] for k in c]
    return codes, np.array(out)


def ref_topk(x, density, chunk, r, tables="payload"):
    """(positions, local indices, codes, decoded values, tables) of chunked top-k with 2-bit values and one
    table of bin means for all selected values, or one per chunk."""
    positions, local, groups = [], [], []
    for start in range(0, len(x), chunk):
        part = x[start : start + chunk]
        k = min(len(part), max(1, math.ceil(density * len(part))))
        top = sorted(sorted(range(len(part)), key=lambda i: -abs(part[i]))[:k])
        local += top
        positions += [start + i for i in top]
        groups.append([start + i for i in top])
    if tables == "payload":
        groups = [positions]
    codes, out, all_tables = [], np.zeros(len(x)), []
    for group in groups:
        c, table = ref_stat([x[p] for p in group], 2, r)
        codes += c
        all_tables += table
        for p, code in zip(group, c):
            out[p] = table[code]
    return positions, local, codes, out, all_tables


# -- codecs ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("bits", [2, 4, 12])
def test_bit_packing_matches_the_loop(bits):
    codes = torch.randint(0, 1 << bits, (37,), generator=torch.Generator().manual_seed(bits))
    packed = pack_bits(codes, bits)
    np.testing.assert_array_equal(packed.numpy(), ref_pack(codes.tolist(), bits))
    assert torch.equal(unpack_bits(packed, bits, 37), codes)


@pytest.mark.parametrize("bits", [2, 4])
def test_statistical_codec_matches_the_reference(bits):
    codec = get_codec(f"stat{bits}")
    assert isinstance(codec, StatisticalCodec) and codec.bits == bits
    x = torch.randn(2500, generator=torch.Generator().manual_seed(1)) * torch.linspace(0.1, 3.0, 2500)
    payload = codec.encode(x)
    assert payload.numel() == codec.num_bytes(2500) == math.ceil(2500 * bits / 8) + 3 * (1 << bits) * 4
    codes, expected = ref_stat_codec(x.double().numpy(), bits, codec.block_size, codec.range_sigmas)
    assert unpack_bits(payload[: math.ceil(2500 * bits / 8)], bits, 2500).tolist() == codes
    assert_close(codec.decode(payload, 2500), torch.from_numpy(expected).float(), rtol=1e-5, atol=1e-6)


def test_topk_codec_matches_the_reference():
    codec = TopKCodec(density=0.05, chunk_size=256)
    n = 1000  # three full chunks of 256 (k = 13) and one of 232 (k = 12)
    x = torch.randn(n, generator=torch.Generator().manual_seed(2))
    positions, local, codes, expected, _ = ref_topk(x.double().numpy(), 0.05, 256, 6.0)
    k = len(positions)
    assert k == 3 * 13 + 12 == codec.num_selected(n)
    payload = codec.encode(x)
    assert payload.numel() == codec.num_bytes(n) == math.ceil(2 * k / 8) + math.ceil(8 * k / 8) + 16
    vb = math.ceil(2 * k / 8)
    np.testing.assert_array_equal(payload[:vb].numpy(), ref_pack(codes, 2))
    np.testing.assert_array_equal(payload[vb : vb + k].numpy(), ref_pack(local, 8))  # 8-bit indices for 256
    out = codec.decode(payload, n)
    assert torch.nonzero(out).flatten().tolist() == positions
    assert_close(out, torch.from_numpy(expected).float(), rtol=1e-5, atol=1e-6)


def test_topk_with_a_table_per_chunk_matches_the_reference():
    codec = TopKCodec(density=0.05, chunk_size=256, tables="chunk")
    n = 1000  # four chunks, four tables of 4 FP32 bin means
    # chunks of very different scales, as a fragment's tensors are: one table for all would lose them
    x = torch.randn(n, generator=torch.Generator().manual_seed(3)) * torch.tensor(
        [0.01, 1.0, 0.1, 3.0]
    ).repeat_interleave(torch.tensor([256, 256, 256, 232]))
    positions, local, codes, expected, tables = ref_topk(x.double().numpy(), 0.05, 256, 6.0, tables="chunk")
    k = len(positions)
    payload = codec.encode(x)
    assert payload.numel() == codec.num_bytes(n) == math.ceil(2 * k / 8) + k + 4 * 16
    assert sizes.topk_num_tables(n, chunk_size=256, tables="chunk") == 4
    vb = math.ceil(2 * k / 8)
    np.testing.assert_array_equal(payload[:vb].numpy(), ref_pack(codes, 2))
    np.testing.assert_array_equal(payload[vb : vb + k].numpy(), ref_pack(local, 8))
    assert_close(
        payload[vb + k :].clone().view(torch.float32), torch.tensor(tables, dtype=torch.float32), rtol=1e-5, atol=1e-7
    )
    out = codec.decode(payload, n)
    assert torch.nonzero(out).flatten().tolist() == positions
    assert_close(out, torch.from_numpy(expected).float(), rtol=1e-5, atol=1e-7)
    # what the per-chunk tables buy: each chunk keeps its scale; one table smears them into one
    one = TopKCodec(density=0.05, chunk_size=256)
    err = [((c.decode(c.encode(x), n) - x)[out != 0].norm() / x[out != 0].norm()).item() for c in (codec, one)]
    assert err[0] < 0.5 * err[1], err


def test_default_topk_is_sparselocos_budget():
    codec = get_codec("topk")
    assert (codec.chunk_size, codec.k_of(4096), codec.index_bits) == (4096, 64, 12)
    n = 1 << 22
    assert abs(8 * codec.num_bytes(n) / n - 0.21875) < 1e-4  # (2 + 12) / 64 bits per value
    assert get_codec("topk", topk_density=0.01).k_of(4096) == 41
    chunked = get_codec("topk", topk_tables="chunk")
    assert (chunked.tables, chunked.k_of(4096)) == ("chunk", 64)
    assert abs(8 * chunked.num_bytes(n) / n - (0.21875 + 4 * 32 / 4096)) < 1e-4  # + 4 FP32 bin means per chunk
    assert chunked.num_bytes(n) == sizes.payload_bytes("topk", n, topk_tables="chunk")
    assert abs(chunked.bits_per_value - 8 * chunked.num_bytes(n) / n) < 1e-4
    with pytest.raises(ValueError, match="tables='tile'.*payload.*chunk"):
        TopKCodec(tables="tile")
    with pytest.raises(ValueError, match="density"):
        TopKCodec(density=0.0)


@pytest.mark.parametrize("name", COMPRESSING_CODECS)
@pytest.mark.parametrize("n", [0, 1, 7, 1025, 5000])
def test_payload_size_depends_on_numel_only_and_nan_is_dropped(name, n):
    codec = get_codec(name)
    assert name in ALL_CODEC_NAMES
    x = torch.randn(n, generator=torch.Generator().manual_seed(n))
    payload = codec.encode(x)
    assert payload.dtype == torch.uint8 and payload.shape == (codec.num_bytes(n),)
    assert codec.decode(payload, n).shape == (n,)
    assert torch.equal(codec.decode(codec.encode(torch.zeros(n)), n), torch.zeros(n))
    if n:
        x[n // 2] = float("nan")
        assert not torch.isfinite(codec.decode(codec.encode(x), n)).all()


@pytest.mark.parametrize("n", [0, 1, 7, 4096, 4097, 9000])
def test_topk_with_chunk_tables_keeps_its_size_and_drops_nan(n):
    codec = get_codec("topk", topk_tables="chunk")
    x = torch.randn(n, generator=torch.Generator().manual_seed(n))
    payload = codec.encode(x)
    assert payload.shape == (codec.num_bytes(n),) == (sizes.payload_bytes("topk", n, topk_tables="chunk"),)
    assert torch.equal(codec.decode(codec.encode(torch.zeros(n)), n), torch.zeros(n))
    if n:
        x[n - 1] = float("inf")
        assert not torch.isfinite(codec.decode(codec.encode(x), n)).all()


def test_sparse_payloads_are_all_gathered_at_three_replicas():
    topk, stat = get_codec("topk"), get_codec("stat2")
    n, M = 10_000, 3

    def replica(comm):
        return comm.exchange_for(n, topk), comm.exchange_for(n, stat), comm.exchange_for(n)

    assert run_replicas(replica, M)[0] == ("all_gather", "reduce_scatter", "reduce_scatter")
    lb = link_bytes(topk, numel=n, num_replicas=M, exchange="all_gather", rank=0)
    assert lb == all_gather_bytes(topk.num_bytes(n), M)


def test_decode_own_contribution_is_what_the_shard_owners_decode():
    codec, n, M = get_codec("stat4"), 3001, 3
    x = torch.randn(n, generator=torch.Generator().manual_seed(3))
    payload = encode_contribution(x, codec, num_replicas=M, exchange="reduce_scatter")
    own = decode_contribution(payload, codec, numel=n, num_replicas=M, exchange="reduce_scatter")
    shards = x.split([1001, 1000, 1000])
    assert torch.equal(own, torch.cat([codec.decode(codec.encode(s), s.numel()) for s in shards]))


# -- error feedback ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", COMPRESSING_CODECS)
@pytest.mark.parametrize("decay", [1.0, 0.9])
def test_error_feedback_invariant(name, decay):
    """accumulator + sent = decay * previous accumulator + input, sync after sync."""
    codec, n = get_codec(name), 3000
    ef = ErrorFeedback([n], decay=decay)
    g = torch.Generator().manual_seed(4)
    total_in, total_sent = torch.zeros(n, dtype=torch.float64), torch.zeros(n, dtype=torch.float64)
    for _ in range(5):
        delta = torch.randn(n, generator=g)
        before = ef.accumulators[0].clone()
        _, sent = ef.step_(0, delta, encode=codec.encode, decode=lambda b: codec.decode(b, n))
        assert_close(ef.accumulators[0] + sent, decay * before + delta, rtol=1e-6, atol=1e-6)
        total_in += delta.double()
        total_sent += sent.double()
    if decay == 1.0:  # nothing lost, only delayed: sent + what is still owed = everything
        assert_close(total_sent + ef.accumulators[0].double(), total_in, rtol=1e-5, atol=1e-5)


def test_error_feedback_leaves_the_accumulator_alone_on_a_non_finite_input():
    codec = get_codec("stat2")
    acc = torch.randn(100)
    kept = acc.clone()
    bad = torch.randn(100)
    bad[3] = float("inf")
    _, sent = error_feedback_step_(acc, bad, decay=0.9, encode=codec.encode, decode=lambda b: codec.decode(b, 100))
    assert torch.equal(acc, kept) and not torch.isfinite(sent).all()
    with pytest.raises(ValueError, match="decay"):
        ErrorFeedback([3], decay=1.5)


def test_sparseloco_run_bytes_equal_the_traffic_function_and_replicas_agree():
    """M = 3 top-k with error feedback (beta 0.95) and SparseLoCo's outer step (SGD lr 1, no momentum)."""
    H, steps, M = 3, 9, 3
    codec = get_codec("topk")
    sgd = lambda params: torch.optim.SGD(params, lr=1.0)

    def replica(comm):
        model = make_model(seed=comm.rank)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        algo = StreamingDiLoCo(
            model, comm=comm, sync_every=H, codec="topk", error_feedback_decay=0.95, outer_optimizer=sgd
        )
        for x, y in batches(comm.rank, steps):
            model(x, y)[1].backward()
            opt.step()
            opt.zero_grad()
            algo.step()
        return algo

    algos = run_replicas(replica, M, timeout=60)
    n = algos[0].fragment_sizes()[0]
    for algo in algos:
        assert algo.comm.stats.bytes_sent == (steps // H) * all_gather_bytes(codec.num_bytes(n), M).sent
        assert algo.comm.stats.peak_exchange == all_gather_bytes(codec.num_bytes(n), M).sent
        assert algo.state_bytes()["error_feedback"] == 4 * n
        assert algo.error_feedback.accumulators[0].abs().sum() > 0  # it holds what top-k did not send
    assert torch.equal(algos[0].global_flat[0], algos[2].global_flat[0])
