"""The one traffic function: closed forms and the exact per-rank count agree."""

import pytest

from diloco.traffic import (
    all_gather_bytes,
    default_exchange,
    exchange_bytes,
    reduce_scatter_bytes,
    shard_sizes,
)


@pytest.mark.parametrize("m", [1, 2, 3, 4, 8])
def test_all_gather_is_m_minus_one_payloads(m):
    lb = all_gather_bytes(1000, m)
    assert lb.sent == lb.received == 1000 * (m - 1)
    assert exchange_bytes(payload_bytes=1000, num_replicas=m, exchange="all_gather") == 1000 * (m - 1)


@pytest.mark.parametrize("m", [2, 3, 4, 8])
def test_reduce_scatter_equal_shards_is_the_bandwidth_limit(m):
    n = 840 * m
    shards = [n // m] * m
    for rank in range(m):
        lb = reduce_scatter_bytes(shards, rank)
        assert lb.sent == lb.received == 2 * (m - 1) * n // m
    assert exchange_bytes(payload_bytes=n, num_replicas=m, exchange="reduce_scatter") == pytest.approx(
        2 * (m - 1) * n / m
    )


def test_reduce_scatter_unequal_shards_sums_to_total_traffic():
    shards = [11, 10, 10]
    per_rank = [reduce_scatter_bytes(shards, r) for r in range(3)]
    # every byte sent is received by someone
    assert sum(lb.sent for lb in per_rank) == sum(lb.received for lb in per_rank)
    assert per_rank[0].sent == 20 + 22


def test_shard_sizes_cover_and_balance():
    sizes = shard_sizes(10, 4)
    assert sizes == [3, 3, 2, 2] and sum(sizes) == 10
    assert shard_sizes(2, 4) == [1, 1, 0, 0]


def test_bad_inputs_name_the_value():
    with pytest.raises(ValueError, match="ring"):
        exchange_bytes(payload_bytes=1, num_replicas=2, exchange="ring")
    with pytest.raises(ValueError, match="num_replicas"):
        all_gather_bytes(1, 0)
    with pytest.raises(ValueError, match="rank"):
        reduce_scatter_bytes([1, 1], 2)


def test_default_exchange_switches_above_two():
    assert default_exchange(2) == "all_gather"
    assert default_exchange(3) == "reduce_scatter"


def test_traffic_does_not_import_torch():
    import subprocess
    import sys

    code = "import sys, diloco.traffic; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
