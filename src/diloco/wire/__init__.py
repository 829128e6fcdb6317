"""What goes on the wire between replicas: the codecs, their exact sizes, and error feedback.

:mod:`.codec` is the interface (and its rounding, non-finite and speed rules), :mod:`.floats` and
:mod:`.scaled` the wire formats, :mod:`.compress` the compressing codecs sent with error feedback
(:mod:`.error_feedback`), :mod:`.registry` the names (:func:`get_codec`), :mod:`.sizes` the byte counts,
:mod:`.average` the FP32 average of the replicas' payloads.

A leaf package: it imports no other ``diloco`` package (only top-level modules such as
:mod:`diloco.errors`), so the communicators (:mod:`diloco.comm`) and the algorithms
(:mod:`diloco.algorithm`) both build on it. Lazy: ``diloco.wire.sizes`` is torch-free, and importing
this package loads neither torch nor the other modules.
"""

from diloco._lazy import lazy_exports

_EXPORTS = {
    "Codec": ".codec",
    "CHUNK": ".codec",
    "all_finite": ".codec",
    "use_chunks": ".codec",
    "FP32Codec": ".floats",
    "BF16Codec": ".floats",
    "BlockScaledCodec": ".scaled",
    "FP8E4M3Codec": ".scaled",
    "Int8Codec": ".scaled",
    "FP4Codec": ".scaled",
    "FP4E3M0Codec": ".scaled",
    "FP4E2M1Codec": ".scaled",
    "StatisticalCodec": ".compress",
    "TopKCodec": ".compress",
    "CODEC_NAMES": ".registry",
    "COMPRESSING_CODECS": ".registry",
    "ALL_CODEC_NAMES": ".registry",
    "get_codec": ".registry",
    "ErrorFeedback": ".error_feedback",
    "average_payloads": ".average",
}

__getattr__, __dir__, __all__ = lazy_exports(__name__, _EXPORTS, globals())
