"""A process forked while other threads are inside gRPC runs its program (:mod:`diloco.decoupled.rpc` turns gRPC's
fork handlers off).

With them on, a child forked (``subprocess`` with a pre-exec function, as Ray starts its GCS, raylet and agents)
while threads call a gRPC server can die of SIGABRT before it runs its program: 5 of 200 children on a 2-core AMD
EPYC, with gRPC logging "Other threads are currently calling into gRPC, skipping fork() handlers" 186 times. The
service serves learners over gRPC while it starts Ray, so a start of Ray timed out waiting for a GCS that had died.
Here: the same 200 children beside 3 threads calling a server, in a process that imports diloco's gRPC protocol
before grpc; every child must exit 0 and gRPC must not log a fork handler."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("grpc")

SCRIPT = textwrap.dedent(
    """
    import os, subprocess, sys, threading, time
    import diloco.decoupled.rpc  # before grpc, as the service and the site jobs import it
    import grpc
    from concurrent import futures

    echo = grpc.unary_unary_rpc_method_handler(lambda request, context: request)
    server = grpc.server(futures.ThreadPoolExecutor(4))
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("t.E", {"E": echo}),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    calls, stop = [0], threading.Event()

    def call():
        stub = grpc.insecure_channel(f"127.0.0.1:{port}").unary_unary("/t.E/E")
        while not stop.is_set():
            stub(b"x")
            calls[0] += 1

    threads = [threading.Thread(target=call, daemon=True) for _ in range(3)]
    for t in threads:
        t.start()
    while calls[0] < 100:  # the threads are inside gRPC
        time.sleep(0.01)
    codes = [subprocess.run(["true"], preexec_fn=lambda: None).returncode for _ in range(200)]
    stop.set()
    for t in threads:
        t.join(timeout=10)
    server.stop(0)
    print("env", os.environ.get("GRPC_ENABLE_FORK_SUPPORT"), "calls", calls[0] > 100, "failed", [c for c in codes if c])
    sys.stdout.flush()
    # not the interpreter's own exit: with gRPC's threads about it hung once in 3 suite runs, after this line
    # was printed (every child had run); what this tests ends here
    os._exit(0)
    """
)


@pytest.mark.timeout(120)
def test_children_forked_beside_grpc_threads_all_run_their_program():
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=90)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["env", "false", "calls", "True", "failed", "[]"], proc.stdout
    assert "fork()" not in proc.stderr, proc.stderr[-3000:]  # gRPC's fork handlers did not run
