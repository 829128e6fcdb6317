"""Benchmarks and studies import what they share from ``src/`` (the installed package), never by editing
``sys.path``; and no benchmark, study or test imports a private name of the package."""

import ast
from pathlib import Path

ROOT = Path(__file__).parents[2]

#: files left to their owners' open work, each with why
SYS_PATH_ALLOWED = {
    "studies/decoupled-quorum/guard_check.py",  # the decoupled-quorum study is being rewritten beside this
}


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


def test_the_checks_see_an_edit_and_a_private_import():
    tree = ast.parse("import sys\nsys.path.insert(0, 'x')\nsys.path = []\nfrom diloco.files import _FILE_MODE, ok\n")
    assert sorted(_sys_path_edits(tree)) == [2, 3]
    assert _private_imports(tree) == ["4: from diloco.files import _FILE_MODE"]


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
