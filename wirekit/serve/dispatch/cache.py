"""A bounded LRU response cache with a TTL, keyed by model + a digest of the input.

The input's canonical form is its MIP encoding, so the same input gives the same key whether
it came through the MIP front door or as JSON over HTTP.  Bounded by entry count and by total
bytes; an entry older than ``ttl`` seconds is a miss (and is dropped).
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Generic, TypeVar

V = TypeVar("V")


def digest(data: bytes | bytearray | memoryview) -> bytes:
    """The 16-byte BLAKE2b digest used for cache keys."""
    return hashlib.blake2b(data, digest_size=16).digest()


class ResponseCache(Generic[V]):
    """``get(model, key)`` / ``put(model, key, value, size)``; ``hits``/``misses`` count."""

    def __init__(
        self,
        max_entries: int = 4096,
        ttl: float = 60.0,
        max_bytes: int = 64 * 1024 * 1024,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_entries = max_entries
        self.ttl = ttl
        self.max_bytes = max_bytes
        self._clock = clock
        self._data: OrderedDict[tuple[str, bytes], tuple[float, int, V]] = OrderedDict()
        self.bytes = 0
        self.hits = 0
        self.misses = 0
        self.evictions = 0
        #: model -> [hits, misses] of its lookups
        self.by_model: dict[str, list[int]] = {}

    @property
    def enabled(self) -> bool:
        return self.max_entries > 0

    def __len__(self) -> int:
        return len(self._data)

    def get(self, model: str, key: bytes) -> V | None:
        """The cached value, or None (a miss) if absent or expired."""
        entry = self._data.get((model, key))
        if entry is not None:
            expires, size, value = entry
            if expires > self._clock():
                self._data.move_to_end((model, key))
                self.hits += 1
                self._counts(model)[0] += 1
                return value
            del self._data[(model, key)]
            self.bytes -= size
        self.misses += 1
        self._counts(model)[1] += 1
        return None

    def _counts(self, model: str) -> list[int]:
        counts = self.by_model.get(model)
        if counts is None:
            counts = self.by_model[model] = [0, 0]
        return counts

    def put(self, model: str, key: bytes, value: V, size: int) -> None:
        """Store ``value`` (``size`` bytes) and evict the least recently used beyond bounds."""
        if not self.enabled or size > self.max_bytes:
            return
        old = self._data.pop((model, key), None)
        if old is not None:
            self.bytes -= old[1]
        self._data[(model, key)] = (self._clock() + self.ttl, size, value)
        self.bytes += size
        while len(self._data) > self.max_entries or self.bytes > self.max_bytes:
            _, (_, dropped, _) = self._data.popitem(last=False)
            self.bytes -= dropped
            self.evictions += 1

    def stats(self) -> dict[str, Any]:
        return {
            "hits": self.hits,
            "misses": self.misses,
            "entries": len(self._data),
            "bytes": self.bytes,
            "evictions": self.evictions,
            "models": {
                m: {"hits": hits, "misses": misses}
                for m, (hits, misses) in sorted(self.by_model.items())
            },
        }
