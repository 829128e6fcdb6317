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
    pytest-xdist each worker keeps that order among the tests it is given, and the heavy tests go first
    (:func:`_heavy_first`)."""
    _RAY_MODULES.clear()
    _RAY_MODULES.update(_module(i) for i in items if "local_ray" in getattr(i, "fixturenames", ()))
    if len(_RAY_MODULES) > 1:
        first = next(n for n, i in enumerate(items) if _module(i) in _RAY_MODULES)
        moved = [i for i in items if _module(i) in _RAY_MODULES]
        items[first:] = moved + [i for i in items[first:] if _module(i) not in _RAY_MODULES]
    workers = int(getattr(config, "workerinput", {}).get("workercount", 1))
    if workers > 1:
        items[:] = _heavy_first(items, workers)


#: Where a module's tests start processes (torchrun jobs, site jobs, Ray actors): with the tests marked ``slow`` and
#: the modules sharing the Ray instance, a module "heavy" as a whole (its module fixtures stay on one worker).
_HEAVY_DIRS = ("tests/distributed/",)
#: Seconds each heavy module took in a fresh clone's `make test` on 2 cores (AMD EPYC, 2026-11), its tests' walls
#: summed: the weights by which :func:`_heavy_first` shares them out. A heavy module not named here weighs 10 s a
#: test marked slow and 2 s any other; a weight off by some seconds costs only some balance, never a test.
_SECONDS = {
    "tests/distributed/test_train_torchrun.py": 78,
    "tests/integration/test_decoupled_ray.py": 77,
    "tests/integration/test_site_faults.py": 66,
    "tests/distributed/test_train_fsdp.py": 58,
    "tests/integration/test_site_jobs.py": 50,
    "tests/distributed/test_elastic.py": 47,
    "tests/integration/test_syncer_shards_ray.py": 35,
    "tests/integration/test_speed.py": 26,
    "tests/integration/test_site_budget.py": 20,
    "tests/integration/test_claims_restart.py": 18,
    "tests/integration/test_user_model_data.py": 17,
    "tests/distributed/test_launch.py": 14,
}


def _heavy_first(items: list[pytest.Item], workers: int) -> list[pytest.Item]:
    """The order that starts every xdist worker on heavy tests and leaves the quick ones for the end, where the
    workers steal them from each other to finish together. pytest-xdist hands worker w the w-th of ``workers``
    consecutive chunks of the collection (``--dist load`` and ``worksteal`` alike: the pending tests split evenly,
    in order); so the modules sharing the Ray instance go at the head of the first chunk, each other heavy module,
    heaviest first, to the head of the chunk whose heavy seconds are fewest so far (:data:`_SECONDS`), and the quick
    tests fill each chunk to its size. Measured on 2 cores before: the site-faults and compiled runs started in the
    last minute and the cores were 89 % busy over the run. Every worker computes the same order (xdist checks)."""
    by_module: dict[str, list[pytest.Item]] = {}
    for item in items:
        by_module.setdefault(_module(item), []).append(item)

    def seconds(module: str) -> float:
        tests = by_module[module]
        return _SECONDS.get(module, sum(10 if i.get_closest_marker("slow") else 2 for i in tests))

    heavy = [
        m
        for m, tests in by_module.items()
        if m.startswith(_HEAVY_DIRS) or any(i.get_closest_marker("slow") for i in tests)
    ]
    heads: list[list[pytest.Item]] = [[] for _ in range(workers)]
    load = [0.0] * workers
    heads[0] = [i for i in items if _module(i) in _RAY_MODULES]
    load[0] = sum(seconds(m) for m in _RAY_MODULES if m in by_module)
    for module in sorted((m for m in heavy if m not in _RAY_MODULES), key=lambda m: (-seconds(m), m)):
        w = min(range(workers), key=lambda k: (load[k], k))
        heads[w] += by_module[module]
        load[w] += seconds(module)
    placed = {id(i) for head in heads for i in head}
    quick = [i for i in items if id(i) not in placed]
    order: list[pytest.Item] = []
    remaining = len(items)
    for w in range(workers):
        size = remaining // (workers - w)  # as xdist sizes each worker's first share
        fill = max(0, size - len(heads[w]))
        order += heads[w] + quick[:fill]
        quick = quick[fill:]
        remaining -= len(heads[w]) + fill
    return order + quick


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
