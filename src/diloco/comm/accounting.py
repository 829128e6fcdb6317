"""Byte accounting shared by every communicator backend.

Counts are logical payload bytes, per replica: ``sent`` is what this replica
contributed to an exchange (exactly the codec's output), ``received`` the
payloads of the other M-1 replicas. ``peak_in_flight`` is the largest sum of
``sent`` bytes of exchanges started but not yet waited on at any moment:
with Streaming DiLoCo and overlap it is one fragment's payload; with data
parallelism, one step's gradients.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Exchange:
    tag: str
    sent: int
    received: int


def exchanged_bytes(payload_bytes: int, num_replicas: int) -> tuple[int, int]:
    """(sent, received) of one all-gather of a ``payload_bytes`` payload among ``num_replicas``.

    Sent is the logical payload once (what this replica contributes; a lone replica sends nothing),
    received is every peer's payload. Communicators count these; sync reports quote them.
    """
    return (payload_bytes if num_replicas > 1 else 0), payload_bytes * (num_replicas - 1)


@dataclass
class CommStats:
    bytes_sent: int = 0
    bytes_received: int = 0
    num_exchanges: int = 0
    in_flight: int = 0
    peak_in_flight: int = 0
    #: Largest single exchange (``sent`` bytes): the peak bytes per sync.
    peak_exchange: int = 0
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
