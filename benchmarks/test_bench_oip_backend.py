"""``wirekit serve`` in front of a real MLServer (backend kind ``oip``) against the same
MLServer asked directly: the quick pytest form of ``bench_oip_backend.py`` (its docstring says
what is measured; ``tests/oip_servers.py`` starts MLServer from its pinned virtualenv).

Rows (group ``oip backend PROTOCOL, N in flight``): ``who`` = ``direct`` (the load generator
straight to MLServer) and ``dispatcher`` (the same requests to ``wirekit serve``, which
forwards them to that MLServer: REST, or gRPC with ``grpc: true``), measured one after the
other, every row in the same run; ``ratios.py`` prints the dispatcher's requests/s as a share
of direct's.  ``extra_info``: ``requests_per_s``, ``p50_us``/``p99_us``, ``server_cpu_us``
(the dispatcher's and MLServer's CPU per request together; direct: MLServer's),
``dispatcher_cpu_us``, ``backend_cpu_us``, ``loadavg`` (the machine's 1-minute load).  No
thresholds: the figures are reported, the script's paired rounds are the ones to quote.

In the quick mode (the default ``--benchmark-max-time``, as CI runs) a round is 200 requests
(50 at 1 in flight) and there are 3; with ``--benchmark-max-time`` of 0.5 s or more, 2000
(500) and 7 rounds.  MLServer's virtualenv is installed from PyPI on first use under CI
(``CI=true``) or ``WIREKIT_PEERS_INSTALL=1``; elsewhere, when missing, the rows skip saying how.
"""

from __future__ import annotations

import io
import os
import sys
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import bench_oip_backend as backend_bench
import oip_servers
import pytest
from oip_fixtures import require_peers

IN_FLIGHT = (1, 32)
SERVER = "mlserver"


@pytest.fixture(scope="module")
def generators() -> Iterator[dict[backend_bench.Row, Any]]:
    """MLServer, the ``wirekit serve`` in front of it, one load generator per row."""
    if not sys.platform.startswith("linux"):
        pytest.skip("the real model servers run on Linux")
    require_peers(SERVER)
    with ExitStack() as stack:
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="wk-oipb-")))
        ns, _reason = oip_servers.open_namespace(stack)  # None: this loopback (MLServer's fine)
        yield stack.enter_context(
            backend_bench.loads(
                ns,
                workdir,
                [SERVER],
                backend_bench.PROTOCOLS,
                IN_FLIGHT,
                raw=False,
                out=io.StringIO(),
            )
        )


def _sizes(config: pytest.Config, in_flight: int) -> tuple[int, int]:
    """(requests a round, rounds): quick unless a measurement run was asked for."""
    max_time = config.getoption("benchmark_max_time", 0.02) or 0.02
    requests, rounds = (2000, 7) if float(max_time) >= 0.5 else (200, 3)
    return backend_bench.requests_for(requests, in_flight), rounds


@pytest.mark.parametrize("who", ["direct", "dispatcher"])
@pytest.mark.parametrize("in_flight", IN_FLIGHT)
@pytest.mark.parametrize("protocol", backend_bench.PROTOCOLS)
def test_oip_backend(benchmark, pytestconfig, generators, protocol, in_flight, who):
    """A [1,16] FP32 tensor echoed by MLServer, directly or through ``wirekit serve``."""
    benchmark.group = f"oip backend {SERVER} {protocol}, {in_flight} in flight"
    path = "direct" if who == "direct" else "through"
    load = generators[backend_bench.Row(SERVER, protocol, in_flight, path)]
    requests, rounds = _sizes(pytestconfig, in_flight)
    results: list[dict[str, Any]] = []
    benchmark.pedantic(lambda: results.append(load.round(requests)), rounds=rounds, iterations=1)
    results.sort(key=lambda r: r["elapsed_s"])
    middle = results[len(results) // 2]
    dispatcher_us, backend_us = middle["cpu_us_by_process"]
    benchmark.extra_info.update(
        requests_per_s=round(requests / middle["elapsed_s"], 1),
        p50_us=middle["p50_us"],
        p99_us=middle["p99_us"],
        server_cpu_us=round(backend_us + (dispatcher_us if path == "through" else 0), 2),
        dispatcher_cpu_us=round(dispatcher_us, 2),
        backend_cpu_us=round(backend_us, 2),
        loadavg=round(os.getloadavg()[0], 2),
    )
