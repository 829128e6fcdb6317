"""What goes on the wire between replicas: the codecs' formats and their exact sizes.

A leaf package: it imports no other ``diloco`` package (only top-level modules such as
:mod:`diloco.errors`), so the communicators (:mod:`diloco.comm`) and the algorithms
(:mod:`diloco.algorithm`) both build on it. Lazy: ``diloco.wire.sizes`` is torch-free, and importing
this package loads neither torch nor the other modules.
"""

from diloco._lazy import lazy_exports

_EXPORTS: dict[str, str] = {}

__getattr__, __dir__, __all__ = lazy_exports(__name__, _EXPORTS, globals())
