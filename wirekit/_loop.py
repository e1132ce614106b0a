"""Which event loop the runtime commands (``wirekit mip serve``, ``wirekit serve``) run on.

``asyncio`` always works.  ``uvloop`` (optional: ``pip install uvloop`` or the ``uvloop``
extra) is a libuv-based drop-in loop that cuts the per-request cost of the event loop
itself; ``auto`` (the default) uses it when it is installed.  ``WIREKIT_LOOP`` in the
environment overrides the default.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")
CHOICES = ("auto", "asyncio", "uvloop")


def resolve(choice: str | None = None) -> str:
    """``"asyncio"`` or ``"uvloop"``: what ``choice`` (or ``WIREKIT_LOOP``, or auto) means
    here.  Asking for uvloop when it is not installed raises ``ValueError``."""
    choice = (choice or os.environ.get("WIREKIT_LOOP") or "auto").strip().lower()
    if choice not in CHOICES:
        raise ValueError(f"event loop must be one of {', '.join(CHOICES)}, not {choice!r}")
    if choice == "asyncio":
        return "asyncio"
    try:
        import uvloop  # noqa: F401
    except ImportError:
        if choice == "uvloop":
            raise ValueError(
                "the uvloop event loop needs the 'uvloop' extra: pip install 'wirekit[uvloop]'"
            ) from None
        return "asyncio"
    return "uvloop"


def run(main: Coroutine[Any, Any, T], choice: str | None = None) -> T:
    """``asyncio.run(main)`` on the chosen loop.  When the choice cannot be had (ValueError,
    as :func:`resolve`), ``main`` is closed unstarted."""
    try:
        chosen = resolve(choice)
    except BaseException:
        main.close()  # never awaited, on purpose: no warning saying it was forgotten
        raise
    if chosen == "uvloop":
        import uvloop

        # uvloop's own runner: asyncio.Runner on Python 3.11+, a loop policy on 3.10
        return uvloop.run(main)
    return asyncio.run(main)
