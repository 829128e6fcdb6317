"""Benchmarks and studies import what they share from ``src/`` (the installed package), never by editing
``sys.path``; no benchmark, study or test imports a private name of the package; and tests import what they
check from the package instead of loading a script by its file path."""

import ast
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]

#: files left to their owners' open work, each with why
SYS_PATH_ALLOWED: set[str] = set()

#: tests that load a script by path, each with why
LOAD_BY_PATH_ALLOWED = {
    # the docs' screenshot script drives a Chromium over the built site: a docs tool, not library code for src/
    "tests/integration/test_docs.py",
}

#: calls that load a Python file by its path
_LOADERS = {"spec_from_file_location", "run_path", "SourceFileLoader"}


def _py(*folders: str) -> list[Path]:
    return sorted(p for folder in folders for p in (ROOT / folder).rglob("*.py"))


def _sys_path_edits(tree: ast.AST) -> list[int]:
    """Lines that call a method of ``sys.path`` (insert, append, extend, remove) or assign to it."""
    out = []
    for node in ast.walk(tree):
        target = node.func.value if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) else None
        targets = node.targets if isinstance(node, ast.Assign) else [target] if target is not None else []
        for t in targets:
            if isinstance(t, ast.Attribute) and t.attr == "path" and getattr(t.value, "id", None) == "sys":
                out.append(node.lineno)
    return out


def _private_imports(tree: ast.AST) -> list[str]:
    return [
        f"{node.lineno}: from {node.module} import {alias.name}"
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "diloco"
        for alias in node.names
        if alias.name.startswith("_") and not alias.name.startswith("__")
    ]


def _loads_by_path(tree: ast.AST) -> list[int]:
    """Lines that call ``importlib.util.spec_from_file_location``, ``runpy.run_path`` or ``SourceFileLoader``
    (as attributes or imported names)."""
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and (getattr(node.func, "attr", None) in _LOADERS or getattr(node.func, "id", None) in _LOADERS)
    ]


def test_the_checks_see_an_edit_a_private_import_and_a_load_by_path():
    tree = ast.parse("import sys\nsys.path.insert(0, 'x')\nsys.path = []\nfrom diloco.files import _FILE_MODE, ok\n")
    assert sorted(_sys_path_edits(tree)) == [2, 3]
    assert _private_imports(tree) == ["4: from diloco.files import _FILE_MODE"]
    tree = ast.parse(
        "import importlib.util, runpy\nfrom runpy import run_path\n"
        "importlib.util.spec_from_file_location('m', 'benchmarks/x.py')\nrunpy.run_path('a.py')\nrun_path('b.py')\n"
        "importlib.import_module('diloco.bench')\n"
    )
    assert _loads_by_path(tree) == [3, 4, 5]


def test_no_sys_path_edits_in_benchmarks_or_studies():
    found = {
        str(p.relative_to(ROOT)): lines
        for p in _py("benchmarks", "studies")
        if (lines := _sys_path_edits(ast.parse(p.read_text())))
    }
    assert {k: v for k, v in found.items() if k not in SYS_PATH_ALLOWED} == {}


def test_no_private_names_imported_from_the_package():
    found = {
        str(p.relative_to(ROOT)): lines
        for p in _py("benchmarks", "studies", "tests")
        if (lines := _private_imports(ast.parse(p.read_text())))
    }
    assert found == {}


def test_no_test_loads_a_script_by_its_path():
    found = {
        str(p.relative_to(ROOT)): lines for p in _py("tests") if (lines := _loads_by_path(ast.parse(p.read_text())))
    }
    assert {k: v for k, v in found.items() if k not in LOAD_BY_PATH_ALLOWED} == {}
    assert set(LOAD_BY_PATH_ALLOWED) <= set(found), "an allowed file no longer loads by path: remove it from the list"


def test_a_study_script_imports_its_sibling_when_run_as_its_readme_says():
    """``PYTHONPATH=src python studies/decoupled-quorum/guard_check.py``: the script's own folder is first on the
    import path, so ``from run_study import ...`` resolves with no ``sys.path`` edit."""
    proc = subprocess.run(
        [sys.executable, "studies/decoupled-quorum/guard_check.py", "--help"],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "usage: guard_check.py" in proc.stdout
