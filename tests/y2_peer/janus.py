"""A stand-in for the ``janus`` package, only as much as y2's ``Communication`` uses.

y2's worker pins janus 0.4 (``janus.Queue(loop=...)``), which no longer runs on the Python
versions wirekit supports (it passes ``loop=`` to asyncio primitives, removed in 3.10); the
janus of today has no ``loop`` argument.  This module gives y2's class, run unchanged, the
interface it calls: ``Queue(loop=None)`` with ``sync_q.put_nowait / get_nowait / empty`` and
``async_q.get``.  Written for these tests; it is not janus's code.
"""

from __future__ import annotations

import asyncio
import collections
import queue
import threading


class _SyncSide:
    def __init__(self, parent: Queue) -> None:
        self._parent = parent

    def put_nowait(self, item: object) -> None:
        self._parent._put(item)

    def get_nowait(self) -> object:
        with self._parent._lock:
            if not self._parent._items:
                raise queue.Empty
            return self._parent._items.popleft()

    def empty(self) -> bool:
        with self._parent._lock:
            return not self._parent._items


class _AsyncSide:
    def __init__(self, parent: Queue) -> None:
        self._parent = parent

    async def get(self) -> object:
        parent = self._parent
        loop = asyncio.get_running_loop()
        while True:
            with parent._lock:
                if parent._items:
                    return parent._items.popleft()
                waiter = loop.create_future()
                parent._waiters.append((loop, waiter))
            await waiter


class Queue:
    def __init__(self, maxsize: int = 0, *, loop: object = None) -> None:
        self._items: collections.deque[object] = collections.deque()
        self._lock = threading.Lock()
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future]] = []
        self.sync_q = _SyncSide(self)
        self.async_q = _AsyncSide(self)

    def _put(self, item: object) -> None:
        with self._lock:
            self._items.append(item)
            waiters, self._waiters = self._waiters, []
        for loop, waiter in waiters:
            loop.call_soon_threadsafe(_wake, waiter)


def _wake(waiter: asyncio.Future) -> None:
    if not waiter.done():
        waiter.set_result(None)
