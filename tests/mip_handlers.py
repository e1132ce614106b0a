"""Handlers the subprocess servers of the tests import (``--handler mip_handlers:NAME``)."""

from __future__ import annotations


async def reverse(batch):
    """Each sample's first input, reversed (proves every reply answers its own request)."""
    return [[sample[0].as_text()[::-1]] for sample in batch]


def reverse_sync(batch):
    """:func:`reverse` as a plain function (run in the server's thread pool)."""
    return [[sample[0].as_text()[::-1]] for sample in batch]
