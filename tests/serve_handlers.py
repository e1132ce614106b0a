"""Handlers for the ``wirekit mip serve`` subprocesses of the serve tests
(``--handler serve_handlers:NAME``): each answers ``"<tag>:<INPUT UPPERCASED>"``."""

from __future__ import annotations

import asyncio


def _answer(tag, batch):
    return [[f"{tag}:{sample[0].as_text().upper()}"] for sample in batch]


async def tag_a(batch):
    await asyncio.sleep(0.005)  # keeps a few requests in flight at any moment
    return _answer("A", batch)


async def tag_b(batch):
    await asyncio.sleep(0.005)
    return _answer("B", batch)


async def tag_fast(batch):
    return _answer("F", batch)


async def tag_slow(batch):
    await asyncio.sleep(0.2)  # requests stay in flight while a removal drains them
    return _answer("S", batch)
