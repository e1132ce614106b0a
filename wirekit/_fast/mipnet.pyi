"""Type stub of the Cython twin of ``wirekit.mip.runtime``'s per-request helpers
(``_flatten_py``, ``_new_inference_py``, ``_singles_py``, ``_start_py``, ``_deliver_py``)."""

from collections.abc import Callable, Iterable
from typing import Any

from wirekit.mip.messages import Inference, Item

def bind(
    item: type[Item],
    inference: type[Inference],
    to_item: Callable[[Any], Item],
    ragged: type[Exception],
    single: tuple[type, ...],
    text: int,
) -> None: ...
def flatten(samples: Iterable[Any]) -> tuple[tuple[Item, ...], int, int]: ...
def new_inference(
    response: bool, n_input: int, n_output: int, batch_size: int, items: tuple[Item, ...]
) -> Inference: ...
def singles(items: tuple[Item, ...]) -> tuple[tuple[Item], ...]: ...
def start(coro: Any) -> tuple[bool, Any]: ...
def deliver(data: bytes, waiting: Any, max_size: int) -> tuple[int, int]: ...
