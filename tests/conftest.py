"""Fixtures shared by the whole test session."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def token_cache(tmp_path_factory) -> Path:
    """One tokenizer and token cache for the session (the tiny preset's, built here once).

    Every test that trains on the bundled corpus passes it as ``cache_dir``, so no test
    rebuilds a tokenizer another one already built (a build takes ~10 s of CPU). Under
    pytest-xdist the first worker to ask builds it once, in the run's shared temporary folder
    (the others wait on a file lock), and each worker gets its own copy, as if it had built it.
    """
    path = tmp_path_factory.mktemp("token-cache")
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        _build_token_cache(path)
        return path
    import fcntl
    import shutil

    shared = tmp_path_factory.getbasetemp().parent / "token-cache-shared"  # the run's, beside each worker's
    with open(f"{shared}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when closed (or when its worker dies)
        done = Path(f"{shared}.done")
        if not done.exists():
            shutil.rmtree(shared, ignore_errors=True)  # a build a dead worker left half-written
            _build_token_cache(shared)
            done.touch()
    shutil.copytree(shared, path, dirs_exist_ok=True)
    return path


def _build_token_cache(path: Path) -> None:
    from diloco.data import prepare_tokens
    from diloco.train.config import TrainConfig, load_preset

    cfg = TrainConfig.from_dict(load_preset("tiny")["base"])
    prepare_tokens(cfg.sources, cfg.vocab_size, path, val_fraction=cfg.val_fraction)


# -- one local Ray instance for the tests that ask for it -------------------------------------------------------------
_RAY_MODULES: set[str] = set()  # the test modules (paths) that use ``local_ray``, as collected


def _module(item: pytest.Item) -> str:
    return item.nodeid.split("::")[0]


def pytest_collection_modifyitems(config, items: list[pytest.Item]) -> None:
    """The modules whose tests use ``local_ray`` run one after another (from where the first of them stood, each in
    its own order), so that they share one Ray instance instead of starting one each (~3.5 s a start and stop); under
    pytest-xdist each worker keeps that order among the tests it is given."""
    _RAY_MODULES.clear()
    _RAY_MODULES.update(_module(i) for i in items if "local_ray" in getattr(i, "fixturenames", ()))
    if len(_RAY_MODULES) > 1:
        first = next(n for n, i in enumerate(items) if _module(i) in _RAY_MODULES)
        moved = [i for i in items if _module(i) in _RAY_MODULES]
        items[first:] = moved + [i for i in items[first:] if _module(i) not in _RAY_MODULES]


def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """After the last test of those modules Ray is shut down: every other test runs in a process with no Ray
    instance (some start or join one of their own, or check what a process without one does)."""
    ray = sys.modules.get("ray")
    if _module(item) in _RAY_MODULES and (nextitem is None or _module(nextitem) not in _RAY_MODULES):
        if ray is not None and ray.is_initialized():
            ray.shutdown()


@pytest.fixture(scope="session")
def _ray_instance(tmp_path_factory):
    """Starts, when called, the session's local Ray instance if none runs (again after it was shut down)."""
    ray = pytest.importorskip("ray")
    temp = tmp_path_factory.mktemp("ray")

    def start() -> str:
        if not ray.is_initialized():
            from diloco.decoupled.ray_start import start_ray

            start_ray(  # as diloco's own starts of Ray: Ray's start-up timeouts on a busy machine retried
                None,
                num_cpus=2,
                include_dashboard=False,
                namespace="diloco-test",
                log_to_driver=False,
                _temp_dir=str(temp),
            )
        return ray.get_runtime_context().gcs_address

    yield start
    if ray.is_initialized():
        ray.shutdown()


@pytest.fixture
def local_ray(_ray_instance) -> str:
    """A local Ray instance of 2 CPUs (token authentication as Ray's environment sets it), shared by the tests of
    every module that asks for it; its GCS address. Each test names its own actors (and kills them): nothing of one
    test is found by another."""
    return _ray_instance()
