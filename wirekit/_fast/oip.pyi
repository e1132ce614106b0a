"""Type stub of the Cython twin of ``wirekit.oip._pure`` (the OIP mapping's hot path)."""

from typing import Any

from wirekit.oip.messages import InferRequest, Tensor

def request_to_mip(req: InferRequest, *, rows: bool = False) -> bytes: ...
def response_from_mip(msg: Any, *, rows: bool = False) -> tuple[list[Tensor], dict[str, Any]]: ...
