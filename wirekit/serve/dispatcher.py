"""The dispatcher core: one request in, one answer out, everything recorded.

For each request :meth:`Dispatcher.submit`:

1. gives it an id and queues its arrival row (model, client, time in, payload size);
2. answers from the cache when the same input to the same model was answered recently;
3. otherwise picks a device by quota and forwards the request; if the attempt times out or
   the device refuses, the device is backed off and the request goes to another one, up to
   the model's attempt limit;
4. records the time out and status (journaled before the answer, see
   :mod:`wirekit.serve.store`) and returns exactly one :class:`Outcome`.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass

from wirekit.mip import ErrorCode, ErrorReply, Inference

from .backends import Backend, BackendUnavailable
from .cache import ResponseCache, digest
from .config import ModelConfig
from .metrics import Metrics
from .payload import Payload
from .router import NoDevice, Router
from .store import ERROR, FAILED, OK, RequestStore

log = logging.getLogger("wirekit.serve")


async def _infer_within(backend: Backend, request: Payload, timeout: float) -> Payload:
    if getattr(backend, "timeout", None) == timeout and getattr(backend, "enforces_timeout", 0):
        return await backend.infer(request)  # its own deadline raises TimeoutError
    if sys.version_info >= (3, 11):
        async with asyncio.timeout(timeout):
            return await backend.infer(request)
    return await asyncio.wait_for(backend.infer(request), timeout)  # pragma: no cover


class UnknownModel(LookupError):
    """A request names a model the deployment does not serve."""


@dataclass(frozen=True, slots=True)
class Outcome:
    """The one answer to a request."""

    id: str
    status: str  #: "ok", "error" (the backend answered with an error) or "failed"
    response: Payload  #: the MIP answer (an error reply unless status is "ok")
    device: str | None  #: the row key that answered, "cache", or None
    attempts: int
    detail: str = ""  #: why it failed, for humans

    @property
    def ok(self) -> bool:
        return self.status == OK


def _error_payload(code: ErrorCode) -> Payload:
    msg = ErrorReply(int(code))
    return Payload(None, msg)


class Dispatcher:
    """Routes requests over backends, with store, metrics, cache and resubmission."""

    def __init__(
        self,
        models: Mapping[str, ModelConfig],
        router: Router,
        backends: Mapping[str, Backend],
        store: RequestStore,
        metrics: Metrics,
        cache: ResponseCache[Payload],
        *,
        clock=time.time,
    ) -> None:
        self.models = dict(models)
        self.router = router
        self.backends = dict(backends)
        self.store = store
        self.metrics = metrics
        self.cache = cache
        self._clock = clock
        self._ids = itertools.count(1)
        self._prefix = f"{int(time.time()):x}{os.getpid():x}{os.urandom(2).hex()}-"
        self.resubmissions = 0

    def new_id(self) -> str:
        return f"{self._prefix}{next(self._ids):x}"

    async def submit(
        self, model: str, request: Payload, client: str, *, defer_journal: bool = False
    ) -> Outcome:
        """Answer one request (see the module docstring).  Raises :class:`UnknownModel`.

        ``defer_journal``: the completion record is not written to the journal yet; the
        caller calls ``store.write_journal()`` before it answers (see
        :meth:`RequestStore.completion`)."""
        cfg = self.models.get(model)
        if cfg is None:
            raise UnknownModel(model)
        rid = self.new_id()
        wire = request.wire
        t_in = self._clock()
        self.store.arrival(rid, model, client, t_in, len(wire), wire)
        self.metrics.arrived(model)
        try:
            outcome = await self._answer(rid, cfg, request, wire)
        except BaseException:
            # Cancelled (the client went away, or shutdown): still close the row.
            self._finish(model, rid, client, t_in, wire, None, FAILED, 0, False)
            raise
        self._finish(model, rid, client, t_in, wire, outcome.device, outcome.status,
                     outcome.attempts, defer_journal)
        return outcome

    def _finish(self, model, rid, client, t_in, wire, device, status, attempts, defer) -> None:
        t_out = self._clock()
        self.metrics.finished(model, status, t_out - t_in)
        self.store.completion(
            rid, device, t_out, status, attempts,
            model=model, client=client, time_in=t_in, size=len(wire), payload=wire,
            defer=defer,
        )

    async def _answer(self, rid: str, cfg: ModelConfig, request: Payload, wire: bytes):
        cache = self.cache
        key = None
        if cache.enabled:
            key = digest(memoryview(wire)[8:])
            hit = cache.get(cfg.name, key)
            if hit is not None:
                return Outcome(rid, OK, hit, "cache", 0)
        tried: list[str] = []
        last = ""
        for attempt in range(1, cfg.attempts + 1):
            try:
                row = self.router.choose(cfg.name, tried)
            except NoDevice as exc:
                last = last or str(exc)
                break
            tried.append(row.key)
            if attempt > 1:
                self.resubmissions += 1
            backend = self.backends[row.key]
            try:
                reply = await _infer_within(backend, request, cfg.timeout)
            except (asyncio.TimeoutError, TimeoutError):
                last = f"{row.key}: no answer within {cfg.timeout} s"
                log.warning("request %s: %s", rid, last)
                self.router.fail(row)
                continue
            except (BackendUnavailable, OSError) as exc:
                last = f"{row.key}: {exc}"
                log.warning("request %s: %s", rid, last)
                self.router.fail(row)
                continue
            self.router.succeed(row)
            msg = reply.message
            if isinstance(msg, Inference) and msg.response:
                if key is not None:
                    cache.put(cfg.name, key, reply, len(reply.wire))
                return Outcome(rid, OK, reply, row.key, attempt)
            return Outcome(rid, ERROR, reply, row.key, attempt, f"backend answered {msg}")
        return Outcome(
            rid, FAILED, _error_payload(ErrorCode.INTERNAL), None, len(tried),
            f"no device answered after {len(tried)} attempt(s): {last}",
        )

    async def close(self) -> None:
        for backend in self.backends.values():
            await backend.close()
