"""The live status page of a syncer service: a thread in ``diloco syncer``'s process (the run's monitor, which
outlives a restart of the syncer actor) that reads the actor's feed every 2 s (:data:`POLL_S`) and serves the page and the
metrics.

::

    page = StatusPage.open(host="0.0.0.0", port=8265)      # before the run's folder is written: a bad port refused
    page.start(shards, out=out, name=name, num_learners=M, evaluate=fn, echo=print)   # prints the URL
    ...                                                     # the run
    page.finish(final_loss=...)                             # status.json and status.html in the run's folder
    page.close()

Routes (each asks for the token, :mod:`diloco.status.server`): ``/`` the page (reloads itself every
:data:`REFRESH_S` s), ``/status.json`` the board's snapshot, ``/metrics`` Prometheus' text format
(:mod:`diloco.decoupled.status.metrics`). A request reads the board as the last poll left it: serving the page
calls nothing on the syncer, whose only cost is the poll (one small call per shard every 2 s: the page reloads as often) and the
evaluation of its global parameters for the loss plot (every ``eval_every_s``; 0: never).
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from diloco.decoupled.status.board import Board
from diloco.decoupled.status.metrics import exposition
from diloco.decoupled.status.page import render
from diloco.decoupled.status.plots import loss_svg, rate_svg
from diloco.errors import ConfigError
from diloco.status.server import TOKEN_ENV, TOKEN_FILE, StatusServer, open_socket, status_token

#: Seconds between the monitor's reads of the syncer's feed.
POLL_S = 2.0
#: Seconds between the page's reloads in a browser.
REFRESH_S = 2
#: The plots are drawn again at most this often (seconds).
PLOT_EVERY_S = 5.0
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
        self._plots: tuple[float, tuple[str, str]] | None = None
        self.out: Path | None = None
        self.polls = 0
        self.poll_seconds = 0.0  # the monitor's time in its calls to the syncer, in total
        self.eval_fetch_s = 0.0  # the monitor's time fetching the global parameters for the loss plot
        self._feeds: list[tuple[str, int, int]] | None = None  # each shard's (feed, cursor, merges read)
        self._polling = threading.Lock()

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
        now = time.monotonic()
        if self._plots is None or now - self._plots[0] >= PLOT_EVERY_S:
            self._plots = (now, (loss_svg(snap), rate_svg(snap)))
        return render(snap, refresh_s=REFRESH_S, plots=self._plots[1]), "text/html; charset=utf-8"

    def _json(self, query: dict[str, str]) -> tuple[str, str]:
        return json.dumps(self.snapshot(), allow_nan=False), "application/json"

    def _metrics(self, query: dict[str, str]) -> tuple[bytes, str]:
        return exposition(self.snapshot)

    # -- running -------------------------------------------------------------
    def start(
        self,
        shards: Any,
        *,
        out: Path,
        name: str,
        cfg: Any,
        inputs: Any,
        echo: Callable[[str], None] = print,
    ) -> None:
        """Start polling ``shards`` (:class:`~diloco.decoupled.ray_shards.RayShards`) and serving the page; the loss
        plot evaluates the syncer's global parameters on ``inputs``' validation batches (the run's ``cfg``)."""
        self.out = Path(out)
        self.board = Board(num_learners=cfg.replicas, name=name)
        evaluate, eval_every_s = partial(self.global_loss, shards, cfg, inputs), self.eval_every_s
        if self.sock is None:
            return
        token = status_token(self.out)
        self.server = StatusServer(
            self.sock, token=token, routes={"/": self._page, "/status.json": self._json, "/metrics": self._metrics}
        ).start()
        args = (shards, evaluate, eval_every_s)
        self._thread = threading.Thread(target=self._poll_loop, args=args, name="diloco-status-poll", daemon=True)
        self._thread.start()
        where = "$" + TOKEN_ENV if os.environ.get(TOKEN_ENV, "").strip() else str(self.out / TOKEN_FILE)
        echo(f"status page: {self.url('/')} (metrics: /metrics; token in {where})")

    def _poll_loop(self, shards: Any, evaluate: Callable[[], float] | None, eval_every_s: float) -> None:
        next_eval = time.monotonic() + (eval_every_s if eval_every_s > 0 else float("inf"))
        while not self._stop.wait(POLL_S):
            self.poll_once(shards)
            if evaluate is not None and time.monotonic() >= next_eval:
                next_eval = time.monotonic() + eval_every_s
                self._evaluate(evaluate)

    def poll_once(self, shards: Any) -> None:
        """One read of every shard's feed (the rows since the last read), folded into the board."""
        import ray

        with self._polling:
            feeds = self._feeds or [("", 0, 0)] * len(shards.handles)
            began = time.perf_counter()
            try:
                calls = [h.status_feed.remote(*feed) for h, feed in zip(shards.handles, feeds, strict=True)]
                got = ray.get(calls, timeout=10)
            except Exception:  # the syncer restarting, or not answering
                got = None
            self.poll_seconds += time.perf_counter() - began
            self.polls += 1
            assert self.board is not None
            with self._lock:
                if got is None:
                    self.board.poll(None, now=time.time())
                    return
                for row in sorted((r for g in got for r in g["rows"]), key=lambda r: r.get("t", 0.0)):
                    self.board.observe(row)
                S = len(got)
                records = [{**r, "fragment": r["fragment"] * S + s} for s, g in enumerate(got) for r in g["records"]]
                for record in sorted(records, key=lambda r: r.get("at", 0.0)):  # (shard s's fragment p is p * S + s)
                    self.board.merged(record)
                each = [g["status"] for g in got]
                status = {
                    "live": sorted(set.intersection(*(set(s["live"]) for s in each))),
                    "finished": sorted(set.intersection(*(set(s["finished"]) for s in each))),
                }
                self.board.status_busy_s = sum(g["busy_s"] for g in got)  # what the page costs the syncer
                self.board.status_calls = sum(g["calls"] for g in got)
                self.board.status_cpu_s = sum(g["cpu_s"] for g in got)
                ages = [g["checkpoint_age_s"] for g in got if g["checkpoint_age_s"] is not None]
                self.board.poll(status, now=time.time(), checkpoint_age_s=max(ages) if ages else None)
            self._feeds = [(g["feed"], g["next"], g["merges"]) for g in got]

    def global_loss(self, shards: Any, cfg: Any, inputs: Any) -> float:
        """The validation loss of the syncer's global parameters now (evaluated on the monitor's CPU; the
        syncer's part, handing its parameters over, is timed in ``eval_fetch_s``)."""
        import torch

        from diloco.train.evaluation import evaluate_parameters

        began = time.perf_counter()
        named = shards.global_named_parameters()
        self.eval_fetch_s += time.perf_counter() - began
        return evaluate_parameters(inputs.model, named, inputs.val_batches, bf16=cfg.bf16, device=torch.device("cpu"))

    def _evaluate(self, evaluate: Callable[[], float]) -> None:
        try:
            loss = float(evaluate())
        except Exception:  # the syncer restarting: the next evaluation tries again
            return
        self._add_loss(loss)

    def _add_loss(self, loss: float) -> None:
        assert self.board is not None and self.out is not None
        with self._lock:
            self.board.loss(t=time.time(), loss=loss)
            t, tokens, value = self.board.losses[-1]
        with open(self.out / LOSS_FILE, "a", encoding="utf-8") as fh:
            fh.write(json.dumps({"t": t, "tokens": tokens, "loss": value}, allow_nan=False) + "\n")

    def finish(self, shards: Any, *, final_loss: float | None = None) -> None:
        """The run ended (its syncer still up): stop polling, take a last read, add the loss of the final
        parameters, and write ``status.json`` and ``status.html`` (the page as the run ended) to the run's
        folder."""
        if self.board is None or self.out is None:
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        self.poll_once(shards)
        if final_loss is not None:
            self._add_loss(final_loss)
        with self._lock:
            self.board.ended = True
        from diloco.files import atomic_write_bytes, write_json

        snap = self.snapshot()
        snap["monitor"] = {"polls": self.polls, "poll_s": self.poll_seconds, "eval_fetch_s": self.eval_fetch_s}
        write_json(self.out / "status.json", snap)
        atomic_write_bytes(self.out / "status.html", render(snap).encode("utf-8"))

    def close(self) -> None:
        """Stop polling and serving (the socket is closed)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        if self.server is not None:
            self.server.stop()
        elif self.sock is not None:
            self.sock.close()


__all__ = ["LOSS_FILE", "PLOT_EVERY_S", "POLL_S", "REFRESH_S", "StatusPage"]
