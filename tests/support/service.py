"""The dispatcher in the test's own process: ``Service(parse_config(doc))`` started, with
the wirekit MIP servers that are its backends; everything stopped on exit, the service
first."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterable
from typing import Any

from wirekit.mip.server import Server
from wirekit.serve.config import parse_config
from wirekit.serve.service import Service


async def start_backend(handler: Any, **options: Any) -> tuple[Server, int]:
    """A wirekit MIP server of ``handler`` on 127.0.0.1, port 0, in the running loop:
    ``(server, port)``."""
    server = Server(handler, **options)
    await server.start("tcp://127.0.0.1:0")
    return server, int(server.address.rsplit(":", 1)[1])


#: a backend of a test's service: a wirekit MIP server, or its ``(server, port)``
Backend = Server | tuple[Server, int]


async def shut_down(backends: Iterable[Backend]) -> None:
    """Shut the ``backends`` down (servers, or ``(server, port)`` pairs), in order."""
    for backend in backends:
        server = backend[0] if isinstance(backend, tuple) else backend
        await server.shutdown()


async def start_service(doc: dict[str, Any], **options: Any) -> Service:
    """``Service(parse_config(doc), **options)``, started (:func:`stop_service` stops
    it)."""
    service = Service(parse_config(doc), **options)
    await service.start()
    return service


async def stop_service(service: Service, backends: Iterable[Backend] = ()) -> None:
    """Stop ``service``, then shut its ``backends`` down."""
    await service.stop()
    await shut_down(backends)


@contextlib.asynccontextmanager
async def running_service(
    doc: dict[str, Any],
    *,
    backends: Iterable[Backend] = (),
    connect_lane: bool = False,
    **options: Any,
) -> AsyncIterator[Service]:
    """``Service(parse_config(doc), **options)``, started; on exit it is stopped, then the
    ``backends`` already running for it are shut down (even when the start failed).
    ``connect_lane``: open every backend's lane connection at the start, so that the lane
    takes the first request too."""
    service = Service(parse_config(doc), **options)
    try:
        await service.start()
        if connect_lane:
            for backend in service.dispatcher.backends.values():
                await backend.lane_client.connect()
        yield service
    finally:
        await stop_service(service, backends)
