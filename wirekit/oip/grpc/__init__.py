"""The Open Inference Protocol over gRPC (``inference.GRPCInferenceService``): its messages
(:mod:`.messages`, described by ``oip.proto``) and their conversion to and from wirekit's
OIP types (:mod:`.convert`).  Needs ``protobuf`` (the ``serve`` extra); the door that serves
them is :mod:`wirekit.serve.doors.grpcdoor`."""

from .convert import (
    encode_response,
    metadata_to_grpc,
    parameters_from_grpc,
    parameters_to_grpc,
    request_from_grpc,
    response_to_grpc,
    split_raw_inputs,
)
from .messages import METHODS, PACKAGE, POOL, SERVICE, file_descriptor, message_class

__all__ = [
    "METHODS",
    "PACKAGE",
    "POOL",
    "SERVICE",
    "encode_response",
    "file_descriptor",
    "message_class",
    "metadata_to_grpc",
    "parameters_from_grpc",
    "parameters_to_grpc",
    "request_from_grpc",
    "response_to_grpc",
    "split_raw_inputs",
]
