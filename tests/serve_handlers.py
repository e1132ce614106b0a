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


#: CPU time each request of :func:`burn` spends, seconds
BURN_SECONDS = 0.004


def burn(batch):
    """Burns :data:`BURN_SECONDS` of CPU time per sample (a sync handler: run in threads),
    so its throughput is what its cgroup lets it have; answers ``"burnt:<INPUT>"``."""
    import time

    for _ in batch:
        start = time.thread_time()
        while time.thread_time() - start < BURN_SECONDS:
            pass
    return _answer("burnt", batch)


#: the file :func:`record_slow` appends each input it receives to (an environment variable,
#: set for the backend process)
RECEIVED_ENV = "WIREKIT_TEST_RECEIVED"


async def record_slow(batch):
    """Writes each sample's input to the file named by ``$WIREKIT_TEST_RECEIVED`` (one line
    each, written before it waits) -- what reached the backend -- then holds the requests
    0.3 s, so that some are at the backend at any moment; answers ``"R:<INPUT UPPERCASED>"``."""
    import os

    texts = "".join(f"{sample[0].as_text()}\n" for sample in batch)
    with open(os.environ[RECEIVED_ENV], "a", encoding="utf-8") as fh:
        fh.write(texts)
    await asyncio.sleep(0.3)
    return _answer("R", batch)


#: seconds :func:`held_when_slow` holds a request whose input starts with "slow"
HELD_SECONDS = 3.0


async def held_when_slow(batch):
    """Answers ``"H:<INPUT>"`` at once, or after :data:`HELD_SECONDS` when an input starts
    with ``slow`` (requests stay in flight while their client goes away)."""
    if any(sample[0].as_text().startswith("slow") for sample in batch):
        await asyncio.sleep(HELD_SECONDS)
    return _answer("H", batch)
