"""What a model declares about its tensors, and the OIP metadata documents built from it.

A model of ``wirekit serve`` may declare its inputs and outputs in its config table
(``models.<name>.inputs`` / ``outputs``: each ``{name, datatype, shape}``, -1 for a
dimension of any size): :class:`TensorSpec`.  Every door that takes tensors (OIP REST and
gRPC, TF Serving's REST API) checks a request against them with :func:`check_inputs`, and
answers the model's metadata with :func:`model_metadata`; :func:`server_metadata` is the
server's.  A model that declares no inputs is not checked beyond its tensors' own
consistency.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import wirekit
from wirekit.errors import DecodeError

from .messages import InferRequest, Tensor
from .tensors import check_tensor

if TYPE_CHECKING:  # the config imports this module: no import of it at run time
    from wirekit.serve.config import ModelConfig

#: the name ``wirekit serve`` gives itself in the OIP server metadata
SERVER_NAME = "wirekit"
#: the OIP extensions ``wirekit serve`` implements (server metadata's ``extensions``)
EXTENSIONS = ("binary_tensor_data",)
#: a shape dimension that takes any size
ANY_SIZE = -1


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """One declared input or output of a model: its name, its OIP datatype (a key of
    :data:`~wirekit.oip.DATATYPES`) and its shape, whose -1 dimensions take any size."""

    name: str
    datatype: str
    shape: tuple[int, ...]

    def document(self) -> dict[str, Any]:
        """The tensor as OIP's model metadata lists it: ``{name, datatype, shape}``."""
        return {"name": self.name, "datatype": self.datatype, "shape": list(self.shape)}

    def shape_fits(self, shape: Sequence[int]) -> bool:
        """Whether a tensor of ``shape`` has this spec's shape (its -1 dimensions any size)."""
        return len(shape) == len(self.shape) and all(
            want in (ANY_SIZE, got) for want, got in zip(self.shape, shape, strict=True)
        )


def _shape_text(shape: Sequence[int]) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def check_tensor_against(spec: TensorSpec, tensor: Tensor, role: str = "input") -> str | None:
    """Why ``tensor`` is not what ``spec`` declares (its datatype, then its shape), or None."""
    if tensor.datatype != spec.datatype:
        return f"{role} {spec.name!r}: expected datatype {spec.datatype}, got {tensor.datatype}"
    if not spec.shape_fits(tensor.shape):
        return (
            f"{role} {spec.name!r}: expected shape {_shape_text(spec.shape)},"
            f" got {_shape_text(tensor.shape)}"
        )
    return None


def check_inputs(model: ModelConfig, req: InferRequest) -> str | None:
    """The message of the 400 (gRPC INVALID_ARGUMENT) that refuses ``req`` for ``model``, or
    None when it may be submitted.

    Against the model's declared inputs (none declared: not checked): an input it does not
    declare, one given twice, one missing, a wrong datatype or a wrong shape, each naming the
    tensor.  Then each tensor's data against its own datatype and shape
    (:func:`~wirekit.oip.check_tensor`: its byte count, its BYTES framing), declared or not."""
    declared = {spec.name: spec for spec in model.inputs}
    given: set[str] = set()
    for tensor in req.inputs:
        if tensor.name in given:
            return f"input {tensor.name!r} is given twice"
        given.add(tensor.name)
        if declared:
            spec = declared.get(tensor.name)
            if spec is None:
                names = ", ".join(declared)
                return f"unknown input {tensor.name!r} (the model's inputs: {names})"
            problem = check_tensor_against(spec, tensor)
            if problem is not None:
                return problem
        try:
            check_tensor(tensor)
        except DecodeError as exc:
            return exc.reason
    missing = [name for name in declared if name not in given]
    if missing:
        return f"missing input {missing[0]!r} (the model's inputs: {', '.join(declared)})"
    return None


def model_metadata(model: ModelConfig) -> dict[str, Any]:
    """OIP's model metadata document of ``model`` (``GET /v2/models/NAME``, gRPC
    ModelMetadata): name, versions (as strings), platform, inputs and outputs."""
    return {
        "name": model.name,
        "versions": [str(version) for version in model.versions],
        "platform": model.platform,
        "inputs": [spec.document() for spec in model.inputs],
        "outputs": [spec.document() for spec in model.outputs],
    }


def server_metadata() -> dict[str, Any]:
    """OIP's server metadata document (``GET /v2``, gRPC ServerMetadata)."""
    return {
        "name": SERVER_NAME,
        "version": wirekit.__version__,
        "extensions": list(EXTENSIONS),
    }


__all__ = [
    "ANY_SIZE",
    "EXTENSIONS",
    "SERVER_NAME",
    "TensorSpec",
    "check_inputs",
    "check_tensor_against",
    "model_metadata",
    "server_metadata",
]
