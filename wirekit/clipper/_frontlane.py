"""The frontend's per-message lane: the common answer and the common submission, done whole.

Most of what a busy :class:`~wirekit.clipper.frontend.Frontend` does is the same two things:
a registered replica answers a batch it holds, and a caller (often that answer's callback)
submits the next batch for a model with no queue and a replica with room.  The lane does each
in one call, on the thread that drives the sockets, with the same bookkeeping as
:class:`~wirekit.clipper.session.FrontendState` (which stays the reference: the lane hands
everything else back to it untouched):

* :meth:`FrontLane.answer` takes a ROUTER message; a well-formed response to a batch the
  sender holds, with one output per input, is matched, the batch leaves both in-flight maps,
  and its caller is completed (a ``submit_callback`` callback or a blocking ``predict`` at
  once; a Future or a query through the state's events, as before).  Anything else (another
  message, a malformed one, an unknown id, a wrong output count) returns ``NOT_MINE`` with
  nothing changed, and the runtime gives it to ``FrontendState.receive``.
* :meth:`FrontLane.receive` reads the next message from the ROUTER and answers it as
  :meth:`FrontLane.answer` would, or hands it over as ``(frames, source fd)``.
* :meth:`FrontLane.submit` sends a batch at once when its model has no queue and a live
  replica with room takes its input type; otherwise it returns False and the batch goes to
  ``FrontendState.submit`` (queues, type errors, encode errors are reported there).

This is the pure twin; ``wirekit._fast.clipperfront`` is the compiled one (same class, same
results), used unless ``WIREKIT_PURE=1``, it is not built, or the Cython ``zio`` twin is not
in use (it reads and writes libzmq's message parts through it).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from wirekit.errors import DecodeError, EncodeError

from . import decode, encode
from ._zio import recv_message
from .messages import Direction, PredictRequest, PredictResponse
from .session import Batch, Completed, FrontendState, infer_input_type

#: :meth:`FrontLane.answer` results.
NOT_MINE, ANSWERED, ANSWERED_QUEUE_WAITS = 0, 1, 2

_TO_CLIPPER = Direction.TO_CLIPPER
log = logging.getLogger("wirekit.clipper.frontend")


class Callback:
    """The token of one ``Frontend.submit_callback``: calls ``fn(outputs, None)`` or
    ``fn(None, error)`` once (no lock, no condition variable: it is completed on the thread
    that drives the sockets); an exception the callback raises is logged."""

    __slots__ = ("_fn",)

    def __init__(self, fn: Callable[[Any, BaseException | None], Any]) -> None:
        self._fn: Callable[[Any, BaseException | None], Any] | None = fn

    def done(self) -> bool:
        return self._fn is None

    def set_result(self, value: Any) -> None:
        self._complete(value, None)

    def set_exception(self, error: BaseException) -> None:
        self._complete(None, error)

    def _complete(self, value: Any, error: BaseException | None) -> None:
        fn, self._fn = self._fn, None
        if fn is not None:
            try:
                fn(value, error)
            except Exception:
                log.exception("clipper frontend: a submit_callback callback raised")


class FrontLane:
    """The per-message lane of one frontend (see the module docstring).

    ``send(frames)`` sends one ROUTER message; :class:`Callback` tokens, and tokens whose
    type is in ``direct``, are completed at once (their ``set_result`` never refuses a
    result), others through ``state.events``.
    """

    def __init__(self, state: FrontendState, send: Any, direct: tuple[type, ...],
                 sock: Any = None) -> None:
        self.state = state
        self.send = send
        self.direct = direct
        self.generation = state.generation
        self.sock = sock

    def receive(self, block: bool, spin: float) -> int | tuple[list[bytes], int] | None:
        """Take the next message from the ROUTER given at construction: ANSWERED or
        ANSWERED_QUEUE_WAITS when it was a common answer (handled), else ``(frames, source
        fd)`` for the general path, or None when none came (nothing waiting without
        ``block``, or RCVTIMEO passed).  With ``block`` and ``spin`` > 0, keep looking that
        long before sleeping."""
        if self.sock is None:
            raise RuntimeError("this lane was made without a socket")
        message = recv_message(self.sock, block, spin)
        if message is None:
            return None
        return self.answer(message[0], time.monotonic()) or message

    def answer(self, frames: list, now: float) -> int:
        """Handle a ROUTER message (identity first) if it is a common answer."""
        state = self.state
        replica = state.replicas.get(frames[0])
        if replica is None or len(frames) < 2:
            return NOT_MINE
        try:
            msg = decode(frames[1:], self.generation, _TO_CLIPPER)
        except DecodeError:
            return NOT_MINE
        if type(msg) is not PredictResponse:
            return NOT_MINE
        held = replica.in_flight
        batch = held.get(msg.msg_id)
        outputs = msg.outputs
        if batch is None or len(outputs) != batch.count:
            return NOT_MINE
        del held[msg.msg_id]
        del state.in_flight[msg.msg_id]
        replica.last_seen = now
        token = batch.token
        if type(token) is Callback:
            token._complete(outputs, None)
        elif type(token) in self.direct:
            token.set_result(outputs)
        else:
            state.events.append(Completed(token, outputs))
        return ANSWERED_QUEUE_WAITS if state.pending.get(replica.model_name) else ANSWERED

    def submit(self, model_name: str, inputs: Any, deadline: float, token: Any,
               input_type: Any) -> bool:
        """Send this batch now if nothing waits before it and a replica has room."""
        state = self.state
        if state.pending.get(model_name):
            return False  # first come, first served
        if not state.models.get(model_name):
            return False
        try:
            count = len(inputs)
        except TypeError:
            return False
        if count == 0:
            return False
        if input_type is None:
            input_type = infer_input_type(inputs)
        batch = Batch(model_name, inputs, input_type, deadline, token, count)
        best = state._pick(model_name, batch)  # the least work in flight
        if best is None:
            return False
        msg_id = state._new_id()
        try:
            frames = encode(PredictRequest(msg_id, best.input_type, inputs, 0), self.generation)
        except EncodeError:  # the state reports it: give the id back
            state._next_id = msg_id
            return False
        batch.msg_id, batch.replica, batch.attempts = msg_id, best, 1
        best.in_flight[msg_id] = batch
        state.in_flight[msg_id] = batch
        if deadline < state._due:
            state._due = deadline
        self.send([best.identity, *frames])
        return True


__all__ = ["ANSWERED", "ANSWERED_QUEUE_WAITS", "NOT_MINE", "Callback", "FrontLane"]
