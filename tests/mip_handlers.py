"""Handlers the subprocess servers of the tests import (``--handler mip_handlers:NAME``)."""

from __future__ import annotations


async def reverse(batch):
    """Each sample's first input, reversed (proves every reply answers its own request)."""
    return [[sample[0].as_text()[::-1]] for sample in batch]


def reverse_sync(batch):
    """:func:`reverse` as a plain function (run in the server's thread pool)."""
    return [[sample[0].as_text()[::-1]] for sample in batch]


def fail_with_a_forged_line(batch):
    """Raises, its message holding a line break and what would pass for a log line after it
    (the log must show it inside the traceback, never as a line of its own)."""
    raise RuntimeError("the model broke\n2030-01-01T00:00:00.000+00:00 ERROR forged: line")
