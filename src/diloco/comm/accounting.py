"""Byte accounting shared by every communicator backend.

Counts are per replica and per direction, in bytes that cross this replica's
link: ``bytes_sent`` is what leaves it, ``bytes_received`` what arrives, as
given by the one traffic function (:mod:`diloco.traffic`) for the exchange the
communicator ran. For an all-gather of an ``n``-byte payload that is
``(M-1)·n`` each way (at M = 2 the payload once, as before); for the
reduce-scatter exchange (M >= 3) it is ``2(M-1)/M·n`` each way for equal shards.

``wire_sent`` / ``wire_received`` are counted independently, from the sizes
of the tensors the backend really hands to its collectives for other replicas
(a replica's own shard never leaves it); the tests check that they equal the
traffic function. They are diagnostics, not checkpointed.

``peak_in_flight`` is the largest sum of ``sent`` bytes of exchanges started
but not yet waited on at any moment: with Streaming DiLoCo and overlap it is
one fragment's exchange; with eager updates (tau = H) every fragment's exchange
is in flight between its sends, so it is the whole model's payload; with data
parallelism, one step's gradients.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Exchange:
    tag: str
    sent: int
    received: int


@dataclass
class CommStats:
    bytes_sent: int = 0
    bytes_received: int = 0
    num_exchanges: int = 0
    in_flight: int = 0
    peak_in_flight: int = 0
    #: Largest single exchange (``sent`` bytes): the peak bytes per sync.
    peak_exchange: int = 0
    #: Bytes handed to the backend's collectives for (from) other replicas, measured from tensor sizes.
    wire_sent: int = 0
    wire_received: int = 0
    _open: dict[int, Exchange] = field(default_factory=dict, repr=False)
    _next: int = 0

    def start(self, tag: str, *, sent: int, received: int) -> int:
        handle = self._next
        self._next += 1
        self._open[handle] = Exchange(tag, sent, received)
        self.bytes_sent += sent
        self.bytes_received += received
        self.num_exchanges += 1
        self.in_flight += sent
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        self.peak_exchange = max(self.peak_exchange, sent)
        return handle

    def finish(self, handle: int) -> Exchange:
        ex = self._open.pop(handle)
        self.in_flight -= ex.sent
        return ex

    def wire(self, *, sent: int, received: int) -> None:
        """Record bytes a backend collective really moves to (from) other replicas."""
        self.wire_sent += sent
        self.wire_received += received

    def totals(self) -> dict[str, int]:
        return {
            "bytes_sent": self.bytes_sent,
            "bytes_received": self.bytes_received,
            "num_exchanges": self.num_exchanges,
            "peak_in_flight": self.peak_in_flight,
            "peak_exchange": self.peak_exchange,
        }

    def state_dict(self) -> dict[str, int]:
        return {k: v for k, v in self.totals().items()}

    def load_state_dict(self, state: dict[str, int]) -> None:
        for k, v in state.items():
            setattr(self, k, int(v))
