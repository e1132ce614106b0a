"""Type stub of the Cython twin of ``wirekit.serve.record.journal``'s ``arrival_records`` and
``ok_records`` (the journal lines and store operations of a batch of requests)."""

from collections.abc import Callable
from typing import Any

def bind(
    json_time: Callable[[Any], str], json_num: Callable[[Any], str], json_blob: Callable[[Any], str]
) -> None: ...
def arrival_records(
    requests: list[tuple[str, int, Any]],
    model: str,
    client: str,
    time_in: float,
    names: str,
    tin: str,
    journal: bool,
    payloads: bool,
) -> tuple[list[str], int, list[tuple[int, tuple[Any, ...]]]]: ...
def ok_records(
    answers: list[tuple[str, str, float, int, int, Any]],
    time_out: float,
    tout: str,
    names_of: Callable[[str], str],
    journal: bool,
    payloads: bool,
) -> tuple[list[str], int, list[tuple[int, tuple[Any, ...]]]]: ...
