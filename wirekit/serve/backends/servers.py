"""Where a device's model server answers: the address of an ``oip`` or ``tfserving`` row.

A device row names a host and ports; the model's config says which protocol the dispatcher
speaks to it (``grpc``) and under which name the server knows the model (``server_model``).
:func:`server_address` puts the two together, once, for the data plane
(:mod:`.oip`) and the control plane (probes, repository load/unload) alike.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..config import DeviceRow, ModelConfig


@dataclass(frozen=True, slots=True)
class ServerAddress:
    """Where a device's model server answers, and under which name it serves the model."""

    kind: str  #: "oip" or "tfserving"
    host: str
    rest_port: int | None  #: HTTP/1.1 port (None: the model speaks gRPC only)
    grpc_port: int | None  #: gRPC port (None: REST only)
    model: str  #: the model's name on the server

    @property
    def rest_url(self) -> str:
        """``http://host:port`` of the REST API (an IPv6 host bracketed); ValueError when
        the server is reached over gRPC only."""
        if self.rest_port is None:
            raise ValueError(f"{self.kind} server {self.host} has no REST port (gRPC only)")
        return f"http://{_host_part(self.host)}:{self.rest_port}"

    @property
    def grpc_target(self) -> str:
        """``host:port`` of the gRPC API (an IPv6 host bracketed); ValueError when the
        server is reached over REST only."""
        if self.grpc_port is None:
            raise ValueError(f"{self.kind} server {self.host} has no gRPC port (REST only)")
        return f"{_host_part(self.host)}:{self.grpc_port}"


def _host_part(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def server_address(row: DeviceRow, model: ModelConfig) -> ServerAddress:
    """The server of ``row`` (an ``oip`` or ``tfserving`` row of ``model``).

    ``model.grpc`` false: the REST port is ``row.port``, the gRPC port ``row.grpc_port``
    (if any).  ``model.grpc`` true: the gRPC port is ``row.grpc_port``, else ``row.port``;
    the REST port is ``row.port`` when a separate gRPC port is given, else None."""
    if model.grpc:
        grpc_port = row.grpc_port or row.port
        rest_port = row.port if row.grpc_port else None
    else:
        rest_port, grpc_port = row.port, row.grpc_port
    return ServerAddress(
        kind=row.backend,
        host=row.endpoint,
        rest_port=rest_port,
        grpc_port=grpc_port,
        model=model.server_model or model.name,
    )
