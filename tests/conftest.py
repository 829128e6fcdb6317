"""Fixtures shared by the whole test session."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def token_cache(tmp_path_factory) -> Path:
    """One tokenizer and token cache for the session (the tiny preset's, built here once).

    Every test that trains on the bundled corpus passes it as ``cache_dir``, so no test
    rebuilds a tokenizer another one already built (a build takes seconds to minutes).
    """
    from diloco.data import prepare_tokens
    from diloco.train.config import TrainConfig, load_preset

    cfg = TrainConfig.from_dict(load_preset("tiny")["base"])
    path = tmp_path_factory.mktemp("token-cache")
    prepare_tokens(cfg.sources, cfg.vocab_size, path, val_fraction=cfg.val_fraction)
    return path


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
