"""Type stub of the Cython twin of ``wirekit.clipper.frontend``'s per-message path (its
``Callback``, the frontend session's ``pick``/``try_send``/``complete``, and the ROUTER's
``Wire``)."""

from collections.abc import Callable
from typing import Any

import numpy as np
import zmq
from typing_extensions import disjoint_base

from wirekit.clipper import session as _session
from wirekit.clipper.messages import InputType
from wirekit.clipper.session import Batch, Replica

ANSWERED: int
ANSWERED_QUEUE_WAITS: int

@disjoint_base
class Callback:
    """The token of one ``Frontend.submit_callback``."""

    def __init__(self, fn: Callable[[Any, BaseException | None], Any]) -> None: ...
    def done(self) -> bool: ...
    def set_result(self, value: Any) -> None: ...
    def set_exception(self, error: BaseException) -> None: ...

class FrontendState(_session.FrontendState):
    """``wirekit.clipper.session.FrontendState`` with ``pick``, ``try_send`` and
    ``complete`` compiled."""

    def complete(self, identity: bytes, msg_id: int, outputs: Any, now: float) -> Batch | None: ...
    def pick(self, model_name: str, input_type: InputType | None) -> Replica | None: ...
    def try_send(
        self,
        model_name: str,
        inputs: Any,
        deadline: float,
        token: Any,
        input_type: InputType | None = None,
    ) -> Any: ...

@disjoint_base
class ArrayRequest:
    """A v3 predict request of one array, framed by the :class:`Wire` that sends it."""

    @property
    def identity(self) -> bytes: ...
    @property
    def msg_id(self) -> int: ...
    @property
    def input_type(self) -> int: ...
    @property
    def inputs(self) -> np.ndarray: ...
    def __init__(
        self, identity: bytes, msg_id: int, input_type: int, inputs: np.ndarray
    ) -> None: ...
    def frames(self) -> list[bytes]: ...

@disjoint_base
class Wire:
    """The frontend's ROUTER, moved on libzmq directly."""

    @property
    def sock(self) -> zmq.Socket[Any]: ...
    @property
    def direct(self) -> tuple[type, ...]: ...
    @property
    def later(self) -> list[tuple[Any, Any]]: ...
    def __init__(
        self, sock: zmq.Socket[Any], direct: tuple[type, ...], later: list[tuple[Any, Any]]
    ) -> None: ...
    def send(self, message: list[Any] | ArrayRequest) -> None: ...
    def receive(
        self, state: FrontendState, block: bool, spin: float
    ) -> int | tuple[list[bytes], int] | None: ...
