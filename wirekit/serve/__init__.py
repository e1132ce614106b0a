"""``wirekit serve``: a request dispatcher in front of MIP and Clipper model servers.

The folders follow a request: it arrives through a front door (:mod:`.doors`: a MIP listener
per model, HTTP/JSON), takes the request path (:mod:`.dispatch`: routing by quota, the cache,
resubmission, the one place its end is decided) to a backend (:mod:`.backends`), and is
recorded from arrival to its end (:mod:`.record`: the store, its journal, the PostgreSQL
replicas).  Around it, :mod:`.control` holds the catalog of models, the metrics, the
controller and its actuators and the Kubernetes manifests.  :mod:`.config` reads and
validates a deployment, :mod:`.service` assembles the parts, opens the doors and stops them;
what the running service tells of itself is :mod:`.observability`'s, whether it can serve
:mod:`.health`'s, the models changed while it serves :mod:`.admin`'s.  :mod:`.cli` is the
command line.
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
