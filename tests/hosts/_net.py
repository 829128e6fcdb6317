"""Tiny TCP tools the harness tests run inside emulated hosts (no torch): ``serve``, ``send``, ``probe``.

python _net.py serve PORT OUT_JSON     # accept one connection, write {bytes, seconds, peer_says}
python _net.py send HOST PORT NBYTES   # connect (retrying up to 20 s), send our hostname line, then NBYTES
python _net.py probe HOST PORT TIMEOUT # print "ok" if a connection opens within TIMEOUT s, else "timeout"/"refused"
"""

import json
import socket
import sys
import time


def serve(port: int, out: str) -> None:
    with socket.create_server(("0.0.0.0", port)) as srv:
        while True:  # probes connect and close; the sender's connection starts with a line
            conn, _ = srv.accept()
            with conn:
                f = conn.makefile("rb")
                line = f.readline()
                if not line:
                    continue
                n, t0 = 0, None
                while chunk := f.read1(1 << 16):
                    t0 = t0 or time.perf_counter()
                    n += len(chunk)
                dt = time.perf_counter() - t0 if t0 else 0.0
                with open(out, "w") as fh:
                    json.dump({"peer_says": line.decode().strip(), "bytes": n, "seconds": dt}, fh)
                return


def _connect(host: str, port: int, timeout: float) -> socket.socket:
    deadline = time.monotonic() + timeout
    while True:
        try:
            return socket.create_connection((host, port), timeout=2)
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def send(host: str, port: int, nbytes: int) -> None:
    with _connect(host, port, 20) as s:
        s.sendall(socket.gethostname().encode() + b"\n")
        block = b"x" * (1 << 16)
        left = nbytes
        while left > 0:
            s.sendall(block[: min(left, len(block))])
            left -= len(block)


def probe(host: str, port: int, timeout: float) -> None:
    try:
        socket.create_connection((host, port), timeout=timeout).close()
        print("ok")
    except TimeoutError:
        print("timeout")
    except OSError as exc:
        print(f"error {exc}")


if __name__ == "__main__":
    cmd, *a = sys.argv[1:]
    {
        "serve": lambda: serve(int(a[0]), a[1]),
        "send": lambda: send(a[0], int(a[1]), int(a[2])),
        "probe": lambda: probe(a[0], int(a[1]), float(a[2])),
    }[cmd]()
