"""Type stub of the Cython twin of ``wirekit.serve.record.writer.merge_ops`` (the store
writer's batch of journal operations merged into INSERTs and UPDATEs)."""

from typing import Any

def merge_ops(
    ops: list[tuple[int, tuple[Any, ...]]], chunk: int
) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]], list[tuple[Any, ...]]]: ...
