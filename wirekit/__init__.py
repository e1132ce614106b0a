"""wirekit: codecs, runtimes and tools for the wire protocols of ML serving and training.

Each protocol lives in its own subpackage (``wirekit.mip``, ...).  Its codec is implemented
twice: a Cython twin in ``wirekit._fast`` for speed and a pure-Python path built on the
``construct`` spec.  ``wirekit.IMPLEMENTATION`` says which one the facades use: ``"fast"``
normally, ``"pure"`` when ``WIREKIT_PURE=1`` or when the extensions were not built.
"""

from __future__ import annotations

from wirekit.errors import DecodeError, EncodeError, WirekitError

__version__ = "0.1.0"

__all__ = ["IMPLEMENTATION", "DecodeError", "EncodeError", "WirekitError", "__version__"]


def __getattr__(name: str) -> str:
    if name == "IMPLEMENTATION":
        from wirekit import mip

        return mip.IMPLEMENTATION
    raise AttributeError(f"module 'wirekit' has no attribute {name!r}")
