"""The packages' import graph: which package may import which (read from the source, every import counted,
those inside functions too).

The trainer drives a method through :mod:`diloco.train.runtime`; :mod:`diloco.decoupled` plugs into it, so
``decoupled`` may import ``train`` and never the other way. No two packages may import each other.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "src" / "diloco"


def _module(path: Path) -> list[str]:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return parts[:-1] if parts[-1] == "__init__" else parts


def _imports(path: Path) -> set[str]:
    """The ``diloco`` modules ``path`` imports, anywhere in the file."""
    here = _module(path)
    package = here if path.name == "__init__.py" else here[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                found.add(".".join(base + ([node.module] if node.module else [])))
            else:
                found.add(node.module or "")
    return {name for name in found if name == "diloco" or name.startswith("diloco.")}


def package_graph() -> dict[str, set[str]]:
    """Package -> the packages its modules import (top-level modules such as ``diloco.errors`` are not packages)."""
    packages = {p.name for p in ROOT.iterdir() if (p / "__init__.py").exists()}
    graph: dict[str, set[str]] = {name: set() for name in packages}
    for path in ROOT.rglob("*.py"):
        mod = _module(path)
        if len(mod) < 2 or mod[1] not in packages:
            continue
        for name in _imports(path):
            parts = name.split(".")
            if len(parts) > 1 and parts[1] in packages and parts[1] != mod[1]:
                graph[mod[1]].add(parts[1])
    return graph


def test_the_graph_is_read_from_the_source():
    graph = package_graph()
    assert "train" in graph["decoupled"], "decoupled plugs into the trainer: it imports diloco.train"
    assert {"algorithm", "comm", "train", "decoupled", "data", "models"} <= set(graph)


def test_train_never_imports_decoupled():
    graph = package_graph()
    assert "decoupled" not in graph["train"], "diloco.train must reach decoupled through diloco.train.runtime only"


def test_no_two_packages_import_each_other():
    graph = package_graph()
    cycles = sorted(sorted({a, b}) for a in graph for b in graph[a] if a in graph.get(b, ()) and a < b)
    assert cycles == [], f"packages that import each other: {cycles}"


def test_wire_is_a_leaf_that_comm_and_algorithm_build_on():
    """What goes on the wire (codecs, sizes, error feedback, the FP32 average) imports no other package, only
    top-level modules such as ``diloco.errors``; the communicators encode with it and never import the
    algorithms, which drive them."""
    graph = package_graph()
    assert graph["wire"] == set(), f"diloco.wire imports other packages: {sorted(graph['wire'])}"
    assert "wire" in graph["comm"] and "wire" in graph["algorithm"]
    assert "algorithm" not in graph["comm"], "diloco.comm must not import diloco.algorithm"


def test_the_decoupled_runtime_is_a_plugin_of_the_trainer():
    from diloco.train.runtime import PLUGINS, MethodRuntime, runtime_for

    assert set(PLUGINS) == {"decoupled"}
    assert isinstance(runtime_for("decoupled"), MethodRuntime)
    assert type(runtime_for("dp")) is MethodRuntime  # the synchronous methods: nothing beside the replicas
