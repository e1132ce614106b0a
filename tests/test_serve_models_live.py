"""Models added and removed under load, through the real ``wirekit serve`` process and real
``wirekit mip serve`` backends, driven by ``wirekit serve models list|add|remove``: no
request lost or answered twice (checked against the store, payload by payload), requests for
the removed model get the clear error, a share that is not free is refused saying what is,
and the admin API refuses a missing token."""

from __future__ import annotations

import asyncio
import io
import json
import sqlite3
from collections import Counter

import aiohttp
from mip_net import CliServer
from serve_support import DispatcherProcess, answer_of, deployment, run
from support.rows import select

from wirekit import mip
from wirekit.cli import main as wirekit_main
from wirekit.mip.client import AsyncClient
from wirekit.mip.runtime import ConnectionLost, ServerError

TOKEN = "live-test-token"


def cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    status = wirekit_main(
        ["serve", "models", *argv, *(["--json"] if argv[0] != "list" else [])], out, err
    )
    return status, out.getvalue(), err.getvalue()


async def acli(*argv: str) -> tuple[int, str, str]:
    return await asyncio.to_thread(cli, *argv)


class Load:
    """``clients`` connections to a MIP front door, each sending one request after another
    until stopped or refused; what each request got is kept by its payload."""

    def __init__(self, address: str, tag: str, clients: int = 4) -> None:
        self.address = address
        self.tag = tag
        self.ok: list[str] = []  #: payloads answered right
        self.refused: list[tuple[str, str]] = []  #: (payload, why) not taken
        self.stop = asyncio.Event()
        self.tasks = [asyncio.ensure_future(self._client(k)) for k in range(clients)]

    async def _client(self, k: int) -> None:
        n = 0
        try:
            async with AsyncClient(self.address, timeout=10) as c:
                while not self.stop.is_set():
                    value = f"{self.tag}-{k}-{n}"
                    n += 1
                    try:
                        (item,) = await c.infer_one(value)
                    except ServerError as exc:
                        self.refused.append((value, exc.code.name))
                        return
                    except (ConnectionLost, OSError) as exc:
                        self.refused.append((value, type(exc).__name__))
                        return
                    assert answer_of(item.as_text())[1] == value.upper(), item
                    self.ok.append(value)
        except OSError as exc:  # the front door no longer listens
            self.refused.append(("", type(exc).__name__))

    async def wait(self, at_least: int) -> None:
        while len(self.ok) < at_least and not all(t.done() for t in self.tasks):
            await asyncio.sleep(0.01)

    async def finish(self) -> None:
        self.stop.set()
        await asyncio.wait_for(asyncio.gather(*self.tasks), 30)


def store_payloads(path) -> dict[str, Counter]:
    """model -> Counter of (request text, status) over the store's rows."""
    rows = select(path, "SELECT model, status, payload FROM requests")
    out: dict[str, Counter] = {}
    for model, status, payload in rows:
        (sample,) = mip.decode(payload).samples
        out.setdefault(model, Counter())[(sample[0].as_text(), status)] += 1
    return out


def test_live_add_and_remove_under_load(tmp_path):
    store = tmp_path / "requests.db"
    with (
        CliServer(handler="serve_handlers:tag_a") as a,
        CliServer(handler="serve_handlers:tag_b") as b,
        CliServer(handler="serve_handlers:tag_slow") as s,
    ):
        port = {
            name: int(srv.address.rsplit(":", 1)[1])
            for name, srv in zip("abs", (a, b, s), strict=True)
        }
        doc = deployment(
            store,
            {"m1": {"timeout": 10}},
            [
                {
                    "id": "n1",
                    "devices": ["CPU", "GPU"],
                    "models": ["m1"],
                    "quotas": [0.5, 0],
                    "ports": [port["a"], None],
                }
            ],
            admin={"token": TOKEN},
            store={"path": str(store), "payloads": True},
            cache={"max_entries": 0},
        )
        with DispatcherProcess.of(doc, tmp_path) as proc:
            url = ["--url", proc.http, "--token", TOKEN]

            async def main():
                load1 = Load(proc.mip_address("m1"), "one")
                await load1.wait(50)

                # the admin API refuses a missing or wrong token, and changes nothing
                status, _out, err = await acli("list", "--url", proc.http, "--token", "")
                assert status == 1 and "HTTP 401" in err and "--token" in err
                status, _out, err = await acli("remove", "m1", "--url", proc.http, "--token", "x")
                assert status == 1 and "HTTP 401" in err

                # added under load: half the CPU (b) and the whole GPU (slow)
                status, out, err = await acli(
                    "add",
                    "--name",
                    "m2",
                    "--place",
                    f"n1:0:0.25:{port['b']}",
                    "--place",
                    f"n1:1:1:{port['s']}",
                    "--apps",
                    "two",
                    *url,
                )
                assert status == 0, err
                added = json.loads(out)["added"]
                assert [(r["device"], r["quota"]) for r in added["rows"]] == [(0, 0.25), (1, 1)]
                load2 = Load(f"tcp://127.0.0.1:{added['mip_port']}", "two")
                await load2.wait(40)

                # refused: the share asked for is not free, and the refusal says what is
                status, _out, err = await acli(
                    "add", "--name", "m3", "--place", f"n1:0:0.5:{port['b']}", *url
                )
                assert status == 1
                assert (
                    "cannot give 0.5 of n1/0 (CPU): 0.25 is free (held by m1 0.5, m2 0.25)" in err
                )
                assert "free: n1/0 (CPU) 0.25" in err

                status, out, _err = await acli("list", "--json", *url)
                assert status == 0
                listed = json.loads(out)
                assert list(listed["models"]) == ["m1", "m2"]
                assert {(d["node"], d["device"]): d["free"] for d in listed["devices"]} == {
                    ("n1", 0): 0.25,
                    ("n1", 1): 0.0,
                }

                # removed under load: what is in flight is answered, then the clear error
                status, out, err = await acli("remove", "m2", *url)
                assert status == 0, err
                assert json.loads(out) == {
                    "removed": "m2",
                    "drained": True,
                    "in_flight_at_timeout": 0,
                }
                await asyncio.wait_for(asyncio.gather(*load2.tasks), 30)  # each was refused
                assert len(load2.refused) == 4
                assert {why for _v, why in load2.refused} <= {
                    "METHOD",
                    "ConnectionLost",
                    "ConnectionRefusedError",
                    "ConnectionResetError",
                }
                async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as h:
                    for path, body in (
                        ("/v1/models/m2:predict", {"inputs": [["x"]]}),
                        ("/two/predict", {"input": "x"}),
                    ):
                        async with h.post(proc.http + path, json=body) as r:
                            assert r.status == 410
                            assert (await r.json())["error"] == "model 'm2' was removed"
                status, out, _err = await acli("list", "--json", *url)
                listed = json.loads(out)
                assert list(listed["models"]) == ["m1"]
                assert [d["free"] for d in listed["devices"]] == [0.5, 1.0]  # released

                # m1 never stopped
                before = len(load1.ok)
                await load1.wait(before + 20)
                await load1.finish()
                assert not load1.refused
                return load1, load2

            load1, load2 = run(main(), 120)
            assert proc.stop() == 0
        # Against the store: every answer has exactly one row, ok; a request refused at the
        # MIP door (METHOD: its model removed) one row, failed (issue 35); nothing else.
        rows = store_payloads(store)
        assert rows["m1"] == Counter({(v, "ok"): 1 for v in load1.ok})
        refused = Counter({(v, "failed"): 1 for v, why in load2.refused if why == "METHOD"})
        assert rows["m2"] == Counter({(v, "ok"): 1 for v in load2.ok}) + refused
        assert not any(
            v in {p for p, _ in rows["m2"]} for v, why in load2.refused if why != "METHOD"
        )
        assert set(rows) == {"m1", "m2"}
        assert len(load2.ok) >= 40


def test_serve_refuses_to_start_beyond_loopback_without_a_token(tmp_path):
    doc = deployment(
        tmp_path / "r.db",
        {"m": {}},
        [{"id": "n", "devices": ["CPU"], "models": ["m"], "quotas": [1], "ports": [9]}],
    )
    doc["listen"]["host"] = "0.0.0.0"
    config = tmp_path / "d.json"
    config.write_text(json.dumps(doc))
    out, err = io.StringIO(), io.StringIO()
    status = wirekit_main(["serve", "--config", str(config)], out, err)
    assert status == 1
    assert "admin.token" in err.getvalue() and "needs a bearer token" in err.getvalue()
    assert out.getvalue() == ""  # never ready
    assert (
        not sqlite3.connect(tmp_path / "r.db").execute("SELECT name FROM sqlite_master").fetchall()
    )  # nothing opened
