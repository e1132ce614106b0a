"""``wirekit serve``: a request dispatcher in front of MIP and Clipper model servers.

Requests come in through a MIP listener per model or HTTP/JSON, go to a device chosen by quota
(:mod:`.router`), are recorded in a SQLite store (:mod:`.store`), answered from a cache when
possible (:mod:`.cache`) and resubmitted elsewhere when a device times out or refuses
(:mod:`.dispatcher`).  Metrics (:mod:`.metrics`) are served at ``/metrics`` and ``/stats``.
The modules that open sockets are :mod:`.service`, :mod:`.mipfront`, :mod:`.http` and
:mod:`.backends`; the others import without asyncio or aiohttp.
"""

from __future__ import annotations

from .config import ConfigError, Deployment, DeviceRow, ModelConfig, load_config, parse_config

__all__ = [
    "ConfigError",
    "Deployment",
    "DeviceRow",
    "ModelConfig",
    "load_config",
    "parse_config",
]
