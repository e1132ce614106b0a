"""Sans-IO state machines for both ends of a Clipper container connection.

No sockets here: :class:`ContainerSession` (the model container, one DEALER socket's life)
and :class:`FrontendState` (the Clipper side, one ROUTER) take frames and the current time
and return what to send and what happened.  The runtimes in :mod:`wirekit.clipper.container`
and :mod:`wirekit.clipper.frontend` only move frames between ZeroMQ sockets and these.

Lifecycle per generation (see ``specs/clipper.md`` and the Clipper reference notes):

* 2016: the container registers at once and serves; nothing is ever sent unasked, so there
  are no heartbeats and no expiry (the runtimes watch the TCP connection instead).
* 2017 and v3: the container heartbeats; the frontend answers ``REQUEST_CONTAINER_METADATA``
  (type 1) to an unknown peer and ``KEEPALIVE`` (type 0) to a known one; the container
  registers on type 1.  A container sends a heartbeat whenever it has sent nothing for
  ``poll_interval`` (D) seconds, also while waiting for the first answer and while its model
  runs; either side gives up on a peer silent for ``activity_timeout`` (TO) seconds.
"""

from __future__ import annotations

import itertools
import logging
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, cast

import numpy as np

from wirekit.errors import DecodeError, EncodeError, WirekitError

from . import candidates, decode, encode
from .messages import (
    DTYPES,
    PROTOCOL,
    Direction,
    Generation,
    Heartbeat,
    HeartbeatReply,
    HeartbeatType,
    InputType,
    NewContainer,
    PredictRequest,
    PredictResponse,
    as_generation,
    normalize_outputs,
)

log = logging.getLogger("wirekit.clipper")

#: Clipper's defaults: poll (heartbeat) period D and activity timeout TO, in seconds.
DEFAULT_POLL_INTERVAL = 5.0
DEFAULT_ACTIVITY_TIMEOUT = 30.0
#: Clipper v3 looks for silent containers every 10 s.
DEFAULT_CHECK_INTERVAL = 10.0
#: Peers rejected for speaking another generation that the frontend remembers (the oldest is
#: forgotten first); each costs one :class:`VersionMismatch` without traceback or payload.
DEFAULT_MAX_REJECTED = 256
#: The largest frame a runtime's RPC socket accepts (ZeroMQ's ``MAXMSGSIZE``, per frame): a
#: peer that announces a larger one is disconnected by libzmq before the frame is buffered.
#: Clipper sets none; a batch of inputs travels in one frame (2016, 2017) or one per input (v3).
DEFAULT_MAX_FRAME_SIZE = 256 * 1024 * 1024

Frames = list[bytes]

# Enum members read through their class cost ~0.1 µs each (Python 3.11); the per-message
# paths read these module constants instead.
_G2016 = Generation.G2016
_TO_CONTAINER = Direction.TO_CONTAINER
_TO_CLIPPER = Direction.TO_CLIPPER


def _quick_new(cls: type) -> Callable[..., Any]:
    """A constructor for the frozen slotted dataclass ``cls`` (1, 2 or 4 fields) taking
    every field in order: the same object as ``cls(...)`` without the frozen
    ``__setattr__`` detour (about half the cost; used on the per-message paths)."""
    setters = tuple(getattr(cls, f.name).__set__ for f in fields(cls))
    new = object.__new__
    if len(setters) == 1:
        (set_a,) = setters

        def make1(a: Any) -> Any:
            obj: Any = new(cls)
            set_a(obj, a)
            return obj

        return make1
    if len(setters) == 2:
        set_a, set_b = setters

        def make2(a: Any, b: Any) -> Any:
            obj: Any = new(cls)
            set_a(obj, a)
            set_b(obj, b)
            return obj

        return make2
    if len(setters) == 4:
        set_a, set_b, set_c, set_d = setters

        def make4(a: Any, b: Any, c: Any, d: Any) -> Any:
            obj: Any = new(cls)
            set_a(obj, a)
            set_b(obj, b)
            set_c(obj, c)
            set_d(obj, d)
            return obj

        return make4
    raise TypeError(f"{cls.__name__} has {len(setters)} fields (1, 2 or 4 supported)")


def zmq_max_frame_size(max_frame_size: int | None) -> int:
    """``max_frame_size`` (bytes, None or 0 for no limit) as ZeroMQ's ``MAXMSGSIZE`` value."""
    if max_frame_size is None or max_frame_size == 0:
        return -1
    if max_frame_size < 0:
        raise ValueError(f"max_frame_size must be at least 0 (0: no limit), not {max_frame_size}")
    return int(max_frame_size)


def check_seconds(name: str, value: float) -> float:
    """``value`` when it is a positive number of seconds (``inf``: never), else ValueError
    naming ``name`` (a heartbeat period, timeout or check interval of 0 or less would spin
    or expire every peer at once)."""
    try:
        positive = value > 0
    except TypeError:
        positive = False
    if not positive:
        raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
    return value


class VersionMismatch(WirekitError):
    """The peer speaks another generation of the Clipper RPC than this end was told to."""

    def __init__(self, expected: Generation, found: Sequence[Generation], error: DecodeError):
        self.expected = expected
        self.found = list(found)
        self.error = error
        spoken = " or ".join(g.value for g in self.found)
        super().__init__(
            f"clipper: version mismatch: the peer speaks Clipper RPC {spoken}, this end "
            f"speaks {expected.value} (decoding as {expected.value} failed: {error})"
        )


class PredictionError(WirekitError):
    """A prediction failed: no replica, timeout, type mismatch or a bad response."""


class InputTypeMismatch(PredictionError):
    """A prediction's inputs are not of a type the model takes: the caller's error, not the
    container's (nothing was sent to the model)."""


class OutputError(WirekitError):
    """The model's outputs cannot be sent (wrong count or type)."""


def _classify(
    frames: Sequence[Any], generation: Generation, direction: Direction, exc: DecodeError
) -> VersionMismatch | None:
    """A VersionMismatch when ``frames`` are valid in other generations only, else None.

    The error it holds keeps no traceback: that would pin the frames (the whole message)
    for as long as the mismatch is kept (``FrontendState.rejected``, a container's error).
    """
    try:
        others = [g for g in candidates(frames, direction) if g is not generation]
    except Exception:  # pragma: no cover - candidates only raises on misuse
        return None
    if not others:
        return None
    return VersionMismatch(generation, others, _detached(exc))


def _detached(exc: DecodeError) -> DecodeError:
    """A copy of ``exc`` with no traceback, cause or context (only its text and fields)."""
    rebuild, args = exc.__reduce__()[:2]
    return rebuild(*args)


_TEXT_TYPES = frozenset((str, bytes))


def check_outputs(
    outputs: Any, count: int, generation: Generation, *, normalize: bool = True
) -> Any:
    """The model's ``outputs`` normalised for the wire, or :class:`OutputError`.

    One output per input: float32-convertible numbers for 2016, ``str``/``bytes`` for 2017
    and v3 (Clipper keeps them as strings).  ``normalize=False`` checks count and types only
    (2017/v3) and returns ``outputs`` as given: the encoder converts them once.
    """
    if outputs is None:
        raise OutputError("the model returned None (expected one output per input)")
    try:
        n = len(outputs)
    except TypeError:
        raise OutputError(
            f"the model returned {type(outputs).__name__}, expected a sequence of {count} outputs"
        ) from None
    if n != count:
        raise OutputError(f"the model returned {n} outputs for {count} inputs")
    strings = generation is not _G2016
    is_array = type(outputs) is not list and isinstance(outputs, np.ndarray)
    if strings and is_array and outputs.dtype.kind not in "USO":
        raise OutputError(
            f"{generation.value} outputs are strings; the model returned a "
            f"{outputs.dtype.name} array (convert with str() or json.dumps())"
        )
    if strings and not is_array:
        # The types present, in one C-level pass; a loop names the culprit when one is off.
        if not set(map(type, outputs)) <= _TEXT_TYPES:
            for i, out in enumerate(outputs):
                if not isinstance(out, str | bytes):
                    raise OutputError(
                        f"{generation.value} outputs are strings; output {i} is "
                        f"{type(out).__name__}"
                    )
        if not normalize:
            return outputs
    try:
        return normalize_outputs(outputs, generation)
    except EncodeError as exc:
        raise OutputError(str(exc)) from None


# --- the container ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Send:
    """Send these frames (as the DEALER sees them) on the current socket."""

    frames: Frames


@dataclass(frozen=True, slots=True)
class Predict:
    """Run the model on this request (off the socket's thread), then call ``respond``."""

    request: PredictRequest


@dataclass(frozen=True, slots=True)
class Reconnect:
    """The session is over: close the socket and start a new session on a new one."""

    reason: str


class ContainerSession:
    """One DEALER socket's life of a model container (sans-IO).

    Call :meth:`start` once the socket is connected, :meth:`receive` with every inbound
    message, :meth:`tick` when :meth:`deadline` passes (or whenever the loop wakes), and
    :meth:`respond` with the model's outputs.  Each returns a list of actions:
    :class:`Send`, :class:`Predict` or :class:`Reconnect`.  A :class:`VersionMismatch` is
    raised by :meth:`receive` when the peer turns out to speak another generation: when its
    first messages read as another generation only.  Once it has sent a valid message of this
    one (:attr:`heard`, or a request), such a message is malformed: logged and dropped.
    """

    def __init__(
        self,
        generation: Generation | str,
        registration: NewContainer,
        *,
        poll_interval: float = DEFAULT_POLL_INTERVAL,
        activity_timeout: float = DEFAULT_ACTIVITY_TIMEOUT,
        now: float = 0.0,
    ) -> None:
        self.generation = as_generation(generation)
        self.registration = registration
        self.poll_interval = check_seconds("poll_interval", poll_interval)
        self.activity_timeout = check_seconds("activity_timeout", activity_timeout)
        #: "waiting" (no answer yet), "registering" (metadata sent), "registered", "closed"
        self.state = "waiting"
        self.last_received = now
        self.last_sent = now
        self.requests = 0
        #: the peer sent a valid message of this generation (requests count too)
        self.heard = False
        self._heartbeat = (
            None if self.generation is _G2016 else encode(Heartbeat(), self.generation)
        )

    @property
    def heartbeats(self) -> bool:
        return self.generation is not Generation.G2016

    def _send(self, frames: Frames, now: float) -> Send:
        self.last_sent = now
        return _new_send(frames)

    def _register(self, now: float) -> Send:
        self.state = "registered" if not self.heartbeats else "registering"
        return self._send(encode(self.registration, self.generation), now)

    def start(self, now: float) -> list[Send]:
        """What to send first: 2016 registers at once, 2017/v3 send a heartbeat."""
        self.last_received = self.last_sent = now
        if not self.heartbeats:
            return [self._register(now)]
        return [self._send(cast(list[bytes], self._heartbeat), now)]  # heartbeats: made

    def deadline(self) -> float:
        """When :meth:`tick` next has something to do (``inf`` for 2016)."""
        if self._heartbeat is None or self.state == "closed":
            return float("inf")
        return min(self.last_sent + self.poll_interval, self.last_received + self.activity_timeout)

    def tick(self, now: float) -> list[Send | Reconnect]:
        """Heartbeat after D seconds without sending; end the session after TO of silence."""
        if not self.heartbeats or self.state == "closed":
            return []
        if now - self.last_received >= self.activity_timeout:
            self.state = "closed"
            return [Reconnect(f"nothing received for {now - self.last_received:.3g} s")]
        if now - self.last_sent >= self.poll_interval:
            return [self._send(cast(list[bytes], self._heartbeat), now)]  # heartbeats: made
        return []

    def receive(self, frames: Sequence[Any], now: float) -> list[Send | Predict | Reconnect]:
        """Handle one inbound message; malformed ones are logged and dropped."""
        if self.state == "closed":
            return []
        try:
            msg = decode(frames, self.generation, _TO_CONTAINER)
        except DecodeError as exc:
            mismatch = _classify(frames, self.generation, Direction.TO_CONTAINER, exc)
            if mismatch is not None and not (self.heard or self.requests):
                raise mismatch from None
            if mismatch is not None:
                log.warning(
                    "clipper container: dropped a malformed message (it reads as "
                    "Clipper RPC %s, but this peer spoke %s before): %s",
                    " or ".join(g.value for g in mismatch.found),
                    self.generation.value,
                    exc,
                )
            else:
                log.warning("clipper container: dropped a malformed message: %s", exc)
            return []
        if type(msg) is PredictRequest:
            self.request_received(now)
            return [_new_predict(msg)]
        self.heard = True
        self.last_received = now
        if type(msg) is HeartbeatReply:
            if msg.heartbeat_type == HeartbeatType.REQUEST_CONTAINER_METADATA:
                if self.state == "registered":
                    # The peer forgot us (restarted or expired us): start clean.
                    self.state = "closed"
                    return [Reconnect("the peer asked for metadata again (restarted?)")]
                if self.state == "registering":
                    log.warning(
                        "clipper container: metadata requested again; the peer did not "
                        "accept the registration of %s:%s (sending it again)",
                        self.registration.model_name,
                        self.registration.model_version,
                    )
                return [self._register(now)]
            if self.state == "registering":
                self.state = "registered"
            elif self.state == "waiting":
                log.warning("clipper container: keep-alive before registering; waiting")
            return []
        log.warning("clipper container: unexpected %s from the peer, ignored", type(msg).__name__)
        return []

    def request_received(self, now: float) -> None:
        """A request of this generation came at ``now`` (:meth:`receive` calls this; so does
        a runtime that decoded the request itself, while the session is not closed)."""
        self.heard = True
        self.last_received = now
        if self.state != "registered":
            # The peer knows us (it routes work here): count that as registered.
            self.state = "registered"
        self.requests += 1

    def response_sent(self, now: float) -> None:
        """A response was sent at ``now`` by a runtime that encoded it itself (the frames
        :meth:`respond` would return, for outputs it accepts)."""
        self.last_sent = now

    def respond(self, request: PredictRequest, outputs: Any, now: float) -> list[Send]:
        """The response frames for ``request``; :class:`OutputError` if ``outputs`` are bad."""
        checked = check_outputs(outputs, len(request.inputs), self.generation, normalize=False)
        if self.state == "closed":
            return []
        if self.generation is not _G2016:
            checked = outputs.tolist() if isinstance(outputs, np.ndarray) else outputs
        try:
            frames = encode(_new_response(request.msg_id, checked), self.generation)
        except EncodeError as exc:
            raise OutputError(str(exc)) from None
        return [self._send(frames, now)]


# --- the frontend -------------------------------------------------------------------------------


@dataclass(eq=False, slots=True)
class Replica:
    """A registered container as the frontend sees it."""

    identity: bytes
    model_name: str
    model_version: str
    input_type: InputType
    replica_id: int
    last_seen: float
    in_flight: dict[int, Batch] = field(default_factory=dict)
    alive: bool = True


@dataclass(eq=False, slots=True)
class Batch:
    """One ``predict`` call: a batch of inputs for a model, waiting or in flight."""

    model_name: str
    inputs: Any
    input_type: InputType | None
    deadline: float
    token: Any
    count: int
    msg_id: int | None = None
    replica: Replica | None = None
    attempts: int = 0
    lost: str = ""


#: Frontend events, handed back to the runtime to complete callers' futures.
@dataclass(frozen=True, slots=True)
class Completed:
    token: Any
    outputs: Any


@dataclass(frozen=True, slots=True)
class Failed:
    token: Any
    error: Exception


_new_send = _quick_new(Send)
_new_predict = _quick_new(Predict)
_new_completed = _quick_new(Completed)
_new_request = _quick_new(PredictRequest)
_new_response = _quick_new(PredictResponse)

_KIND_OF_DTYPE: dict[str, InputType] = {
    np.dtype(v).kind + str(np.dtype(v).itemsize): cast(InputType, k) for k, v in DTYPES.items()
}
#: The same for the dtypes as usually met (one dict lookup, no string building).
_TYPE_OF_DTYPE: dict[np.dtype, InputType] = {
    np.dtype(v): cast(InputType, k) for k, v in DTYPES.items() if np.dtype(v).kind not in "USO"
}


def infer_input_type(inputs: Any) -> InputType | None:
    """The input type the caller's ``inputs`` say they are, or None when they do not say.

    NumPy arrays say it by dtype; ``str`` inputs are strings, ``bytes`` are bytes; plain
    lists of numbers are converted to whatever the container takes.
    """
    if isinstance(inputs, np.ndarray):
        known = _TYPE_OF_DTYPE.get(inputs.dtype)
        if known is not None:
            return known
        if inputs.dtype.kind in "USO":
            return InputType.STRINGS if inputs.dtype.kind == "U" else None
        return _KIND_OF_DTYPE.get(inputs.dtype.kind + str(inputs.dtype.itemsize))
    first = next(iter(inputs), None)
    if isinstance(first, str):
        return InputType.STRINGS
    if isinstance(first, bytes | bytearray | memoryview):
        return InputType.BYTES
    if isinstance(first, np.ndarray) and first.dtype.kind not in "USO":
        return _KIND_OF_DTYPE.get(first.dtype.kind + str(first.dtype.itemsize))
    return None


class FrontendState:
    """The Clipper side of many container connections (sans-IO).

    ``receive(identity, frames, now)`` handles one message from a container and returns the
    ROUTER frames to send (``[identity, "", ...]``).  ``submit`` queues a batch;
    ``dispatch(now)`` sends queued batches to live replicas (least work in flight first,
    at most ``max_in_flight`` each); ``tick(now)`` expires silent containers (heartbeating
    generations), retries the batches they held and fails batches past their deadline.
    Outcomes accumulate in :attr:`events` (:class:`Completed` / :class:`Failed`); the runtime
    drains them.

    :attr:`rejected` names the unregistered peers that spoke another generation (identity ->
    :class:`VersionMismatch`, kept without traceback or frames): at most ``max_rejected``
    (:data:`DEFAULT_MAX_REJECTED`), the oldest forgotten first; a peer that registers leaves
    it.  A registered replica's message of another generation is malformed (logged, dropped).
    """

    def __init__(
        self,
        generation: Generation | str,
        *,
        activity_timeout: float = DEFAULT_ACTIVITY_TIMEOUT,
        check_interval: float | None = None,
        max_in_flight: int = 1,
        on_register: Callable[[Replica], None] | None = None,
        max_rejected: int = DEFAULT_MAX_REJECTED,
    ) -> None:
        if max_in_flight < 1:
            raise ValueError("max_in_flight must be at least 1")
        if max_rejected < 0:
            raise ValueError("max_rejected must be at least 0")
        self.max_rejected = max_rejected
        self.generation = as_generation(generation)
        self.activity_timeout = check_seconds("activity_timeout", activity_timeout)
        self.check_interval = (
            activity_timeout / 3
            if check_interval is None
            else check_seconds("check_interval", check_interval)
        )
        self.max_in_flight = max_in_flight
        self.on_register = on_register
        self.replicas: dict[bytes, Replica] = {}
        self.models: dict[str, list[Replica]] = {}
        self.pending: dict[str, deque[Batch]] = {}
        self.in_flight: dict[int, Batch] = {}
        self.events: list[Completed | Failed] = []
        self.rejected: dict[bytes, VersionMismatch] = {}
        self._replica_ids: dict[str, itertools.count[int]] = {}
        self._next_id = 0
        self._next_check = 0.0
        # Never later than the true next deadline (batches added since the last tick lower
        # it; batches that finish do not raise it): deadline() without a scan per message.
        self._due = 0.0 if self.generation is not Generation.G2016 else float("inf")
        self._hb_type0 = self._hb_type1 = None
        if self.generation is not Generation.G2016:
            self._hb_type0 = encode(HeartbeatReply(HeartbeatType.KEEPALIVE), self.generation)
            self._hb_type1 = encode(
                HeartbeatReply(HeartbeatType.REQUEST_CONTAINER_METADATA), self.generation
            )

    @property
    def heartbeats(self) -> bool:
        return self.generation is not Generation.G2016

    # -- inbound --

    def receive(self, identity: bytes, frames: Sequence[Any], now: float) -> list[Frames]:
        """Handle one message (frames after the identity); return ROUTER messages to send."""
        replica = self.replicas.get(identity)
        try:
            msg = decode(frames, self.generation, _TO_CLIPPER)
        except DecodeError as exc:
            mismatch = _classify(frames, self.generation, Direction.TO_CLIPPER, exc)
            if mismatch is not None and replica is None:
                self._reject(identity, mismatch)
            elif mismatch is not None:  # it registered in this generation: malformed
                log.warning(
                    "clipper frontend: dropped a malformed message from %s (it reads "
                    "as Clipper RPC %s, but it registered in %s): %s",
                    identity.hex(),
                    " or ".join(g.value for g in mismatch.found),
                    self.generation.value,
                    exc,
                )
            else:
                log.warning(
                    "clipper frontend: dropped a malformed message from %s: %s", identity.hex(), exc
                )
            return []
        if replica is not None:
            replica.last_seen = now
        kind = type(msg)
        if kind is PredictResponse:
            response = cast(PredictResponse, msg)  # (the exact class, told the type checker)
            if replica is None:
                log.warning(
                    "clipper frontend: response %d from unregistered peer %s dropped",
                    response.msg_id,
                    identity.hex(),
                )
                return []
            batch = self.complete(identity, response.msg_id, response.outputs, now)
            if batch is not None:
                self.events.append(_new_completed(batch.token, response.outputs))
            else:
                self._response(replica, response)  # unknown id or a wrong count: say so
            # Only this replica's model gained room: nothing to do unless it has a queue.
            return self.dispatch(now) if self.pending.get(replica.model_name) else []
        if kind is Heartbeat:
            # (a heartbeat is decoded only where they exist: both replies are made)
            if replica is None:
                return [[identity, *cast(list[bytes], self._hb_type1)]]
            return [[identity, *cast(list[bytes], self._hb_type0)]]
        if kind is NewContainer:
            if replica is not None:
                log.info("clipper frontend: %s registered again; ignored", identity.hex())
                return []
            self._register(identity, cast(NewContainer, msg), now)
            return self.dispatch(now)
        log.warning("clipper frontend: unexpected %s from %s", kind.__name__, identity.hex())
        return []

    def _reject(self, identity: bytes, mismatch: VersionMismatch) -> None:
        """Remember (and log once) a peer of another generation, within ``max_rejected``."""
        rejected = self.rejected
        if rejected.pop(identity, None) is None:
            log.error("clipper frontend: container %s: %s", identity.hex(), mismatch)
        if self.max_rejected == 0:
            return
        while len(rejected) >= self.max_rejected:
            del rejected[next(iter(rejected))]  # the oldest (dicts keep insertion order)
        rejected[identity] = mismatch

    def _register(self, identity: bytes, msg: NewContainer, now: float) -> None:
        counter = self._replica_ids.setdefault(msg.model_name, itertools.count())
        replica = Replica(
            identity,
            msg.model_name,
            msg.model_version,
            InputType(msg.input_type),
            next(counter),
            now,
        )
        self.replicas[identity] = replica
        self.models.setdefault(msg.model_name, []).append(replica)
        self.rejected.pop(identity, None)
        log.info(
            "clipper frontend: registered %s:%s replica %d (%s inputs) from %s",
            replica.model_name,
            replica.model_version,
            replica.replica_id,
            replica.input_type.name.lower(),
            identity.hex(),
        )
        if self.on_register is not None:
            self.on_register(replica)

    def complete(self, identity: bytes, msg_id: int, outputs: Any, now: float) -> Batch | None:
        """The common answer: replica ``identity`` answered batch ``msg_id``, which it holds,
        with one output per input.  The batch leaves both in-flight maps and is returned;
        its caller is the runtime's to complete (with ``outputs``).  Anything else (an
        unregistered peer, an id it does not hold, a wrong count) returns None with nothing
        changed: :meth:`receive` then reports it."""
        replica = self.replicas.get(identity)
        if replica is None:
            return None
        held = replica.in_flight
        batch = held.get(msg_id)
        if batch is None or len(outputs) != batch.count:
            return None
        del held[msg_id]
        del self.in_flight[msg_id]
        replica.last_seen = now
        return batch

    def _response(self, replica: Replica, msg: PredictResponse) -> None:
        batch = replica.in_flight.pop(msg.msg_id, None)
        if batch is None:
            log.warning(
                "clipper frontend: response to unknown or expired message %d from %s dropped",
                msg.msg_id,
                replica.identity.hex(),
            )
            return
        del self.in_flight[msg.msg_id]
        outputs = msg.outputs
        if len(outputs) != batch.count:
            self.events.append(
                Failed(
                    batch.token,
                    PredictionError(
                        f"model {batch.model_name!r} replica {replica.replica_id} answered "
                        f"{len(outputs)} outputs for {batch.count} inputs"
                    ),
                )
            )
            return
        self.events.append(_new_completed(batch.token, outputs))

    # -- outbound --

    def submit(
        self,
        model_name: str,
        inputs: Any,
        deadline: float,
        token: Any,
        input_type: InputType | None = None,
    ) -> None:
        """Queue a batch of ``inputs`` for ``model_name``; its outcome comes as an event."""
        try:
            count = len(inputs)
        except TypeError:
            self.events.append(
                Failed(
                    token,
                    PredictionError(
                        f"inputs must be a sequence (one item per input), got "
                        f"{type(inputs).__name__}"
                    ),
                )
            )
            return
        if count == 0:
            self.events.append(Failed(token, PredictionError("no inputs")))
            return
        if input_type is None:
            input_type = infer_input_type(inputs)
        batch = Batch(model_name, inputs, input_type, deadline, token, count)
        replicas = self.models.get(model_name)
        if replicas and input_type is not None:
            for r in replicas:  # one live replica taking this type is enough
                if r.input_type == input_type and r.alive:
                    break
            else:
                types = {r.input_type for r in replicas if r.alive}
                if types:
                    self.events.append(Failed(token, _type_error(model_name, types, input_type)))
                    return
        queue = self.pending.get(model_name)
        if queue is None:
            queue = self.pending[model_name] = deque()
        queue.append(batch)
        if deadline < self._due:
            self._due = deadline

    def try_send(
        self,
        model_name: str,
        inputs: Any,
        deadline: float,
        token: Any,
        input_type: InputType | None = None,
    ) -> Any:
        """Send this batch now if nothing waits before it for its model and a live replica
        with room takes its input type: the batch is in flight and the ROUTER message to
        send is returned.  Otherwise None with nothing changed: :meth:`submit` then queues
        the batch or reports what is wrong with it (type, count, encoding).

        The message is a list of frames; the compiled twin may return an object its
        sender writes straight from the input array (its ``frames()`` is that list)."""
        if self.pending.get(model_name) or not self.models.get(model_name):
            return None  # first come, first served
        try:
            count = len(inputs)
        except TypeError:
            return None
        if count == 0:
            return None
        if input_type is None:
            input_type = infer_input_type(inputs)
        replica = self.pick(model_name, input_type)
        if replica is None:
            return None
        msg_id = self._peek_id()
        try:
            frames = encode(_new_request(msg_id, replica.input_type, inputs, 0), self.generation)
        except EncodeError:
            return None
        self._next_id = (msg_id + 1) & 0xFFFFFFFF
        batch = Batch(model_name, inputs, input_type, deadline, token, count, msg_id, replica, 1)
        replica.in_flight[msg_id] = batch
        self.in_flight[msg_id] = batch
        if deadline < self._due:
            self._due = deadline
        return [replica.identity, *frames]

    def pick(self, model_name: str, input_type: InputType | None) -> Replica | None:
        """The live replica of ``model_name`` with room that takes ``input_type`` (any, for
        None) and has the least work in flight (the first registered of equals)."""
        best = None
        for r in self.models.get(model_name, ()):
            if not r.alive or len(r.in_flight) >= self.max_in_flight:
                continue
            if input_type is not None and r.input_type != input_type:
                continue
            if best is None or len(r.in_flight) < len(best.in_flight):
                best = r
        return best

    def _peek_id(self) -> int:
        """The next message id not in flight (ids wrap at 2**32), not yet taken."""
        msg_id = self._next_id
        while msg_id in self.in_flight:
            msg_id = (msg_id + 1) & 0xFFFFFFFF
        return msg_id

    def _new_id(self) -> int:
        msg_id = self._peek_id()
        self._next_id = (msg_id + 1) & 0xFFFFFFFF
        return msg_id

    def dispatch(self, now: float) -> list[Frames]:
        """Send queued batches to replicas with room; return the ROUTER messages."""
        out: list[Frames] = []
        for model_name, queue in self.pending.items():
            while queue:
                batch = queue[0]
                replica = self.pick(model_name, batch.input_type)
                if replica is None:
                    types = {r.input_type for r in self.models.get(model_name, ()) if r.alive}
                    if types and batch.input_type is not None and batch.input_type not in types:
                        queue.popleft()
                        self.events.append(
                            Failed(batch.token, _type_error(model_name, types, batch.input_type))
                        )
                        continue
                    break
                queue.popleft()
                msg_id = self._new_id()
                try:
                    frames = encode(
                        _new_request(msg_id, replica.input_type, batch.inputs, 0),
                        self.generation,
                    )
                except EncodeError as exc:
                    self.events.append(
                        Failed(
                            batch.token,
                            PredictionError(
                                f"cannot send these inputs to model {model_name!r} "
                                f"({replica.input_type.name.lower()} inputs): {exc}"
                            ),
                        )
                    )
                    continue
                batch.msg_id, batch.replica = msg_id, replica
                batch.attempts += 1
                replica.in_flight[msg_id] = batch
                self.in_flight[msg_id] = batch
                out.append([replica.identity, *frames])
        return out

    # -- time --

    def deadline(self) -> float:
        """When :meth:`tick` next may have work (expiry check or a batch deadline); never
        later than the true time, at times earlier (a tick then finds nothing to do)."""
        return self._due

    def _soonest(self) -> float:
        soonest = self._next_check if self._hb_type0 is not None else float("inf")
        for queue in self.pending.values():
            for batch in queue:
                soonest = min(soonest, batch.deadline)
        for batch in self.in_flight.values():
            soonest = min(soonest, batch.deadline)
        return soonest

    def tick(self, now: float) -> list[Frames]:
        """Expire silent containers, fail late batches, dispatch; return messages to send."""
        out: list[Frames] = []
        if self.heartbeats and now >= self._next_check:
            self._next_check = now + self.check_interval
            for replica in list(self.replicas.values()):
                silent = now - replica.last_seen
                if silent > self.activity_timeout:
                    out.extend(self.remove(replica.identity, f"silent for {silent:.3g} s", now))
        for msg_id, batch in list(self.in_flight.items()):
            if now >= batch.deadline:
                del self.in_flight[msg_id]
                if batch.replica is not None:
                    batch.replica.in_flight.pop(msg_id, None)
                self.events.append(Failed(batch.token, self._timeout_error(batch)))
        for queue in self.pending.values():
            if any(now >= b.deadline for b in queue):
                keep: deque[Batch] = deque()
                for batch in queue:
                    if now >= batch.deadline:
                        self.events.append(Failed(batch.token, self._timeout_error(batch)))
                    else:
                        keep.append(batch)
                queue.clear()
                queue.extend(keep)
        out.extend(self.dispatch(now))
        self._due = self._soonest()
        return out

    def _timeout_error(self, batch: Batch) -> PredictionError:
        if batch.msg_id is not None and batch.replica is not None and not batch.lost:
            replica = batch.replica
            return PredictionError(
                f"model {batch.model_name!r}: no answer to message {batch.msg_id} from replica "
                f"{replica.replica_id} (container {replica.identity.hex()}, "
                f"{replica.model_name}:{replica.model_version}) before the timeout; the "
                f"Clipper RPC has no error response, so a container whose model raised or "
                f"returned bad outputs stays silent: see that container's log"
            )
        live = [r for r in self.models.get(batch.model_name, ()) if r.alive]
        if batch.lost and not live:
            return PredictionError(
                f"model {batch.model_name!r}: {batch.lost}, and no other replica was left "
                f"before the timeout"
            )
        if not live:
            return PredictionError(
                f"model {batch.model_name!r}: no live replica registered before the timeout"
            )
        return PredictionError(
            f"model {batch.model_name!r}: no replica had room for the batch before the timeout"
        )

    def remove(self, identity: bytes, reason: str, now: float) -> list[Frames]:
        """Drop a container (dead or silent); its batches go back to the queue's front."""
        replica = self.replicas.pop(identity, None)
        if replica is None:
            return []
        replica.alive = False
        self.models[replica.model_name].remove(replica)
        log.warning(
            "clipper frontend: removed %s:%s replica %d (%s): %s",
            replica.model_name,
            replica.model_version,
            replica.replica_id,
            identity.hex(),
            reason,
        )
        queue = self.pending.setdefault(replica.model_name, deque())
        for msg_id, batch in sorted(replica.in_flight.items(), reverse=True):
            del self.in_flight[msg_id]
            batch.msg_id = batch.replica = None
            batch.lost = f"replica {replica.replica_id} was lost ({reason})"
            queue.appendleft(batch)
        replica.in_flight.clear()
        return self.dispatch(now)

    def live_replicas(self, model_name: str | None = None) -> list[Replica]:
        """The registered replicas (of one model, or all)."""
        if model_name is None:
            return list(self.replicas.values())
        return [r for r in self.models.get(model_name, ()) if r.alive]


def _type_error(model_name: str, types: set[InputType], given: InputType) -> PredictionError:
    takes = " or ".join(sorted(t.name.lower() for t in types))
    return InputTypeMismatch(
        f"model {model_name!r} takes {takes} inputs; these inputs are {given.name.lower()}"
    )


__all__ = [
    "DEFAULT_ACTIVITY_TIMEOUT",
    "DEFAULT_CHECK_INTERVAL",
    "DEFAULT_MAX_FRAME_SIZE",
    "DEFAULT_MAX_REJECTED",
    "DEFAULT_POLL_INTERVAL",
    "PROTOCOL",
    "Batch",
    "Completed",
    "ContainerSession",
    "Failed",
    "FrontendState",
    "InputTypeMismatch",
    "OutputError",
    "Predict",
    "PredictionError",
    "Reconnect",
    "Replica",
    "Send",
    "VersionMismatch",
    "check_outputs",
    "check_seconds",
    "infer_input_type",
    "zmq_max_frame_size",
]
