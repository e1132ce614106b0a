"""The control plane of ``oip`` and ``tfserving`` backends against a real KServe 0.21.0
``ModelServer`` (in a network namespace of the test's own: KServe binds 0.0.0.0), whose
repository loads models from a folder: probes, load and unload over REST and gRPC (KServe
declares the repository RPCs with ``model_name`` = 1, and answers ``INTERNAL`` to them done
or not), its TF Serving model status, and a load its model fails, with KServe's message."""

from __future__ import annotations

import asyncio
import os

import pytest
from oip_fixtures import require_peers
from oip_servers import BROKEN_MESSAGE, running_kserve

from wirekit.serve.backends import oipcontrol
from wirekit.serve.backends.servers import ServerAddress

pytestmark = pytest.mark.skipif(
    os.environ.get("WIREKIT_PURE") == "1",
    reason="oip control plane: a real model server's process; the dispatcher's general path"
    " has no compiled twin, the pure run has the same code",
)


@pytest.fixture(scope="module")
def kserve(tmp_path_factory: pytest.TempPathFactory):
    """KServe with ``echo`` and ``broken`` in its repository, none loaded: (REST port, gRPC
    port) on this namespace's loopback, relayed into KServe's."""
    require_peers("kserve")
    workdir = tmp_path_factory.mktemp("kserve-repo")
    with running_kserve(workdir, models=("echo", "broken"), loaded=()) as server:
        yield server.local_port("http"), server.local_port("grpc")


@pytest.mark.parametrize("transport", ["rest", "grpc"])
def test_load_probe_unload(kserve, transport):
    http, grpc = kserve

    def at(model: str, kind: str = "oip") -> ServerAddress:
        if transport == "rest":
            return ServerAddress(kind, "127.0.0.1", http, None, model)
        return ServerAddress(kind, "127.0.0.1", None, grpc, model)

    async def scenario():
        before = await oipcontrol.probe(at("echo"), 10)
        await oipcontrol.load(at("echo"), 60)
        loaded = await oipcontrol.probe(at("echo"), 10)
        tfserving = await oipcontrol.probe(
            ServerAddress("tfserving", "127.0.0.1", http, None, "echo"), 10
        )
        await oipcontrol.unload(at("echo"), 10)
        after = await oipcontrol.probe(at("echo"), 10)
        with pytest.raises(oipcontrol.RepositoryError) as info:
            await oipcontrol.load(at("broken"), 60)
        return before, loaded, tfserving, after, str(info.value)

    before, loaded, tfserving, after, broken = asyncio.run(scenario())
    where = oipcontrol.where(at("echo"))
    assert before == after
    assert before.startswith(f"{where}: model 'echo' not ready (")
    assert "Model with name echo does not exist" in before
    assert (loaded, tfserving) == (None, None)
    assert broken.startswith(f"{where}: load of model 'broken' refused: ")
    if transport == "rest":  # over gRPC KServe 0.21 loses its model's message on the way
        assert BROKEN_MESSAGE in broken


def test_tfserving_status_of_a_model_not_loaded(kserve):
    http, _grpc = kserve
    at = ServerAddress("tfserving", "127.0.0.1", http, None, "broken")
    why = asyncio.run(oipcontrol.probe(at, 10))
    assert why is not None and why.startswith(f"127.0.0.1:{http}: model 'broken' not ready (")
