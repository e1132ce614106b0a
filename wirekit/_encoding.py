"""Argument checks shared by every encoder, in both twins.

The pure codecs call these directly; the Cython twins take their own fast path for good
values and call these for anything else, so the error text of a bad value is written once.
"""

from __future__ import annotations

from typing import Any

from wirekit.errors import EncodeError


def checked_int(protocol: str, value: Any, field: str, top: int) -> int:
    """``value`` if it is an int in ``0..top``; else EncodeError naming ``field``."""
    if not isinstance(value, int):
        raise EncodeError(protocol, field, f"expected an int, got {type(value).__name__}")
    if not 0 <= value <= top:
        raise EncodeError(protocol, field, f"{value} is out of range 0..{top}")
    return value


def contiguous_bytes(protocol: str, data: Any, field: str) -> memoryview:
    """``data`` as a flat byte view if it is a C-contiguous buffer; else EncodeError."""
    try:
        view = memoryview(data)
    except TypeError:
        view = None
    if view is None or not view.c_contiguous:
        raise EncodeError(
            protocol, field, f"expected a contiguous bytes-like object, got {type(data).__name__}"
        )
    return view.cast("B") if view.format != "B" or view.ndim != 1 else view
