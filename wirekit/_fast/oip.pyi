"""Type stub of the Cython twin of ``wirekit.oip._pure`` (the OIP mapping's hot path)."""

from typing import Any

from wirekit.oip.messages import Datatype, InferRequest, Tensor

PROTOCOL: str
MAX_TENSORS: int
DATATYPES: dict[str, Datatype]
BY_CODE: dict[int, Datatype]

def request_to_mip(req: InferRequest, *, rows: bool = False) -> bytes: ...
def response_from_mip(msg: Any, *, rows: bool = False) -> tuple[list[Tensor], dict[str, Any]]: ...
def bytes_framing_ok(data: Any, count: int) -> bool: ...
