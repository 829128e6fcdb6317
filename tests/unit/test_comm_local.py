import threading

import pytest
import torch

from diloco.comm.base import CommError
from diloco.comm.local import LocalGroup, run_replicas


def test_all_gather_returns_payloads_in_rank_order_and_counts_bytes():
    def fn(comm):
        payload = torch.full((5,), comm.rank, dtype=torch.uint8)
        work = comm.all_gather_async(payload, tag="x")
        out = work.wait()
        return [int(t[0]) for t in out], comm.stats.totals()

    res = run_replicas(fn, 3)
    for ranks, stats in res:
        assert ranks == [0, 1, 2]
        # what crosses each replica's link: its payload to each of the 2 others, theirs in
        assert stats["bytes_sent"] == 10 and stats["bytes_received"] == 10 and stats["peak_in_flight"] == 10


def test_peak_in_flight_sums_overlapping_exchanges():
    def fn(comm):
        w1 = comm.all_gather_async(torch.zeros(3, dtype=torch.uint8))
        w2 = comm.all_gather_async(torch.zeros(4, dtype=torch.uint8))
        w1.wait(), w2.wait()
        comm.all_gather_async(torch.zeros(2, dtype=torch.uint8)).wait()
        return comm.stats.peak_in_flight, comm.stats.in_flight

    assert run_replicas(fn, 2) == [(7, 0), (7, 0)]


def test_broadcast_copies_source_tensors():
    def fn(comm):
        t = torch.full((2,), float(comm.rank + 1))
        comm.broadcast_([t], src=1)
        return t.tolist()

    assert run_replicas(fn, 3) == [[2.0, 2.0]] * 3


def test_timeout_names_the_missing_replica():
    group = LocalGroup(2, timeout=0.3)
    work = group.communicators[0].all_gather_async(torch.zeros(1, dtype=torch.uint8))
    with pytest.raises(CommError, match=r"replicas \[1\] never arrived"):
        work.wait()


def test_a_failing_replica_aborts_its_peers_instead_of_hanging():
    def fn(comm):
        if comm.rank == 1:
            raise RuntimeError("boom in replica 1")
        comm.all_gather_async(torch.zeros(1, dtype=torch.uint8)).wait()

    before = threading.active_count()  # other tests' daemon threads (e.g. torchft's) may still run
    with pytest.raises(RuntimeError, match="boom in replica 1"):
        run_replicas(fn, 2, timeout=30)
    assert threading.active_count() <= before


def test_payload_type_is_checked():
    with pytest.raises(TypeError, match="uint8"):
        LocalGroup(1).communicators[0].all_gather_async(torch.zeros(3))


def test_mean_async_in_process_matches_the_rank_order_mean_for_both_exchanges():
    from diloco.wire.registry import get_codec

    codec = get_codec("fp32")

    def fn(comm, exchange):
        comm.exchange = exchange
        values = torch.arange(10, dtype=torch.float32) * (comm.rank + 1)
        work = comm.mean_async(comm.encode(values, codec), codec=codec, numel=10, tag="t")
        return work.exchange, work.wait()[0]

    want = torch.arange(10, dtype=torch.float32) * (1 + 2 + 3) / 3
    for exchange in ("all_gather", "reduce_scatter"):
        for ran, mean in run_replicas(lambda c, e=exchange: fn(c, e), 3):
            assert ran == exchange and torch.equal(mean, want)


def test_exchange_and_contribution_mistakes_are_value_errors_that_say_what_to_do():
    from diloco.wire.registry import get_codec

    comm = LocalGroup(1).communicators[0]
    with pytest.raises(ValueError, match="unknown exchange 'ring'; choose one of all_gather, reduce_scatter"):
        comm.exchange = "ring"
    codec = get_codec("int8")
    with pytest.raises(ValueError, match="encode it with this communicator's encode"):
        comm.mean_async(torch.zeros(5, dtype=torch.uint8), codec=codec, numel=100)
