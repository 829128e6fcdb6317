"""The live status page of a syncer service: a thread in ``diloco syncer``'s process (the run's monitor, which
outlives a restart of the syncer actor) that follows the run and serves the page and the metrics.

::

    page = StatusPage.open(host="0.0.0.0", port=8265)      # before the run's folder is written: a bad port refused
    page.start(out=out, name=name, cfg=cfg, inputs=inputs, echo=print)   # prints the URL
    ...                                                     # the run; the monitor's loop calls page.on_status(...)
    page.finish(final_loss=...)                             # status.json and status.html in the run's folder
    page.close()

It asks the syncer nothing: every :data:`POLL_S` seconds it reads what the syncer actor writes on this host anyway
(:mod:`diloco.decoupled.status.files`: its events, the learners' reports among them, its merge records, the age of
its newest checkpoint), and it takes the learners' liveness (their heartbeats' claims) from the status the service's
monitor asks for every ``--poll`` seconds already (:meth:`StatusPage.on_status`). The loss plot evaluates the
global parameters of the syncer's newest checkpoint (every ``eval_every_s``; 0: never), on this process's CPU.

Routes (each asks for the token, :mod:`diloco.status.server`): ``/`` the page (reloads itself every
:data:`REFRESH_S` s), ``/status.json`` the board's snapshot (and ``monitor``: the CPU the monitor spent so far, per
kind of work), ``/metrics`` Prometheus' text format
(:mod:`diloco.decoupled.status.metrics`). A request reads the board as the last read left it.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from diloco.decoupled.status.board import Board
from diloco.decoupled.status.cpu import CpuMeter, thread_cpu_s
from diloco.decoupled.status.files import Tail, checkpoint_age_s, global_parameters, shard_dirs
from diloco.decoupled.status.metrics import exposition
from diloco.decoupled.status.page import render
from diloco.decoupled.status.plots import Plots
from diloco.errors import ConfigError
from diloco.status.server import TOKEN_ENV, TOKEN_FILE, StatusServer, open_socket, status_token

#: Seconds between the monitor's reads of the syncer's files.
POLL_S = 1.0
#: Seconds between the page's reloads in a browser: each reload renders the rows again (~1.9 ms of CPU) and aiohttp
#: answers it (~0.9 ms); every 2 s that was 1.4 ms of CPU per second viewed, half the page's cost beside a syncer
#: (benchmarks/status_page_merge.py).
REFRESH_S = 5
#: Each plot is drawn again at most this often (seconds), and only when a page is asked for and the points it shows
#: changed; between, the page shows the SVG drawn last (:class:`~diloco.decoupled.status.plots.Plots`). A drawing
#: costs ~16 ms of CPU (matplotlib); at 15 s the redraws were 3.7 of the page's 4.8 ms of CPU per second viewed, at
#: 30 s 1.35 of 2.83 (benchmarks/status_page_merge.py). The loss is evaluated every 30 s by default.
PLOT_EVERY_S = 60.0
LOSS_FILE = "status-loss.jsonl"


class StatusPage:
    """The live page (module docstring)."""

    def __init__(self, sock: socket.socket | None, *, host: str, eval_every_s: float = 30.0) -> None:
        self.sock, self.host, self.eval_every_s = sock, host, eval_every_s
        self.board: Board | None = None
        self.server: StatusServer | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.plots = Plots(min_interval_s=PLOT_EVERY_S)  # the page's plots, drawn again only on new points
        self.out: Path | None = None
        self._dirs: list[Path] = []
        self._tails: list[tuple[Tail, Tail]] = []
        self.reads = 0
        self.read_s = 0.0  # this process's seconds reading the syncer's files, in total
        self.eval_s = 0.0  # ... and evaluating its checkpoints for the loss plot
        self.cpu = CpuMeter()  # the CPU seconds of each route's requests, the reads and the evaluations

    @classmethod
    def open(cls, *, host: str = "0.0.0.0", port: int | None = 0, eval_every_s: float = 30.0) -> StatusPage:
        """Bind ``host:port`` now (``port`` None: no page); a port out of range or taken is a ConfigError.
        ``eval_every_s``: seconds between evaluations of the global parameters for the loss plot (0: none)."""
        if not eval_every_s >= 0:
            raise ConfigError(f"--status-eval {eval_every_s!r}: give seconds >= 0 (0: no loss plot during the run)")
        return cls(None if port is None else open_socket(host, port), host=host, eval_every_s=eval_every_s)

    @property
    def port(self) -> int | None:
        return None if self.sock is None else int(self.sock.getsockname()[1])

    def url(self, path: str = "/") -> str:
        assert self.server is not None
        shown = socket.gethostname() if self.host in ("0.0.0.0", "::", "") else self.host
        return self.server.url(shown, path)

    # -- the board -----------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        assert self.board is not None
        with self._lock:
            return self.board.snapshot()

    def _page(self, query: dict[str, str]) -> tuple[str, str]:
        snap = self.snapshot()
        # each drawing counted in the page's CPU and as "plots" too; the page's first ones (importing matplotlib, its
        # fonts, the figures) apart, as "plots (first)": a cost once per process, not per page viewed
        kind = "plots" if any(self.plots.draws.values()) else "plots (first)"
        plots = self.plots.svgs(snap, measure=lambda: self.cpu.measure(kind))
        return render(snap, refresh_s=REFRESH_S, plots=plots), "text/html; charset=utf-8"

    def _json(self, query: dict[str, str]) -> tuple[str, str]:
        return json.dumps({**self.snapshot(), "monitor": self.monitor_row()}, allow_nan=False), "application/json"

    def monitor_row(self) -> dict[str, Any]:
        """The monitor's own work so far: its reads, and the CPU seconds and calls of each kind of its work
        (:class:`CpuMeter`; the server's thread, aiohttp's own work, as ``server_thread_cpu_s``)."""
        row = {"reads": self.reads, "read_s": self.read_s, "eval_s": self.eval_s, **self.cpu.as_row()}
        row["server_thread_cpu_s"] = thread_cpu_s(self.server.thread if self.server is not None else None)
        return row

    def _metrics(self, query: dict[str, str]) -> tuple[bytes, str]:
        return exposition(self.snapshot)

    def _routes(self) -> dict[str, Callable[[dict[str, str]], tuple[Any, str]]]:
        return {"/": self._page, "/status.json": self._json, "/metrics": self._metrics}

    def _metered(self, kind: str, route: Callable[[dict[str, str]], tuple[Any, str]]) -> Any:
        def metered(query: dict[str, str]) -> tuple[Any, str]:
            with self.cpu.measure(kind):
                return route(query)

        return metered

    # -- running -------------------------------------------------------------
    def start(self, *, out: Path, name: str, cfg: Any, inputs: Any, echo: Callable[[str], None] = print) -> None:
        """Follow the run in ``out`` (its syncer's files under ``out/syncer``) and serve the page; the loss plot
        evaluates the syncer's checkpoints on ``inputs``' validation batches (the run's ``cfg``)."""
        self.out = Path(out)
        self.board = Board(num_learners=cfg.replicas, name=name)
        self._dirs = shard_dirs(self.out / "syncer", cfg.syncer_shards)
        self._tails = [(Tail(d / "events.jsonl"), Tail(d / "records.jsonl")) for d in self._dirs]
        if self.sock is None:
            return
        token = status_token(self.out)
        self.server = StatusServer(
            self.sock, token=token, routes={path: self._metered(path, route) for path, route in self._routes().items()}
        ).start()
        self._thread = threading.Thread(
            target=self._follow, args=(cfg, inputs), name="diloco-status-follow", daemon=True
        )
        self._thread.start()
        where = "$" + TOKEN_ENV if os.environ.get(TOKEN_ENV, "").strip() else str(self.out / TOKEN_FILE)
        echo(f"status page: {self.url('/')} (metrics: /metrics; token in {where})")

    def on_status(self, status: dict[str, Any] | None) -> None:
        """The status the service's monitor got from the syncer (None: it did not answer): the learners' liveness."""
        if self.board is not None:
            with self._lock:
                self.board.poll(status, now=time.time())

    def _follow(self, cfg: Any, inputs: Any) -> None:
        from diloco.status.server import lower_priority

        lower_priority()  # reading the syncer's files and evaluating for the plot: after the merges and learners
        next_eval = time.monotonic() + (self.eval_every_s if self.eval_every_s > 0 else float("inf"))
        while not self._stop.wait(POLL_S):
            self.read()
            if time.monotonic() >= next_eval:
                self._evaluate(cfg, inputs)
                next_eval = time.monotonic() + self.eval_every_s

    def read(self) -> None:
        """Fold what the syncer wrote since the last read into the board."""
        with self.cpu.measure("read"):
            self._read()

    def _read(self) -> None:
        began = time.perf_counter()
        events = [row for tail, _ in self._tails for row in tail.read()]
        S = len(self._tails)
        records = [{**r, "fragment": r["fragment"] * S + s} for s, (_, t) in enumerate(self._tails) for r in t.read()]
        age = checkpoint_age_s(self._dirs)
        assert self.board is not None
        with self._lock:
            for row in sorted(events, key=lambda r: r.get("t", 0.0)):  # (shard s's fragment p is p * S + s)
                self.board.observe(row)
            for record in sorted(records, key=lambda r: r.get("at", 0.0)):
                self.board.merged(record)
            if age is not None:
                self.board.checkpoint_at = time.time() - age
            self.board.now = max(self.board.now, time.time())
        self.reads += 1
        self.read_s += time.perf_counter() - began

    def _evaluate(self, cfg: Any, inputs: Any) -> None:
        """The loss of the global parameters in the syncer's newest checkpoints (nothing while there are none)."""
        with self.cpu.measure("eval"):
            self._evaluate_now(cfg, inputs)

    def _evaluate_now(self, cfg: Any, inputs: Any) -> None:
        import torch

        from diloco.algorithm.fragments import split_fragments
        from diloco.train.evaluation import evaluate_parameters
        from diloco.train.inputs import run_fragments

        began = time.perf_counter()
        model = inputs.model
        fragments = split_fragments(
            model, cfg.num_fragments, pattern=cfg.fragment_pattern, fragments=run_fragments(cfg, model)
        )
        try:
            named = global_parameters(self._dirs, fragments)
        except Exception:  # a checkpoint replaced while read: the next evaluation reads the next one
            named = None
        if named is not None:
            loss = evaluate_parameters(model, named, inputs.val_batches, bf16=cfg.bf16, device=torch.device("cpu"))
            self._add_loss(loss)
        self.eval_s += time.perf_counter() - began

    def _add_loss(self, loss: float) -> None:
        assert self.board is not None and self.out is not None
        with self._lock:
            self.board.loss(t=time.time(), loss=loss)
            t, tokens, value = self.board.losses[-1]
        with open(self.out / LOSS_FILE, "a", encoding="utf-8") as fh:
            fh.write(json.dumps({"t": t, "tokens": tokens, "loss": value}, allow_nan=False) + "\n")

    def finish(self, *, final_loss: float | None = None) -> None:
        """The run ended: stop following, read the syncer's files a last time, add the loss of the final parameters,
        and write ``status.json`` and ``status.html`` (the page as the run ended) to the run's folder."""
        if self.board is None or self.out is None:
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60)
        monitor = self.monitor_row()  # (the server's thread before the read)
        self.read()
        if final_loss is not None:
            self._add_loss(final_loss)
        with self._lock:
            self.board.ended = True
        from diloco.files import atomic_write_bytes, write_json

        snap = self.snapshot()
        snap["monitor"] = {**self.monitor_row(), "server_thread_cpu_s": monitor["server_thread_cpu_s"]}
        write_json(self.out / "status.json", snap)
        atomic_write_bytes(self.out / "status.html", render(snap).encode("utf-8"))

    def close(self) -> None:
        """Stop following and serving (the socket is closed)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60)
        if self.server is not None:
            self.server.stop()
        elif self.sock is not None:
            self.sock.close()


__all__ = ["LOSS_FILE", "PLOT_EVERY_S", "POLL_S", "REFRESH_S", "StatusPage"]
