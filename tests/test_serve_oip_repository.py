"""The control plane of ``oip`` backends against a real MLServer 1.7.1 process whose models
are loaded only through its repository API (``load_models_at_startup`` false): probes (REST
and gRPC), ``models add`` with ``load = true`` (loaded, then served through wirekit's door;
a server that fails the load: a per-device error naming the server's reason, nothing
added, what was loaded unloaded again), ``models remove`` (drained, then unloaded where
wirekit loaded it; a model the server had already is left loaded), config models loaded at
start, and the ``repository`` actuator (a GPU share of 0 unloads, above 0 loads).

wirekit serve is itself an OIP server but has no repository extension, hence MLServer.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import subprocess
import sys

import aiohttp
import pytest
from oip_fixtures import require_peers
from oip_servers import BROKEN_MESSAGE, Server, running_mlserver
from serve_support import deployment
from support.service import running_service

from wirekit.cli import main as wirekit_main
from wirekit.serve.backends import oipcontrol
from wirekit.serve.backends.servers import ServerAddress
from wirekit.serve.config import ConfigError, parse_config
from wirekit.serve.service import Service

pytestmark = pytest.mark.skipif(
    os.environ.get("WIREKIT_PURE") == "1",
    reason="oip control plane: a real model server's process; the dispatcher's general path"
    " has no compiled twin, the pure run has the same code",
)

#: a port where nothing listens (a device whose server is down)
DEAD_PORT = 9
TOKEN = "repository-test-token"
ECHO_REQUEST = {
    "inputs": [{"name": "input0", "shape": [1, 3], "datatype": "FP32", "data": [1.5, 2.0, 3.25]}]
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    """MLServer with ``echo`` and ``broken`` in its model folder, none loaded."""
    require_peers("mlserver")
    workdir = tmp_path_factory.mktemp("mlserver-repo")
    with running_mlserver(
        workdir, models=("echo", "broken"), who="mlserver-repo", load_at_startup=False
    ) as running:
        yield running


def rest(server: Server, model: str = "echo") -> ServerAddress:
    return ServerAddress("oip", "127.0.0.1", server.ports["http"], None, model)


def grpc_only(server: Server, model: str = "echo") -> ServerAddress:
    return ServerAddress("oip", "127.0.0.1", None, server.ports["grpc"], model)


def ready(server: Server, model: str = "echo") -> bool:
    return asyncio.run(oipcontrol.model_ready(rest(server, model), 10))


def unload_if_loaded(server: Server, model: str = "echo") -> None:
    if ready(server, model):
        asyncio.run(oipcontrol.unload(rest(server, model), 10))


def base_doc(tmp_path, models: dict | None = None, at: dict | None = None, **top) -> dict:
    """A deployment on node n1 (CPU, GPU, GPU) with model ``base`` (MIP, never asked) on
    the CPU, and ``models`` after it, each on the GPUs ``at[name]`` says (device -> port or
    (port, gRPC port), a quota of 1); the admin API on with :data:`TOKEN`; no MIP front
    doors."""
    models = {"base": {}, **(models or {})}
    names = list(models)
    at = {"base": {0: DEAD_PORT}, **(at or {})}
    quotas, ports, grpc_ports = [], [], []
    for device in range(3):
        for name in names:
            port = at.get(name, {}).get(device)
            port, grpc_port = port if isinstance(port, tuple) else (port, None)
            quotas.append(0 if port is None else 0.5 if device == 0 else 1)
            ports.append(port)
            grpc_ports.append(grpc_port)
    node = {
        "id": "n1",
        "endpoint": "127.0.0.1",
        "devices": ["CPU", "GPU", "GPU"],
        "models": names,
        "quotas": quotas,
        "ports": ports,
        "grpc_ports": grpc_ports,
    }
    doc = deployment(tmp_path / "r.db", models, [node], **top)
    for model in doc["models"].values():
        model["port"] = None
    doc["admin"] = {"token": TOKEN}
    return doc


def ports(server: Server) -> tuple[int, int]:
    """The server's (REST, gRPC) ports: requests go over gRPC (``grpc = true``), the
    control plane over REST.  (MLServer's REST API does not take the binary tensor
    extension the REST backend sends.)"""
    return server.ports["http"], server.ports["grpc"]


def place(server: Server, device: int = 1) -> dict:
    """A placement on GPU ``device`` served by ``server`` (REST and gRPC ports)."""
    http, grpc = ports(server)
    return {"node": "n1", "device": device, "quota": 1, "port": http, "grpc_port": grpc}


def add_doc(name: str, placements: list[dict], **model) -> dict:
    return {
        "name": name,
        "model": {"backend": "oip", "load": True, "grpc": True, "load_timeout": 30, **model},
        "placements": placements,
    }


def cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    status = wirekit_main(
        ["serve", "models", *argv, *(["--json"] if argv[0] != "list" else [])], out, err
    )
    return status, out.getvalue(), err.getvalue()


async def door_infer(service: Service, model: str) -> tuple[int, dict]:
    url = f"http://127.0.0.1:{service.addresses()['http']}/v2/models/{model}/infer"
    async with aiohttp.ClientSession() as session, session.post(url, json=ECHO_REQUEST) as r:
        return r.status, await r.json(content_type=None)


# --- probes ---------------------------------------------------------------------------------


@pytest.mark.parametrize("address", [rest, grpc_only], ids=["rest", "grpc"])
def test_probe_says_why_until_the_model_is_loaded(server, address):
    unload_if_loaded(server)
    at = address(server)

    async def scenario():
        before = await oipcontrol.probe(at, 5)
        assert not await oipcontrol.model_ready(at, 5)
        await oipcontrol.load(at, 30)
        after = await oipcontrol.probe(at, 5)
        assert await oipcontrol.model_ready(at, 5)
        await oipcontrol.unload(at, 10)
        return before, after, await oipcontrol.probe(at, 5)

    before, after, unloaded = asyncio.run(scenario())
    where = oipcontrol.where(at)
    assert before.startswith(f"{where}: model 'echo' not ready (")
    assert "echo" in before and "not found" in before.lower()
    assert after is None
    assert unloaded == before


def test_probe_of_a_server_that_is_down_names_it():
    at = ServerAddress("oip", "127.0.0.1", DEAD_PORT, None, "echo")
    assert asyncio.run(oipcontrol.probe(at, 2)) == f"127.0.0.1:{DEAD_PORT}: Connection refused"
    with pytest.raises(oipcontrol.RepositoryError, match=rf"127\.0\.0\.1:{DEAD_PORT}: load"):
        asyncio.run(oipcontrol.load(at, 2))


@pytest.mark.parametrize("address", [rest, grpc_only], ids=["rest", "grpc"])
def test_a_failing_load_carries_the_servers_message(server, address):
    at = address(server, "broken")
    with pytest.raises(oipcontrol.RepositoryError) as info:
        asyncio.run(oipcontrol.load(at, 30))
    text = str(info.value)
    assert text.startswith(f"{oipcontrol.where(at)}: load of model 'broken' refused: ")
    assert BROKEN_MESSAGE in text
    assert not ready(server, "broken")


def test_check_probe_and_readyz_follow_the_server(server, tmp_path):
    """The server up but the model not loaded: not ready (``check --probe`` exits 1,
    ``/readyz`` says why); loaded: ready."""
    unload_if_loaded(server)
    port = server.ports["http"]
    doc = base_doc(tmp_path, {"echo": {"backend": "oip"}}, {"echo": {1: port}})
    config = tmp_path / "deployment.json"
    config.write_text(json.dumps(doc))
    why = f"127.0.0.1:{port}: model 'echo' not ready (HTTP 404: Model echo not found)"

    def check() -> tuple[int, str]:
        out, err = io.StringIO(), io.StringIO()
        status = wirekit_main(["serve", "check", "--config", str(config), "--probe"], out, err)
        return status, out.getvalue()

    async def readyz() -> dict:
        async with running_service(doc) as service:
            return service.health.readiness("echo")

    status, out = check()
    assert status == 1 and f"probe n1/1/echo: UNREACHABLE: {why}\n" in out
    assert asyncio.run(readyz())["models"]["echo"] == {
        "ready": False,
        "devices": {"n1/1": f"unreachable: {why}"},
    }
    asyncio.run(oipcontrol.load(rest(server), 30))
    try:
        status, out = check()
        assert "probe n1/1/echo: reachable\n" in out
        assert status == 1  # model base's MIP backend is down (never started)
        assert asyncio.run(readyz())["models"]["echo"] == {
            "ready": True,
            "devices": {"n1/1": "reachable"},
        }
    finally:
        unload_if_loaded(server)


# --- models add / remove --------------------------------------------------------------------


def test_add_loads_then_serves_and_remove_unloads(server, tmp_path):
    unload_if_loaded(server)

    async def scenario():
        async with running_service(base_doc(tmp_path)) as service:
            added = await service.add_model_doc(add_doc("echo", [place(server)]))
            assert added["loaded"] == {"n1/1/echo": "loaded"}
            assert await oipcontrol.model_ready(rest(server), 5)
            status, answer = await door_infer(service, "echo")
            assert status == 200, answer
            assert answer["outputs"][0]["data"] == [1.5, 2.0, 3.25]
            removed = await service.remove_model("echo")
            assert removed["drained"] is True
            assert removed["unloaded"] == {"n1/1/echo": "unloaded"}
            assert not await oipcontrol.model_ready(rest(server), 5)

    asyncio.run(scenario())


def test_a_model_already_on_the_server_is_left_loaded(server, tmp_path):
    if not ready(server):
        asyncio.run(oipcontrol.load(rest(server), 30))

    async def scenario():
        async with running_service(base_doc(tmp_path)) as service:
            added = await service.add_model_doc(add_doc("echo", [place(server)]))
            assert added["loaded"] == {"n1/1/echo": "already loaded"}
            removed = await service.remove_model("echo")
            assert removed["unloaded"] == {"n1/1/echo": "left loaded (not loaded by wirekit)"}

    try:
        asyncio.run(scenario())
        assert ready(server)
    finally:
        unload_if_loaded(server)


def test_a_failed_load_adds_nothing_and_unloads_what_it_loaded(server, tmp_path):
    """Device 1's server loads the model, device 2's is down: the add fails naming both,
    device 1's load is undone, no route; the CLI exits non-zero with the same text."""
    unload_if_loaded(server)
    port = server.ports["http"]
    places = [place(server), {"node": "n1", "device": 2, "quota": 1, "port": DEAD_PORT}]

    async def scenario():
        async with running_service(base_doc(tmp_path)) as service:
            url = f"http://127.0.0.1:{service.addresses()['http']}"
            status, _out, err = await asyncio.to_thread(
                cli, "add", "--url", url, "--token", TOKEN, str(write(add_doc("echo", places)))
            )
            assert "echo" not in service.catalog
            assert not await oipcontrol.model_ready(rest(server), 5)
            code, answer = await door_infer(service, "echo")
            assert code == 404, answer
            # a model whose load the server itself fails: its message, per device
            broken = add_doc("broken", places[:1])
            with pytest.raises(oipcontrol.ModelLoadError) as info:
                await service.add_model_doc(broken)
            assert "broken" not in service.catalog
            return status, err, info.value

    def write(doc: dict):
        path = tmp_path / "add.json"
        path.write_text(json.dumps(doc))
        return path

    status, err, broken = asyncio.run(scenario())
    assert status != 0
    assert "HTTP 502: model 'echo' not added: its load failed on 1 of 2 device(s): " in err
    assert "n1/1/echo: loaded (then unloaded)" in err
    dead = f"n1/2/echo: failed: 127.0.0.1:{DEAD_PORT} (gRPC): cannot be asked: UNAVAILABLE: "
    assert dead in err and "Connection refused" in err
    assert str(broken).startswith(
        "model 'broken' not added: its load failed on 1 of 1 device(s): n1/1/broken: failed:"
        f" 127.0.0.1:{port}: load of model 'broken' refused: HTTP "
    )
    assert BROKEN_MESSAGE in str(broken)
    assert broken.results["n1/1/broken"].startswith("failed: ")


def test_the_cli_prints_what_each_device_did(server, tmp_path):
    unload_if_loaded(server)

    async def scenario():
        async with running_service(base_doc(tmp_path)) as service:
            url = f"http://127.0.0.1:{service.addresses()['http']}"
            common = ("--url", url, "--token", TOKEN)
            path = tmp_path / "add.json"
            path.write_text(json.dumps(add_doc("echo", [place(server)])))
            added = await asyncio.to_thread(cli, "add", *common, str(path))
            listed = await asyncio.to_thread(cli, "list", *common)
            removed = await asyncio.to_thread(cli, "remove", *common, "echo")
            return added, listed, removed

    (s1, out1, err1), (s3, listed, _), (s2, out2, err2) = asyncio.run(scenario())
    assert (s1, s2, s3) == (0, 0, 0), (err1, err2)
    http = server.ports["http"]
    assert f"  n1/1    GPU quota 1      127.0.0.1:{http} (loaded)\n" in listed
    assert json.loads(out1)["added"]["loaded"] == {"n1/1/echo": "loaded"}
    assert json.loads(out2)["unloaded"] == {"n1/1/echo": "unloaded"}
    assert not ready(server)


# --- at start, and the repository actuator --------------------------------------------------


def test_config_models_load_at_start_or_the_service_does_not_start(server, tmp_path):
    unload_if_loaded(server)
    good = {"echo": {"backend": "oip", "load": True, "grpc": True}}
    bad = {
        "echo": {"backend": "oip", "load": True, "grpc": True},
        "broken": {"backend": "oip", "load": True, "grpc": True},
    }

    async def refused():
        doc = base_doc(tmp_path, bad, {"echo": {1: ports(server)}, "broken": {2: ports(server)}})
        service = Service(parse_config(doc))
        with pytest.raises(ConfigError) as info:
            await service.start()
        return info.value

    error = asyncio.run(refused())
    assert error.where == "models.broken.load"
    assert "the service does not start: model 'broken' not added" in str(error)
    assert BROKEN_MESSAGE in str(error)
    assert not ready(server)  # echo, loaded first, was unloaded again

    async def started():
        doc = base_doc(tmp_path, good, {"echo": {1: ports(server)}})
        async with running_service(doc) as service:
            assert service.admin.models_doc()["models"]["echo"]["loaded"] == {"n1/1/echo": "loaded"}
            status, answer = await door_infer(service, "echo")
            assert status == 200, answer
            return (await service.remove_model("echo"))["unloaded"]

    assert asyncio.run(started()) == {"n1/1/echo": "unloaded"}
    assert not ready(server)


def test_the_repository_actuator_unloads_at_zero_and_loads_above(server, tmp_path):
    unload_if_loaded(server)
    doc = base_doc(
        tmp_path,
        {"echo": {"backend": "oip", "load": True, "grpc": True}},
        {"echo": {1: ports(server)}},
        controller={"period": 3600, "window": 3600, "actuator": {"kind": "repository"}},
    )
    doc["nodes"][0]["ports"][2 * 2 + 1] = DEAD_PORT  # echo on GPU 2: a server that is down

    async def scenario():
        async with running_service(doc) as service:
            assert await oipcontrol.model_ready(rest(server), 5)
            quota = {"node": "n1", "device": 1}
            off = await service.set_quota_doc("echo", {**quota, "quota": 0})
            gone = await oipcontrol.model_ready(rest(server), 5)
            on = await service.set_quota_doc("echo", {**quota, "quota": 1})
            back = await oipcontrol.model_ready(rest(server), 5)
            status, _answer = await door_infer(service, "echo")
            down = await service.set_quota_doc("echo", {"node": "n1", "device": 2, "quota": 1})
            assert service.catalog.quota("n1", 2, "echo") == 0  # rolled back
            removed = await service.remove_model("echo")
            return off, gone, on, back, status, down, removed

    off, gone, on, back, status, down, removed = asyncio.run(scenario())
    assert (off["status"], gone) == ("applied", False)
    assert (on["status"], back, status) == ("applied", True, 200)
    assert down["status"] == "failed"
    assert down["error"].startswith(f"n1/echo: n1/2/echo: failed: 127.0.0.1:{DEAD_PORT}")
    assert removed["unloaded"] == {"n1/1/echo": "unloaded"}
    assert not ready(server)


def test_wirekit_serve_refuses_to_start_when_a_load_fails(server, tmp_path):
    """The real ``wirekit serve`` process: exit 1, the message naming the model, the device
    and the server's reason."""
    doc = base_doc(
        tmp_path,
        {"broken": {"backend": "oip", "load": True, "load_timeout": 30}},
        {"broken": {1: server.ports["http"]}},
    )
    config = tmp_path / "deployment.json"
    config.write_text(json.dumps(doc))
    done = subprocess.run(
        [sys.executable, "-m", "wirekit.cli", "serve", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done.stderr
    assert done.stdout == ""  # no ready line
    assert (
        f"wirekit serve: {config}: models.broken.load: the service does not start: model"
        f" 'broken' not added: its load failed on 1 of 1 device(s): n1/1/broken: failed:"
        f" 127.0.0.1:{server.ports['http']}: load of model 'broken' refused: HTTP "
    ) in done.stderr
    assert BROKEN_MESSAGE in done.stderr
