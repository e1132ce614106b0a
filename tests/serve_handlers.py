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


#: the store path whose journals :func:`journal_seen` reads (an environment variable, set for
#: the backend process)
JOURNAL_ENV = "WIREKIT_TEST_JOURNAL"
_journaled: dict[str, tuple[int, set[str]]] = {}  # journal file -> (bytes read, inputs seen)


def _journaled_inputs(store: str) -> set[str]:
    """The inputs of every arrival record in the journals of ``store`` so far (read on from
    where the last call stopped; a line not complete yet is read next time)."""
    import base64
    import glob
    import json

    from wirekit import mip

    seen: set[str] = set()
    for path in glob.glob(glob.escape(store) + ".journal.*"):
        if not path.rsplit(".", 1)[1].isdigit():
            continue
        offset, texts = _journaled.get(path, (0, set()))
        with open(path, "rb") as fh:
            fh.seek(offset)
            for line in fh:
                if not line.endswith(b"\n"):
                    break
                offset += len(line)
                record = json.loads(line)
                if record[6] == "queued" and record[9]:
                    texts.add(mip.decode(base64.b64decode(record[9])).items[0].as_text())
        _journaled[path] = (offset, texts)
        seen |= texts
    return seen


async def journal_seen(batch):
    """Answers ``"J:<INPUT UPPERCASED>"`` when the arrival record of the request was in the
    dispatcher's journal (store ``$WIREKIT_TEST_JOURNAL``, payloads on) when the request
    arrived here, else ``"UNJOURNALED:<INPUT>"``; then holds it 10 ms (a few in flight)."""
    import os

    seen = _journaled_inputs(os.environ[JOURNAL_ENV])
    texts = [sample[0].as_text() for sample in batch]
    await asyncio.sleep(0.01)
    return [[f"J:{t.upper()}" if t in seen else f"UNJOURNALED:{t}"] for t in texts]


#: seconds :func:`held_when_slow` holds a request whose input starts with "slow"
HELD_SECONDS = 3.0


async def held_when_slow(batch):
    """Answers ``"H:<INPUT>"`` at once, or after :data:`HELD_SECONDS` when an input starts
    with ``slow`` (requests stay in flight while their client goes away)."""
    if any(sample[0].as_text().startswith("slow") for sample in batch):
        await asyncio.sleep(HELD_SECONDS)
    return _answer("H", batch)
