"""What every HTTP door answers when a request does not end ``ok``: the status a client
reads from an :class:`~wirekit.serve.dispatch.dispatcher.Outcome`, and the 404/410 of a
name that is not served.  Shared by the HTTP/JSON routes (:mod:`.http`), the Open Inference
Protocol's REST routes (:mod:`.oiprest`) and TF Serving's (:mod:`.tfserving`), so that one
outcome gets one status whatever door it came through."""

from __future__ import annotations

from wirekit.mip import ErrorCode, ErrorReply

from ..dispatch.dispatcher import BAD_REQUEST, MODEL_ERROR, TIMED_OUT, Dispatcher, Outcome
from ..record.store import FAILED

#: MIP error codes a backend answers for what the client sent (its shape, its item types):
#: the client's error (400), not the server's
CLIENT_CODES = frozenset({ErrorCode.PROTOCOL, ErrorCode.SUBTYPE, ErrorCode.SHAPE})
#: :attr:`Outcome.cause` values answered 400: the inputs the model does not take, the
#: model's own error message
CLIENT_CAUSES = frozenset({BAD_REQUEST, MODEL_ERROR})


def outcome_status(outcome: Outcome) -> int:
    """The HTTP status of a request that did not end ``ok``, as an HTTP client reads it:
    400 its inputs are not what the model takes, or the model answered its own error (its
    message is ``outcome.detail``, as Triton answers a model's error); 413 the backend
    could not hold them;
    502 the backend failed on them; 503 no device could be reached (nothing listening, none
    left), or the request was refused before it was sent anywhere (its arrival could not be
    journaled: a full disk); 504 the last device tried took too long."""
    if outcome.status == FAILED:
        return 504 if outcome.cause == TIMED_OUT else 503
    if outcome.cause in CLIENT_CAUSES:
        return 400
    msg = outcome.response.message
    if isinstance(msg, ErrorReply):
        if msg.code in CLIENT_CODES:
            return 400
        if msg.code == ErrorCode.MEMORY:
            return 413
    return 502


def outcome_reason(outcome: Outcome) -> str:
    """What a client reads of why a request did not end ``ok``: the outcome's detail, else
    the backend's MIP error by name (``backend error SHAPE``), else the answer it gave."""
    if outcome.detail:
        return outcome.detail
    msg = outcome.response.message
    if isinstance(msg, ErrorReply):
        code = msg.code
        name = ErrorCode(code).name if code in ErrorCode._value2member_map_ else str(code)
        return f"backend error {name}"
    return f"unexpected backend answer: {msg}"


def unknown_name(dispatcher: Dispatcher, name: str, what: str = "model") -> tuple[int, str]:
    """``(status, message)`` for a ``name`` not served: 410 for a model removed while the
    dispatcher runs, else 404 (``what``: what the name names, for the message)."""
    model = dispatcher.removed.get(name)
    if model is not None:
        return 410, f"model {model!r} was removed"
    return 404, f"unknown {what} {name!r}"


__all__ = ["CLIENT_CAUSES", "CLIENT_CODES", "outcome_status", "unknown_name"]
