"""The dispatcher core: one request in, one answer out, everything recorded.

For each request :meth:`Dispatcher.submit`:

1. gives it an id and queues its arrival row (model, client, time in, payload size); its
   arrival record goes to the journal before the request leaves for a backend -- group
   commit: the arrivals of one loop pass in one ``write``, then those requests are sent
   (:meth:`Dispatcher.start`, :meth:`Dispatcher.submit`; a lone request in flight at once);
2. answers from the cache when the same input to the same model was answered recently;
3. otherwise picks a device by quota and forwards the request; if the attempt times out or
   the device refuses, the device is backed off and the request goes to another one, up to
   the model's attempt limit;
4. records the time out and status (journaled before the answer, see
   :mod:`wirekit.serve.record.store`) and returns exactly one :class:`Outcome`.

A request whose arrival cannot be journaled (a full disk: the store raises
:class:`~wirekit.serve.record.store.JournalUnavailable`) is not sent anywhere: it ends
``failed`` at once (cause :data:`REFUSED`, reason :data:`JOURNAL_REFUSED`; its row goes to
the store through the writer), which every door answers as 503 / UNAVAILABLE / the MIP error
reply of a failed request, counted in :attr:`Dispatcher.refused` and logged once per burst.
A completion that cannot be journaled is answered all the same (logged once per burst).

Adaptive batching (a model's ``max_batch`` > 1, MIP backends, requests from any front door:
the MIP door's :meth:`Dispatcher.start` and the awaiting doors' :meth:`Dispatcher.submit`
alike): requests for the same device that arrive in one loop pass -- typically decoded from
one read of a pipelining client -- are not sent one by one but joined into one MIP batch
(their samples concatenated, up to ``max_batch`` samples and :data:`BATCH_BYTES` bytes; MIP
samples are independent; 16 samples or more go as two batches of about half each, so that
the first answers go back while the backend works on the second).  The reply is split
back into one reply per request, byte for byte what the backend answers for the request
alone.  A batch the backend answers with an error reply, or with a reply not shaped like
the batch, is not taken as the answer of its requests: each is sent again on its own (so
one bad request cannot fail the others).  A timeout or a lost connection fails every
request of the batch the way it fails a single one (resubmitted to another device).  Ids,
store rows, metrics, the cache and the attempt count stay per request.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import struct
import sys
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from functools import partial
from types import ModuleType
from typing import Any, TypeGuard

from wirekit import mip
from wirekit._impl import select
from wirekit.errors import DecodeError
from wirekit.mip import ErrorCode, ErrorReply, Inference
from wirekit.mip.client import unanswered_retryable
from wirekit.mip.runtime import decode_reply
from wirekit.oip.items import OipItem

from ..backends.remote import Backend, BackendUnavailable, BadRequest
from ..config import DeviceRow, ModelConfig
from ..control.metrics import DOOR_HTTP, DOOR_MIP, Metrics, ModelStats
from ..doors.fdwatch import BurstLog
from ..logs import serve_logger
from ..record.store import ABANDONED, ERROR, FAILED, OK, JournalUnavailable, RequestStore
from . import lane as pure_lane
from .cache import ResponseCache, digest
from .payload import Payload
from .router import NoDevice, Router

log = serve_logger()

#: the reason recorded for a request whose client went away before its answer
CLIENT_GONE = "the client went away before its answer"
#: :attr:`Outcome.cause` values (see there)
TIMED_OUT, UNAVAILABLE, BAD_REQUEST = "timeout", "unavailable", "bad request"
#: :attr:`Outcome.cause` of an ``error`` that is the model's own (its Open Inference Protocol
#: ERROR item): :attr:`Outcome.detail` is the model's message, for the client as it is
MODEL_ERROR = "model error"
#: :attr:`Outcome.cause` of a request refused before it was sent anywhere (503)
REFUSED = "refused"
#: the reason of a request refused because its arrival could not be journaled
JOURNAL_REFUSED = "refused: the request journal cannot be written"
#: the :attr:`Dispatcher.refused` key (``wirekit_serve_refused_total{reason="journal"}``)
REFUSED_JOURNAL = "journal"

BATCH_BYTES = 1 << 20  #: a joined batch stays under this many bytes (larger requests go alone)
SPLIT_SAMPLES = 16  #: requests joined to this many samples or more go as two batches
_HEAD = struct.Struct(">BBBBIBBH")  # MIP header + the inference counts
#: the item type of a model's error in the Open Inference Protocol mapping (specs/oip.md)
OIP_ERROR = int(OipItem.ERROR)


def join_requests(wires: list[bytes], n_input: int, samples: int) -> bytes:
    """One MIP inference request holding the samples of every request in ``wires`` (each
    an encoded inference request with ``n_input`` inputs per sample), in order."""
    body = sum(len(w) for w in wires) - 12 * len(wires)
    return b"".join(
        [
            _HEAD.pack(0, 2, 0, 0, 4 + body, n_input, 0, samples),
            *[memoryview(w)[12:] for w in wires],
        ]
    )


def split_reply(frame: bytes, msg: Inference, counts: list[int]) -> list[bytes] | None:
    """Split the reply ``frame`` (decoded: ``msg``) to a joined request into one reply per
    request of ``counts`` samples each; None when the reply does not have that shape."""
    n_out = msg.n_output
    items = msg.items
    if msg.batch_size != sum(counts) or len(items) != msg.batch_size * n_out:
        return None
    n_in = frame[8]
    view = memoryview(frame)
    out = []
    pos = 12
    k = 0
    pack = _HEAD.pack
    for b in counts:
        start = pos
        end = k + b * n_out
        while k < end:
            pos += 8 + len(items[k][1])
            k += 1
        out.append(pack(0, 2, 1, 0, 4 + pos - start, n_in, n_out, b) + view[start:pos])
    return out


async def _infer_within(backend: Backend, request: Payload, timeout: float) -> Payload:
    if getattr(backend, "timeout", None) == timeout and getattr(backend, "enforces_timeout", 0):
        return await backend.infer(request)  # its own deadline raises TimeoutError
    if sys.version_info >= (3, 11):
        async with asyncio.timeout(timeout):
            return await backend.infer(request)
    return await asyncio.wait_for(backend.infer(request), timeout)  # pragma: no cover


def _samples(job: Job) -> int:
    """The samples of ``job``'s request (0 for a message that is not an inference)."""
    msg = job.request.message
    return msg.batch_size if type(msg) is Inference else 0


class Attempts:
    """Where the attempt loop of a :class:`Job` stands when it goes on from a first attempt
    made elsewhere (the fast path, a batch, the MIP lane): its retry state."""

    __slots__ = ("done", "first", "last", "timed_out", "tried")

    def __init__(
        self,
        *,
        first: DeviceRow | None = None,
        tried: list[str] | None = None,
        done: int = 0,
        last: str = "",
        timed_out: bool = False,
    ) -> None:
        self.first = first  #: the device to try next instead of drawing one
        self.tried: list[str] = [] if tried is None else tried  #: row keys tried so far
        self.done = done  #: attempts made so far
        self.last = last  #: why the last one failed
        self.timed_out = timed_out  #: the last one took too long


class Job:
    """One request on its way through the dispatcher, from arrival to its end
    (:meth:`Dispatcher.settle`): taken by :meth:`Dispatcher.start` (the MIP front door's way
    in, and :meth:`Dispatcher.submit`'s, which awaits ``notify``'s call).
    ``door``: the front door it came in by, its ``door`` label in the metrics
    (:data:`~wirekit.serve.control.metrics.DOORS`)."""

    __slots__ = (
        "abandoned",
        "attempts",
        "cfg",
        "client",
        "door",
        "error",
        "head",
        "jfail",
        "key",
        "model",
        "notify",
        "outcome",
        "request",
        "rid",
        "t_in",
        "t_sent",
    )

    def __init__(
        self, model: str, request: Payload, client: str, notify, door: str = DOOR_MIP
    ) -> None:
        self.model = model
        self.request = request
        self.client = client
        self.door = door
        #: called with the job once it is answered (None: :meth:`Dispatcher.submit` awaits it)
        self.notify = notify
        self.outcome: Outcome | None = None
        self.error: BaseException | None = None  #: set instead when the loop was cancelled
        self.rid = ""
        #: set by Dispatcher.start (or lane_fallback) before any use
        self.cfg: ModelConfig = None  # type: ignore[assignment]
        self.t_in = 0.0
        #: when its current attempt was sent (0: never sent yet)
        self.t_sent = 0.0
        self.key: bytes | None = None
        #: its journal line's start, made while it is sent ("" or None: none)
        self.head: str | None = None
        #: its client went away before the answer: it ended ``abandoned``
        #: (:meth:`Dispatcher.abandon`); its attempt, if any, records and answers nothing
        self.abandoned = False
        #: the attempt loop's state when it goes on from an attempt made elsewhere
        self.attempts: Attempts | None = None
        #: the store's ``journal_failures`` when its arrival was recorded (-1: its arrival
        #: is on record): a journal write failed since, it may not be (then it is refused)
        self.jfail = -1


class UnknownModel(LookupError):
    """A request names a model the deployment does not serve."""


class ModelRemoved(UnknownModel):
    """A request names a model that was removed (or is being removed) while the dispatcher
    runs: the message says so."""

    def __init__(self, model: str) -> None:
        self.model = model
        super().__init__(f"model {model!r} was removed")


#: names of removed models (and their apps) remembered, to say "removed" rather than
#: "unknown" (the oldest are forgotten first)
MAX_REMOVED = 4096


@dataclass(slots=True)
class Outcome:
    """The one answer to a request (not frozen: a frozen dataclass costs a microsecond more
    to build, per request)."""

    id: str
    status: str  #: "ok", "error" (the backend answered with an error) or "failed"
    response: Payload  #: the MIP answer (an error reply unless status is "ok")
    device: str | None  #: the row key that answered, "cache", or None
    attempts: int
    detail: str = ""  #: why it failed, for humans
    #: why a ``failed`` request failed, for the HTTP status: "timeout" (its last device took
    #: too long: 504), "unavailable" (no device could be reached or none was left: 503);
    #: "bad request" for an ``error`` the client caused (inputs its model does not take: 400);
    #: "model error" for an ``error`` the model answered with its message (``detail``: 400);
    #: "refused" for a request refused before it was sent anywhere (503)
    cause: str = ""

    @property
    def ok(self) -> bool:
        return self.status == OK


def _error_payload(code: ErrorCode) -> Payload:
    msg = ErrorReply(int(code))
    return Payload(None, msg)


def oip_error(msg: Inference) -> str:
    """The message of a model's Open Inference Protocol ERROR item, the first item of
    ``msg`` (:func:`wirekit.oip.error_to_mip`): what the request's row records as why."""
    return bytes(msg.items[0][1]).decode("utf-8", "replace")


def is_answer(msg: Any) -> TypeGuard[Inference]:
    """Whether the backend's reply ``msg`` answers a request (an inference response; an
    error reply, or anything else, does not)."""
    return type(msg) is Inference and bool(msg.response)


def _failure(
    key: str, why: BaseException | str, timeout: float, address: str | None = None
) -> tuple[str, bool]:
    """Why an attempt on the row ``key`` failed (``why``: its exception, or the text of a
    lost connection; ``address``: the backend's, when the exception does not say it), and
    whether it took too long (more than ``timeout`` seconds)."""
    if isinstance(why, (asyncio.TimeoutError, TimeoutError)):
        return f"{key}: no answer within {timeout} s", True
    if address is None:
        return f"{key}: {why}", False
    return f"{key}: {address}: {why}", False


def _cancelled(rid: str) -> Outcome:
    """The end of the request ``rid`` whose attempt loop was cancelled (shutdown, or the
    HTTP client went away)."""
    return Outcome(
        rid, FAILED, _error_payload(ErrorCode.INTERNAL), None, 0, "cancelled before an answer"
    )


def _gone(rid: str, attempts: int) -> Outcome:
    """The end of the request ``rid`` whose client went away (sent ``attempts`` times)."""
    return Outcome(rid, ABANDONED, _error_payload(ErrorCode.INTERNAL), None, attempts, CLIENT_GONE)


def _no_one(job: Job) -> None:
    """The ``notify`` of a job that ended ``abandoned``: no one is left to answer."""


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
        lane: ModuleType | None = None,
    ) -> None:
        self.models = dict(models)
        #: the MIP lane's twin (module): compiled unless WIREKIT_PURE or not built
        self.lane = lane if lane is not None else select("servelane", pure_lane)
        self.router = router
        self.backends = dict(backends)
        self.store = store
        self.metrics = metrics
        self.cache = cache
        #: the clock of the store's times (time.time by default)
        self.clock = clock
        self._ids = itertools.count(1)
        self._prefix = f"{int(time.time()):x}{os.getpid():x}{os.urandom(2).hex()}-"
        self.resubmissions = 0
        #: requests started with :meth:`start` (:meth:`submit`'s too) and not answered yet
        self.active = 0
        #: requests in :meth:`submit` (the awaiting doors': HTTP, gRPC) not answered yet
        self.submitting = 0
        self.closing = False
        self.tasks: set[asyncio.Task] = set()  #: attempt loops of started requests
        self.batches = 0  #: joined batches sent to backends (adaptive batching)
        self.batch_retries = 0  #: joined batches whose requests were sent again one by one
        #: row key -> [joined batches sent, of them sent again one by one]
        self.row_batches: dict[str, list[int]] = {}
        self.lane_requests = 0  #: requests the MIP lane took (wirekit.serve.dispatch.lane)
        self._waiting: dict[str, list[Job]] = {}  # row key -> jobs to join this loop pass
        #: started jobs (and their device) sent at the end of this loop pass, after the
        #: journal write of their arrivals (group commit: :meth:`_send_arrived`)
        self._outbox: list[tuple[Job, DeviceRow]] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        #: bumped whenever a model's routing changes (models or rows added or removed,
        #: quotas): a MIP lane takes its route again when it sees a new value
        self.route_version = 0
        #: removed model or app name -> its model (see :class:`ModelRemoved`)
        self.removed: dict[str, str] = {}
        #: configs of removed models: requests still in flight finish with them (a late
        #: failure of one is resubmitted, and answered "failed", with its model's config)
        self._retired: dict[str, ModelConfig] = {}
        #: requests refused before they were sent anywhere, by reason
        #: (:data:`REFUSED_JOURNAL`): ``wirekit_serve_refused_total``
        self.refused: dict[str, int] = {}
        self._refusal_log = BurstLog(log)
        self._unjournaled_log = BurstLog(log)
        self._journal_error: JournalUnavailable | None = None

    # ------------------------------------------------------------------ models at run time

    def routes_changed(self) -> None:
        """Routing changed (the catalog told so): MIP lanes take their route again."""
        self.route_version += 1

    def add_model(self, cfg: ModelConfig, backends: Mapping[str, Backend]) -> None:
        """Serve ``cfg`` from now on, through ``backends`` (row key -> backend)."""
        self.backends.update(backends)
        self.models[cfg.name] = cfg
        self._retired.pop(cfg.name, None)
        for name in [n for n, m in self.removed.items() if m == cfg.name or n in cfg.apps]:
            del self.removed[name]
        self.routes_changed()

    def update_model(self, cfg: ModelConfig, keys: Collection[str]) -> None:
        """New settings for the model ``cfg.name`` (its timeout, attempts, batching): the
        requests that arrive from now on use ``cfg``, those in flight finish with the config
        they started with.  The backends of its rows ``keys`` that have a ``timeout`` take
        the new one for the calls they make from now on."""
        if cfg.name in self.models:  # not one being drained: it takes no new request
            self.models[cfg.name] = cfg
        for key in keys:
            backend = self.backends.get(key)
            if backend is not None and hasattr(backend, "timeout"):
                backend.timeout = cfg.timeout  # type: ignore[attr-defined]
        self.routes_changed()  # MIP lanes take their route (and the config in it) again

    def add_backends(self, backends: Mapping[str, Backend]) -> None:
        """Backends for rows that may now be chosen (a quota raised from 0)."""
        self.backends.update(backends)
        self.routes_changed()

    def drain(self, model: str, apps: Collection[str] = ()) -> None:
        """Take no new request for ``model`` (they raise :class:`ModelRemoved`); those in
        flight finish (with the router's rows of the model, until the catalog drops them)."""
        cfg = self.models.pop(model)
        self._retired.pop(model, None)
        self._retired[model] = cfg
        for name in (model, *apps):
            self.removed.pop(name, None)
            self.removed[name] = model
        while len(self.removed) > MAX_REMOVED:
            del self.removed[next(iter(self.removed))]
        while len(self._retired) > MAX_REMOVED:
            del self._retired[next(iter(self._retired))]
        self.routes_changed()

    async def remove_backends(self, keys: Collection[str]) -> None:
        """Close and forget the backends of ``keys`` (rows no longer routed)."""
        for key in keys:
            backend = self.backends.pop(key, None)
            if backend is not None:
                await backend.close()
        self.routes_changed()

    def _unknown(self, model: str) -> UnknownModel:
        return ModelRemoved(model) if model in self.removed else UnknownModel(model)

    def new_id(self) -> str:
        """A new request id (unique to this dispatcher process)."""
        return f"{self._prefix}{next(self._ids):x}"

    def new_ids(self, n: int) -> list[str]:
        """``n`` new request ids at once (what ``n`` calls of :meth:`new_id` give)."""
        prefix = self._prefix
        if n == 1:  # the common case under load: one request per read
            return [f"{prefix}{next(self._ids):x}"]
        return [f"{prefix}{k:x}" for k in itertools.islice(self._ids, n)]

    async def submit(
        self,
        model: str,
        request: Payload,
        client: str,
        *,
        defer_journal: bool = False,
        door: str = DOOR_HTTP,
    ) -> Outcome:
        """Answer one request (see the module docstring).  Raises :class:`UnknownModel`.

        The request goes the way of :meth:`start` -- the MIP front door's -- and this waits
        for its answer: its first attempt leaves on the backend's open connection with its
        reply handled in a callback, its arrival journaled first (with the arrivals of the
        same loop pass when others are in flight: group commit), and any retry runs the
        attempt loop; so every door that awaits its answers pays what the MIP door pays.

        ``door``: the front door it came in by, its ``door`` label in the metrics (one of
        :data:`~wirekit.serve.control.metrics.DOORS`: ``"http"``, ``"clipper"``,
        ``"tfserving"``, ``"oip-rest"``, ``"oip-grpc"``).

        ``defer_journal``: the completion record is not written to the journal yet; the
        caller calls ``store.write_journal()`` before it answers (see
        :meth:`RequestStore.completion`).

        Cancelled (the client went away, or shutdown), the request ends ``failed``
        ("cancelled before an answer") at once; an attempt still on its way records and
        answers nothing when it comes back."""
        answered = asyncio.get_running_loop().create_future()
        job = Job(model, request, client, answered.set_result, door)
        self.start(job)  # raises UnknownModel before anything is recorded
        self.submitting += 1
        try:
            if not answered.done():  # a cache hit is answered within start
                await answered
        except BaseException:
            self._cancel_submitted(job)
            raise
        finally:
            self.submitting -= 1
        if not defer_journal:
            self.write_completions()  # its completion on record before the answer
        outcome = job.outcome
        if outcome is None:  # its attempt loop was cancelled (shutdown): recorded so
            return _cancelled(job.rid)
        return outcome

    def _cancel_submitted(self, job: Job) -> None:
        """:meth:`submit` was cancelled before ``job`` was answered: it ends ``failed``
        ("cancelled before an answer", journaled at once), and what comes after -- its
        attempt's reply, the attempt loop's end -- records and answers nothing."""
        if job.outcome is not None or job.error is not None or job.abandoned:
            return
        job.notify = _no_one  # the awaiting task is gone
        if not job.rid:  # waiting to be joined in a batch: not recorded as arrived yet
            self._arrive(job)
        job.head = ""  # a line started names a device: it ends on none
        self.settle(job, _cancelled(job.rid), defer=False)
        job.abandoned = True

    # ------------------------------------------------------------------ the end of a request

    def settle(
        self,
        job: Job,
        outcome: Outcome,
        t_out: float | None = None,
        *,
        defer: bool = True,
        error: BaseException | None = None,
    ) -> None:
        """The one place where a request ends: ``job`` ends as ``outcome`` says (``t_out``:
        when, if already known) -- its completion record (the store row and its journal
        line, deferred unless ``defer`` is false: the caller writes the journal before it
        answers), the metrics, then its answer (``job.notify``; ``error`` instead of the
        outcome when its attempt loop was cancelled).  Every end state of a single request
        passes here; the MIP lane's ``ok`` answers pass through the batched form,
        :meth:`lane_answered`.  A job whose client went away has ended ``abandoned``: what
        comes after that records and answers nothing."""
        status = outcome.status
        if job.abandoned and status != ABANDONED:
            return
        wire = job.request.wire
        head = job.head
        reason = outcome.detail if status != OK else None
        if head:  # answered by the device its first attempt went to: the line is started
            if t_out is None:
                t_out = self.clock()
            self.metrics.finished(job.model, status, t_out - job.t_in, outcome.device, job.door)
            self.store.complete_head(
                head, job.rid, outcome.device, t_out, status, len(wire), outcome.attempts, reason
            )
        else:
            t_out = self.clock()
            self.metrics.finished(job.model, status, t_out - job.t_in, outcome.device, job.door)
            self.store.complete(
                job.rid,
                job.model,
                job.client,
                outcome.device,
                job.t_in,
                t_out,
                status,
                len(wire),
                outcome.attempts,
                wire,
                True,
                reason,
            )
            if not defer:
                self.write_completions()
        if job.notify is None:  # no one awaits it, and it is not counted in ``active``
            return
        self.active -= 1
        if error is not None:
            job.error = error
        elif status == ABANDONED:  # no one to answer
            return
        else:
            job.outcome = outcome
        job.notify(job)

    def classify_reply(self, job: Job, reply: Payload, device: str, attempt: int) -> Outcome:
        """What a backend's ``reply`` to ``job`` (from the row ``device``, its attempt
        ``attempt``) makes of it: ``ok`` when it is an inference response (then cached),
        but ``error`` with the model's message when it is the Open Inference Protocol's
        ERROR item (a one-output reply whose first item is one: :func:`oip_error`; cause
        :data:`MODEL_ERROR`); else
        ``error`` ("backend answered ...")."""
        msg = reply.message
        if type(msg) is Inference and msg.response:  # is_answer(msg), inline: per request
            if msg.n_output == 1 and msg.items and msg.items[0][0] == OIP_ERROR:
                return Outcome(job.rid, ERROR, reply, device, attempt, oip_error(msg), MODEL_ERROR)
            return self._answered(job, reply, device, attempt)
        return Outcome(job.rid, ERROR, reply, device, attempt, f"backend answered {msg}")

    def _answered(self, job: Job, reply: Payload, device: str, attempt: int) -> Outcome:
        """``job`` answered ``reply`` (an inference response), cached when the cache is on."""
        if job.key is not None:
            self.cache.put(job.cfg.name, job.key, reply, len(reply.wire))
        return Outcome(job.rid, OK, reply, device, attempt)

    def refuse(self, job: Job, reason: str, response: Payload) -> None:
        """A door refuses ``job`` before it is started (:meth:`start` raised
        :class:`UnknownModel`: its model was removed): it arrives and ends ``failed`` at
        once, with ``reason``, answered ``response`` -- recorded and counted as every
        request."""
        if not job.t_in:
            job.t_in = self.clock()
        self._arrive(job)
        self.active += 1  # as a started job: settle takes it off
        self.settle(job, Outcome(job.rid, FAILED, response, None, 0, reason))

    # ------------------------------------------------------------------ the journal fails

    def write_arrivals(self) -> int:
        """Write the journal before requests leave; return the store's
        ``journal_failures`` after it: a job whose ``jfail`` is neither -1 nor that number
        has no arrival on record (a write failed since it arrived: :meth:`on_record`)."""
        try:
            self.store.write_journal()
        except JournalUnavailable as exc:
            self._journal_error = exc
        return self.store.journal_failures

    def on_record(self, job: Job, failures: int) -> bool:
        """Whether ``job``'s arrival is journaled (``failures``: from
        :meth:`write_arrivals`); if not, it ends refused (:meth:`journal_refused`)."""
        if job.jfail < 0 or job.jfail == failures:
            job.jfail = -1
            return True
        self.settle(job, self.journal_refused(job.rid))
        return False

    def journal_refused(self, rid: str) -> Outcome:
        """The end of the request ``rid`` refused because its arrival could not be
        journaled: ``failed``, cause :data:`REFUSED`, nothing sent; counted and logged once
        per burst."""
        self.refused[REFUSED_JOURNAL] = self.refused.get(REFUSED_JOURNAL, 0) + 1
        exc = self._journal_error
        self._refusal_log.event(
            time.monotonic(),
            "wirekit serve: %s: new requests are refused (503, MIP INTERNAL) until it can be"
            ' written again (wirekit_serve_refused_total{reason="journal"} counts them)',
            exc if exc is not None else "the request journal cannot be written",
        )
        why = f"{JOURNAL_REFUSED} ({exc.why})" if exc is not None else JOURNAL_REFUSED
        return Outcome(rid, FAILED, _error_payload(ErrorCode.INTERNAL), None, 0, why, REFUSED)

    def write_completions(self) -> None:
        """Write the journal before answers go out: a failure does not hold them back (they
        were computed; their rows go to the store through the writer), it is logged once
        per burst."""
        try:
            self.store.write_journal()
        except JournalUnavailable as exc:
            self._journal_error = exc
            self._unjournaled_log.event(
                time.monotonic(),
                "wirekit serve: %s: answers go out without their journal records (their rows"
                " still go to the store)",
                exc,
            )

    # ------------------------------------------------------------------ the attempt loop

    def _cached(self, job: Job) -> Outcome | None:
        """``job``'s answer from the cache (None: not there, or no cache); its cache key is
        kept for the answer to come."""
        cache = self.cache
        if not cache.enabled:
            return None
        job.key = key = digest(memoryview(job.request.wire)[8:])
        hit = cache.get(job.cfg.name, key)
        return None if hit is None else Outcome(job.rid, OK, hit, "cache", 0)

    async def _answer(self, job: Job) -> Outcome:
        """The attempt loop: the attempts of ``job`` from where ``job.attempts`` stands (a
        first attempt made elsewhere, or none) until one is answered or none is left."""
        state = job.attempts
        if state is None:
            state = job.attempts = Attempts()
        cfg = job.cfg
        sent = job.t_sent > 0  # its time in the queue is recorded at its first send
        for attempt in range(state.done + 1, cfg.attempts + 1):
            row = self._next_row(cfg, state)
            if row is None:
                break
            if attempt > 1:
                self.resubmissions += 1
                self.metrics.resubmitted(cfg.name)
            backend = self.backends.get(row.key)
            if backend is None:  # its model was removed meanwhile
                state.last = f"{row.key}: no longer served"
                continue
            t_sent = self.clock()
            if not sent:
                sent = True
                self.metrics.waited(cfg.name, t_sent - job.t_in)
            failures = self.write_arrivals()  # its arrival on record before it leaves
            if job.jfail >= 0:
                if job.jfail != failures:  # it is not: refused, not sent
                    return self.journal_refused(job.rid)
                job.jfail = -1
            try:
                reply = await _infer_within(backend, job.request, cfg.timeout)
            except (asyncio.TimeoutError, TimeoutError, BackendUnavailable, OSError) as exc:
                self.metrics.backend_time(cfg.name, row.key, self.clock() - t_sent)
                self._attempt_failed(job, row, *_failure(row.key, exc, cfg.timeout))
                continue
            except BadRequest as exc:  # the client's error: the device is fine
                self.metrics.backend_time(cfg.name, row.key, self.clock() - t_sent)
                self.router.succeed(row)
                reply = _error_payload(ErrorCode.SHAPE)
                return Outcome(job.rid, ERROR, reply, row.key, attempt, str(exc), BAD_REQUEST)
            self.metrics.backend_time(cfg.name, row.key, self.clock() - t_sent)
            self.router.succeed(row)
            return self.classify_reply(job, reply, row.key, attempt)
        n = len(state.tried)
        return Outcome(
            job.rid,
            FAILED,
            _error_payload(ErrorCode.INTERNAL),
            None,
            n,
            f"no device answered after {n} attempt(s): {state.last}",
            TIMED_OUT if state.timed_out else UNAVAILABLE,
        )

    def _next_row(self, cfg: ModelConfig, state: Attempts) -> DeviceRow | None:
        """The device of the next attempt (None: none is left, ``state.last`` says why)."""
        if self.closing:
            state.last = state.last or "the dispatcher is shutting down"
            return None
        row = state.first
        if row is not None:
            state.first = None
        else:
            try:
                row = self.router.choose(cfg.name, state.tried)
            except NoDevice as exc:
                state.last = state.last or str(exc)
                return None
        if row.key not in state.tried:
            state.tried.append(row.key)
        return row

    def _attempt_failed(self, job: Job, row: DeviceRow, last: str, timed_out: bool) -> None:
        """An attempt of ``job`` on ``row`` failed (``last``: why; ``timed_out``: it took too
        long): logged, the device backed off, kept in ``job.attempts`` for the next one."""
        log.warning("request %s: %s", job.rid, last)
        self.router.fail(row)
        state = job.attempts
        assert state is not None  # made by the attempt loop, or by the first attempt's
        state.last, state.timed_out = last, timed_out

    # ------------------------------------------------------------------ the fast path

    def new_job(self, model: str, wire: bytes, client: str, t_in: float, notify) -> Job:
        """A :class:`Job` for the encoded request ``wire`` that arrived at ``t_in``."""
        job = Job(model, Payload(wire), client, notify)
        job.t_in = t_in
        return job

    def start(self, job: Job, row: DeviceRow | None = None) -> None:
        """Begin answering ``job`` without a task when possible: the first attempt goes to
        a MIP backend's open connection at once and its reply is handled in a callback (one
        loop pass per leg, no coroutine).  Anything else -- a cache hit aside -- and every
        retry or resubmission runs the same attempt loop as :meth:`submit`, in a task.
        With other requests in flight, the first attempt leaves at the end of the loop
        pass, after one journal write of the pass's arrivals (group commit,
        :meth:`_send_arrived`); alone, at once.
        ``job.notify(job)`` is called once, when ``job.outcome`` (or ``job.error``) is set,
        possibly before this returns.  The completion record is deferred: the caller writes
        the journal (``store.write_journal()``) before it answers.  Raises
        :class:`UnknownModel` (the door then calls :meth:`refuse`).

        ``row``: the device already drawn for ``job`` (by the MIP lane, which found no free
        slot on it): the job goes there -- waiting for a slot -- instead of drawing again,
        so that each request is drawn for exactly once (see
        :mod:`wirekit.serve.dispatch.router`)."""
        cfg = self.models.get(job.model)
        if cfg is None:
            raise self._unknown(job.model)
        job.cfg = cfg
        if not job.t_in:
            job.t_in = self.clock()
        self.active += 1
        if self.cache.enabled:
            self._arrive(job)
            hit = self._cached(job)
            if hit is not None:
                self.settle(job, hit)
                return
        row = self._first_row(cfg, row)
        if (
            cfg.max_batch > 1
            and row is not None
            and getattr(self.backends.get(row.key), "batchable", False)
        ):
            self._wait_for_batch(job, row)
            return
        if not job.rid:
            # Recorded first; its arrival is journaled (with every other of this loop pass,
            # in one write) before it leaves: a request that reached a backend is in the
            # store after a crash.
            self._arrive(job)
        if row is None:
            self._spawn(job)  # the attempt loop writes the journal before it sends
        elif self.active == 1:  # nothing else in flight to share the write with: at once
            if self.on_record(job, self.write_arrivals()):
                self._send_first(job, row)
        else:
            outbox = self._outbox
            outbox.append((job, row))
            if len(outbox) == 1:
                self._at_end_of_pass(self._send_arrived)

    def _first_row(self, cfg: ModelConfig, row: DeviceRow | None) -> DeviceRow | None:
        """The device of a started job's first attempt: ``row`` (drawn already) or a draw;
        None when there is none, or the dispatcher is closing (the attempt loop says why)."""
        if self.closing:
            return None
        if row is None:
            try:
                return self.router.choose(cfg.name, ())
            except NoDevice:
                return None
        return row

    def _at_end_of_pass(self, callback, *args) -> None:
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        loop.call_soon(callback, *args)

    def _wait_for_batch(self, job: Job, row: DeviceRow) -> None:
        """Adaptive batching: ``job`` is joined with the other requests for ``row`` at the
        end of the loop pass; its arrival is recorded once the batch is on its way (while
        the backend works)."""
        waiting = self._waiting.get(row.key)
        if waiting is None:
            self._waiting[row.key] = [job]
            self._at_end_of_pass(self._send_waiting, row)
        else:
            waiting.append(job)

    def _send_arrived(self) -> None:
        """Group commit (end of a loop pass): write the journal -- the arrival records of
        every job started in the pass, in one system call -- then send those jobs."""
        jobs, self._outbox = self._outbox, []
        failures = self.write_arrivals()
        for job, row in jobs:
            if job.abandoned:  # its client went away
                continue
            jfail = job.jfail
            if jfail < 0 or jfail == failures:  # on record (on_record, inline: per request)
                self._send_first(job, row)
            else:
                self.settle(job, self.journal_refused(job.rid))

    def _send_first(self, job: Job, row: DeviceRow) -> None:
        """The first attempt of a started job (its arrival journaled), with its journal
        line started while it is away when it went out at once."""
        job.jfail = -1  # its arrival is on record: a retry is sent too
        if self._send_one(job, row):
            job.head = self.store.line_head(
                job.rid, job.model, job.client, row.key, job.t_in, len(job.request.wire)
            )

    def _arrive(self, job: Job) -> None:
        """Give ``job`` its id and record its arrival (store row, metrics; its journal
        record deferred: :meth:`RequestStore.arrival`, written by the next
        ``store.write_journal()``, which comes before anything is sent)."""
        wire = job.request.wire
        job.rid = rid = self.new_id()
        job.jfail = self.store.journal_failures
        self.store.arrival(rid, job.model, job.client, job.t_in, len(wire), wire, True)
        self.metrics.arrived(job.model)

    def _send_one(self, job: Job, row: DeviceRow) -> bool:
        """The first attempt of ``job`` to ``row``: at once on its open connection, with the
        reply handled in a callback (True), or else in the attempt loop (a task, False).
        ``job`` must have its id before the loop runs again."""
        send = getattr(self.backends.get(row.key), "send_nowait", None)
        if send is not None and send(job.request.wire, partial(self._fast_reply, job, row)):
            t_sent = self.clock()
            if not job.t_sent:
                self.metrics.waited(job.model, t_sent - job.t_in)
            job.t_sent = t_sent
            return True
        self._spawn(job, Attempts(first=row))
        return False

    # ------------------------------------------------------------------ adaptive batching

    def _send_waiting(self, row: DeviceRow) -> None:
        """Send the jobs waiting for ``row`` (end of a loop pass): runs of requests with the
        same inputs per sample are joined, up to the model's ``max_batch`` samples."""
        jobs = self._waiting.pop(row.key)
        fresh = [job for job in jobs if not job.rid]
        for job in fresh:  # their arrivals journaled in one write, before they are sent
            self._arrive(job)
        failures = self.write_arrivals()
        jobs = [job for job in jobs if self.on_record(job, failures)]
        try:
            if jobs:
                self._send_jobs(jobs, row)
        finally:
            head = self.store.line_head
            key = row.key
            for job in fresh:
                if job.head is None:  # not handed to the attempt loop
                    job.head = head(
                        job.rid, job.model, job.client, key, job.t_in, len(job.request.wire)
                    )

    def _send_jobs(self, jobs: list[Job], row: DeviceRow) -> None:
        if len(jobs) == 1:
            self._send_one(jobs[0], row)
            return
        limit = jobs[0].cfg.max_batch
        group: list[Job] = []
        n_input = samples = size = 0
        for job in jobs:
            msg = job.request.message
            if type(msg) is not Inference or not msg.batch_size:  # nothing to join: alone
                self._send_one(job, row)
                continue
            b = msg.batch_size
            n = len(job.request.wire)
            if group and (msg.n_input != n_input or samples + b > limit or size + n > BATCH_BYTES):
                self._send_group(group, row, n_input, samples)
                group = []
            if not group:
                n_input, samples, size = msg.n_input, 0, 12
            group.append(job)
            samples += b
            size += n - 12
        if group:
            self._send_group(group, row, n_input, samples)

    def _send_group(self, jobs: list[Job], row: DeviceRow, n_input: int, samples: int) -> None:
        if samples >= SPLIT_SAMPLES and len(jobs) > 1:
            # Two batches rather than one: the answers to the first go back to the clients
            # while the backend works on the second (client, dispatcher and backend overlap
            # instead of taking turns).
            half = k = 0
            while 2 * half < samples:
                half += _samples(jobs[k])
                k += 1
            if k < len(jobs):
                self._send_batch(jobs[:k], row, n_input, half)
                self._send_batch(jobs[k:], row, n_input, samples - half)
                return
        self._send_batch(jobs, row, n_input, samples)

    def _send_batch(self, jobs: list[Job], row: DeviceRow, n_input: int, samples: int) -> None:
        if len(jobs) == 1:
            self._send_one(jobs[0], row)
            return
        self.batches += 1
        counts = self.row_batches.get(row.key)
        if counts is None:
            counts = self.row_batches[row.key] = [0, 0]
        counts[0] += 1
        wire = join_requests([j.request.wire for j in jobs], n_input, samples)
        backend: Any = self.backends[row.key]  # batchable: a MipBackend
        t_sent = self.clock()
        queue = self.metrics.model_counters(jobs[0].model).queue  # one row: one model
        for job in jobs:
            if not job.t_sent:
                queue.observe(t_sent - job.t_in)
            job.t_sent = t_sent
        if backend.send_nowait(wire, partial(self._group_reply, jobs, row)):
            return
        task = asyncio.get_running_loop().create_task(self._group_slow(jobs, row, wire))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _group_slow(self, jobs: list[Job], row: DeviceRow, wire: bytes) -> None:
        """A joined batch through the backend's coroutine call (no connection open yet, or
        no free slot)."""
        try:
            backend = self.backends.get(row.key)
            if backend is None:
                raise BackendUnavailable(f"{row.key}: no longer served")
            reply = await _infer_within(backend, Payload(wire), jobs[0].cfg.timeout)
        except Exception as exc:
            self._group_reply(jobs, row, None, exc)
            return
        except BaseException as exc:
            for job in jobs:
                self._abort(job, exc)
            raise
        self._group_reply(jobs, row, reply.wire, None)

    def _group_reply(self, jobs: list[Job], row: DeviceRow, frame: bytes | None, exc) -> None:
        """The reply to a joined batch: split per request, or each request on its own."""
        if exc is None:
            assert frame is not None  # a reply, or an exception
            try:
                msg = decode_reply(mip, frame)
            except DecodeError as err:
                exc = err
            else:
                self._group_answered(jobs, row, frame, msg)
                return
        for job in jobs:
            self._fast_reply(job, row, None, exc)

    def _group_answered(self, jobs: list[Job], row: DeviceRow, frame: bytes, msg) -> None:
        """The backend answered the joined batch of ``jobs`` with ``frame`` (``msg``)."""
        t_out = self.clock()  # answered together
        self.metrics.backend_time(jobs[0].model, row.key, t_out - jobs[0].t_sent, len(jobs))
        self.router.succeed(row)
        parts = None
        if is_answer(msg):
            parts = split_reply(frame, msg, [_samples(j) for j in jobs])
        if parts is None:
            # An error reply (or a reply not shaped like the batch) may be the fault of one
            # request: each is sent again alone and gets its own answer.
            self.batch_retries += 1
            self.row_batches[row.key][1] += 1
            log.info(
                "a batch of %d requests to %s was answered %s: sending them one by one",
                len(jobs),
                row.key,
                msg,
            )
            for job in jobs:
                if not job.abandoned:  # its client is still there
                    self._send_one(job, row)
            return
        key = row.key
        for job, wire in zip(jobs, parts, strict=True):
            self.settle(job, self._answered(job, Payload(wire), key, 1), t_out)

    def _spawn(self, job: Job, attempts: Attempts | None = None) -> None:
        """``job`` goes on in the attempt loop (a task), from ``attempts`` (None: none
        made yet)."""
        job.head = ""  # no line made ahead: the device that answers is not known yet
        job.attempts = attempts
        task = asyncio.get_running_loop().create_task(self._slow(job))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _slow(self, job: Job) -> None:
        try:
            outcome = await self._answer(job)
        except BaseException as exc:
            self._abort(job, exc)
            raise
        self.settle(job, outcome)

    def _abort(self, job: Job, exc: BaseException) -> None:
        """Cancelled (shutdown): still close the row, and answer."""
        if not job.abandoned:
            job.head = ""  # a line started names a device: it ends on none
        self.settle(job, _cancelled(job.rid), error=exc)

    def _fast_reply(self, job: Job, row: DeviceRow, frame: bytes | None, exc) -> None:
        """The first attempt's reply (or failure), from the backend connection's callback."""
        t_back = self.clock()
        self.metrics.backend_time(job.model, row.key, t_back - job.t_sent)
        if exc is None:
            assert frame is not None  # a reply, or an exception
            try:
                msg = decode_reply(mip, frame)
            except DecodeError as err:
                exc = err
            else:
                self.router.succeed(row)
                if is_answer(msg) and msg.n_output != frame[9]:  # KubeMo's quirk, corrected
                    frame = mip.encode(msg)
                self.settle(job, self.classify_reply(job, Payload(frame, msg), row.key, 1), t_back)
                return
        if job.abandoned:  # its client is gone: no other attempt
            return
        self._first_failed(job, row, exc)

    def _first_failed(self, job: Job, row: DeviceRow, exc: BaseException) -> None:
        """The first attempt of ``job`` on ``row`` failed with ``exc``: the attempt loop
        goes on from there."""
        retryable = unanswered_retryable(exc)
        if retryable:
            # The server closed a kept-alive connection before reading this request (as
            # KubeMo's does after every answer): the client would send it again, and so
            # does the attempt loop, to the same device.
            self._spawn(job, Attempts(first=row))
            return
        address = getattr(self.backends.get(row.key), "address", "?")
        why: BaseException | str = exc
        if retryable is not None:
            why = f"mip: {address} closed the connection without replying"
        job.attempts = Attempts(tried=[row.key], done=1)
        self._attempt_failed(job, row, *_failure(row.key, why, job.cfg.timeout, address))
        self._spawn(job, job.attempts)

    # ------------------------------------------------------------------ a client gone

    def abandon(self, job: Job) -> None:
        """The client of ``job`` went away before its answer: the request ends now, as
        ``abandoned`` (:meth:`settle`); one already answered keeps the end it was recorded
        with.  An attempt still on its way is not recalled: its reply (or failure) frees its
        backend slot and records, resubmits and answers nothing."""
        if job.outcome is not None or job.error is not None or job.abandoned:
            return
        job.abandoned = True
        if not job.rid:  # waiting to be joined in a batch: not recorded as arrived yet
            self._arrive(job)
        job.head = ""  # a line started names a device: it ends on none
        self.settle(job, _gone(job.rid, int(job.t_sent > 0)))

    def abandoned(
        self, model: str, client: str, rid: str, t_in: float, wire: bytes, attempts: int
    ) -> None:
        """The request ``rid`` of ``model`` from ``client`` (arrived at ``t_in``, sent
        ``attempts`` times; a MIP lane's, ``Lane.abandon``) ends as ``abandoned``: its
        client went away before its answer.  It leaves the queue at once (a drain waits for
        it no more), through :meth:`settle` (the journal line is deferred: the caller
        writes the journal)."""
        job = Job(model, Payload(wire), client, _no_one)
        job.rid = rid
        job.t_in = t_in
        job.abandoned = True
        self.settle(job, _gone(rid, attempts))

    # ------------------------------------------------------------------ the MIP lane

    def lane_route(self, model: str):
        """What the MIP lane (:mod:`wirekit.serve.dispatch.lane`) of ``model`` sends through:
        ``(config, device rows, {row key: pipelined AsyncClient})``, or None when the lane
        does not serve it (an unknown model, adaptive batching, a device that is not a
        pipelined MIP backend)."""
        cfg = self.models.get(model)
        if cfg is None or cfg.max_batch > 1:
            return None
        rows = self.router.rows(model)
        clients = {}
        for row in rows:
            client = getattr(self.backends.get(row.key), "lane_client", None)
            if client is None:
                return None
            clients[row.key] = client
        return (cfg, rows, clients) if rows else None

    def lane_arrived(
        self,
        stats: ModelStats,
        model: str,
        client: str,
        t_in: float,
        requests: list[tuple[str, int, Any]],
    ) -> bool:
        """The MIP lane is about to send ``requests`` of ``model`` (``stats``: its live
        counters) from ``client``, arrived at ``t_in``, each ``(id, size, request bytes)``:
        they are active, counted and stored as arrived (:meth:`RequestStore.arrivals`,
        journaled).  False when their arrivals could not be journaled: the lane sends none
        of them and ends each with :meth:`lane_refused`."""
        n = len(requests)
        self.active += n
        self.lane_requests += n
        self.metrics.model_counters(model).lane_requests += n
        stats.arrive(n)
        try:
            self.store.arrivals(model, client, t_in, requests)
        except JournalUnavailable as exc:
            self._journal_error = exc
            return False
        return True

    def lane_refused(self, model: str, client: str, rid: str, t_in: float, wire: bytes) -> Job:
        """A request of the MIP lane (:meth:`lane_arrived` said False) ends refused, not
        sent: the job that holds its answer (the lane answers ``job.outcome``)."""
        job = Job(model, Payload(wire), client, _no_one)
        job.rid = rid
        job.t_in = t_in
        self.settle(job, self.journal_refused(rid))
        return job

    def lane_answered(
        self,
        stats: ModelStats,
        model: str,
        client: str,
        t_out: float,
        total: float,
        lo: float,
        hi: float,
        rows: Collection[DeviceRow],
        answers: list[tuple[str, str, float, int, int, Any]],
        by_row: dict[str, list[Any]] | None = None,
        backend: list[float] | None = None,
    ) -> None:
        """The batched form of :meth:`settle`, for the MIP lane's answers that end ``ok``:
        ``answers`` (at ``t_out``; their response times summing to ``total``, from ``lo``
        to ``hi``), from the devices ``rows`` (back in rotation), are counted
        (:meth:`Metrics.lane_answered`; ``stats``: the model's live counters) and stored
        (:meth:`RequestStore.completions_ok`; the journal is written before the answers go
        out).  ``by_row``: the same figures per row key, ``[n, total, lo, hi]``, which the
        lane gathers only when a window is kept.  ``backend``: the backend time of each
        answer not from the cache, in order."""
        self.active -= len(answers)
        self.metrics.lane_answered(
            model, t_out, answers, total, lo, hi, backend, by_row, stats, DOOR_MIP
        )
        succeed = self.router.succeed
        for row in rows:
            succeed(row)
        self.store.completions_ok(model, client, t_out, answers)

    def lane_fallback(self, call, frame: bytes | None, exc: BaseException | None) -> Job:
        """A lane call the lane does not settle itself -- ``frame`` a reply that is not a
        well-formed inference response, or ``exc`` a timeout or a lost connection -- goes on
        as a :class:`Job` whose first attempt was ``call``: decoded, resubmitted, backed off,
        recorded and answered exactly like one (``call.job_done`` is its ``notify``).
        Returns that job (the lane abandons it if its client goes away meanwhile)."""
        lane = call.lane
        job = Job(lane.model, Payload(call.wire), lane.client, call.job_done)
        job.rid = call.rid
        job.cfg = self.models.get(lane.model) or self._retired[lane.model]
        job.t_in = call.t_in
        job.t_sent = call.t_in  # sent in the pass it was read: no time in the queue
        self.metrics.waited(lane.model, 0.0)
        job.key = call.key  # the answer is cached as the lane would have
        job.head = ""
        self._fast_reply(job, call.row, frame, exc)
        return job

    async def close(self) -> None:
        self.closing = True
        for backend in self.backends.values():
            await backend.close()
