"""A TCP relay on loopback that counts the bytes each way and can hold them: a partition between a learner and
the syncer's endpoint on one machine, for the tests and ``benchmarks/transport.py``.

Held, the relay forwards nothing (its connections stay up, the bytes wait, as TCP's do on a WAN link that drops
packets for a while) until released; a connection made while held is accepted and stays silent.
"""

from __future__ import annotations

import socket
import threading


class Relay:
    """A TCP relay on loopback to ``port``: counts the bytes each way; :meth:`hold` stops every byte (held, not
    lost) until :meth:`release`. A connection made while held is accepted and stays silent."""

    def __init__(self, port: int) -> None:
        self.target, self.bytes = port, [0, 0]  # [to the server, to the client]
        self.open = threading.Event()
        self.open.set()
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:  # closed
                return
            try:
                server = socket.create_connection(("127.0.0.1", self.target))
            except OSError:  # the gateway has stopped
                client.close()
                continue
            for a, b, way in ((client, server, 0), (server, client, 1)):
                threading.Thread(target=self._pump, args=(a, b, way), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, way: int) -> None:
        try:
            while data := src.recv(1 << 16):
                self.open.wait()
                self.bytes[way] += len(data)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def hold(self) -> None:
        self.open.clear()

    def release(self) -> None:
        self.open.set()

    def total(self) -> int:
        return sum(self.bytes)

    def close(self) -> None:
        self.sock.close()


__all__ = ["Relay"]
