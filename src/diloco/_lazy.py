"""Lazy package exports (PEP 562): a name is imported from its module on first use.

A package's ``__init__`` declares ``name -> module`` and gets ``__getattr__``, ``__dir__`` and
``__all__``; importing the package itself imports nothing else, so ``import diloco.sim`` or
``import diloco.traffic`` never loads torch, while ``from diloco import StreamingDiLoCo`` works.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(
    package: str,
    exports: Mapping[str, str],
    namespace: dict[str, Any],
) -> tuple[Callable[[str], Any], Callable[[], list[str]], list[str]]:
    """``(__getattr__, __dir__, __all__)`` for ``package``, whose name ``n`` lives in module ``exports[n]``.

    Module paths starting with ``.`` are relative to ``package``. An imported name is cached in the package's
    ``namespace`` so ``__getattr__`` runs once per name.
    """

    def __getattr__(name: str) -> Any:
        if name in exports:
            value = getattr(importlib.import_module(exports[name], package), name)
        else:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(exports))

    return __getattr__, __dir__, sorted(exports)
