"""Interop with KubeMo from PyPI (``kubemo==0.0.dev2``), both directions, on real sockets.

KubeMo's quirks, worked with rather than around: its client opens one connection per call
and *consumes* its input objects (each is built fresh here), and it cannot send ``Json(obj)``
(it writes ``str`` into a bytes buffer), so JSON goes as ``Json(BytesIO(...))``.  Its server
serves one request per connection and writes the request's input count as the response's
``n_output``.
"""

from __future__ import annotations

import asyncio
import io
import json
import socket
import threading

import kubemo
import pytest
from mip_net import TIMEOUT, KubemoServer, kubemo_echo, png_bytes, read_message
from PIL import Image

from wirekit import mip
from wirekit._loop import run as run_loop
from wirekit.mip import Inference, Item, ItemType
from wirekit.mip.client import AsyncClient, Client, ServerError, unanswered_retryable
from wirekit.mip.messages import ErrorCode
from wirekit.mip.server import ServerThread

PNG = png_bytes(4, 3)


def wirekit_model(batch):
    """Per sample (text, json, image): the text upper-cased, the JSON tagged, the image size."""
    outputs = []
    for text, doc, image in batch:
        assert (text.type, doc.type, image.type) == (ItemType.TEXT, ItemType.JSON, ItemType.IMAGE)
        size = Image.open(io.BytesIO(image.as_bytes())).size
        outputs.append(
            [
                text.as_text().upper(),
                {**doc.as_json(), "seen": True},
                Item.image(image.as_bytes()),
                Item.json(list(size)),
            ]
        )
    return outputs


def kubemo_sample(k: int):
    return (
        kubemo.Text(f"sample {k}"),
        kubemo.Json(io.BytesIO(json.dumps({"k": k}).encode())),
        kubemo.Image(io.BytesIO(PNG)),
    )


# ------------------------------------------------------------------ KubeMo client -> wirekit


@pytest.fixture(scope="module", params=["tcp", "unix"])
def wirekit_server(request, tmp_path_factory):
    listen = (
        "tcp://127.0.0.1:0"
        if request.param == "tcp"
        else f"unix://{tmp_path_factory.mktemp('wk')}/mip.sock"
    )
    with ServerThread(wirekit_model, listen) as running:
        yield running


def test_kubemo_client_pings_wirekit_server(wirekit_server):
    elapsed_ns = kubemo.Client().ping(wirekit_server.address)
    assert isinstance(elapsed_ns, int) and elapsed_ns > 0


@pytest.mark.parametrize("batch_size", [1, 2, 7, 64])
def test_kubemo_client_infers_on_wirekit_server(wirekit_server, batch_size):
    batch = tuple(kubemo_sample(k) for k in range(batch_size))
    outputs = kubemo.Client().inference(wirekit_server.address, batch)
    assert len(outputs) == batch_size
    for k, (text, doc, image, size) in enumerate(outputs):
        assert text.decode() == f"SAMPLE {k}"
        assert doc.decode() == {"k": k, "seen": True}
        assert image.decode().size == (4, 3)
        assert size.decode() == [4, 3]


def test_kubemo_client_sees_wirekit_error_code(wirekit_server):
    # A TEXT where the model wants an IMAGE: the handler fails, the server answers INTERNAL.
    bad = ((kubemo.Text("a"), kubemo.Json(io.BytesIO(b"{}")), kubemo.Text("not an image")),)
    with pytest.raises(ValueError, match="error code: 5"):
        kubemo.Client().inference(wirekit_server.address, bad)
    # ... and keeps serving.
    assert kubemo.Client().inference(wirekit_server.address, (kubemo_sample(0),))[0][0].decode()


# ------------------------------------------------------------------ wirekit client -> KubeMo


@pytest.fixture(scope="module", params=["tcp", "unix"])
def kubemo_server(request):
    with KubemoServer(kubemo_echo, request.param) as server:
        yield server


def test_wirekit_client_pings_kubemo(kubemo_server):
    with Client(kubemo_server.address, timeout=TIMEOUT) as client:
        assert 0 < client.ping() < TIMEOUT
        assert 0 < client.ping() < TIMEOUT  # KubeMo closed the first connection: reconnected


@pytest.mark.parametrize("batch_size", [1, 5, 64])
def test_wirekit_client_infers_on_kubemo(kubemo_server, batch_size):
    batch = [[f"text {k}", {"k": k, "list": [1, 2]}, PNG] for k in range(batch_size)]
    with Client(kubemo_server.address, timeout=TIMEOUT) as client:
        for _ in range(3):  # one connection per request on KubeMo's side: reconnects each time
            outputs = client.infer(batch)
            assert len(outputs) == batch_size
            for k, (text, doc, image) in enumerate(outputs):
                assert text == Item(ItemType.TEXT, f"text {k}".encode())
                assert doc.type == ItemType.JSON and doc.as_json() == {"k": k, "list": [1, 2]}
                assert image == Item(ItemType.IMAGE, PNG)


def test_wirekit_inputs_are_not_consumed(kubemo_server):
    doc = {"nested": {"a": [1, 2, 3]}}
    image = bytearray(PNG)
    sample = [Item.text("same"), doc, image]
    with Client(kubemo_server.address, timeout=TIMEOUT) as client:
        first = client.infer([sample])
        second = client.infer([sample])
    assert first == second
    assert [bytes(i.data) for i in first[0]] == [b"same", b'{"nested":{"a":[1,2,3]}}', PNG]
    assert sample == [Item.text("same"), {"nested": {"a": [1, 2, 3]}}, bytearray(PNG)]


def test_kubemo_response_n_output_quirk_is_tolerated():
    """KubeMo announces n_output = n_input: a model with 2 inputs and 1 output still decodes."""

    def concat(*samples):
        return tuple((kubemo.Text("+".join(v.decode() for v in s)),) for s in samples)

    with KubemoServer(concat) as server, Client(server.address, timeout=TIMEOUT) as client:
        assert client.infer([["a", "b"]]) == [(Item.text("a+b"),)]


@pytest.mark.parametrize(
    ("model", "code"),
    [
        (lambda *samples: 1 / 0, ErrorCode.INTERNAL),
        # KubeMo checks every sample after the first against the first's input count: SHAPE.
        (lambda *samples: ((kubemo.Text("x"),),) * len(samples), ErrorCode.SHAPE),
    ],
)
def test_kubemo_error_replies_raise_server_error(model, code, caplog):
    with KubemoServer(model) as server, Client(server.address, timeout=TIMEOUT) as client:
        with pytest.raises(ServerError) as info:
            client.infer([["a", "b"], ["c", "d"]])
        assert info.value.code == code
        assert client.ping() > 0  # the client recovers on a new connection


def test_async_client_pipelines_against_one_shot_kubemo(kubemo_server):
    async def main():
        async with AsyncClient(kubemo_server.address, timeout=TIMEOUT) as client:
            results = await asyncio.gather(*(client.infer([[f"r{k}"]]) for k in range(6)))
            pong = await client.ping()
        return results, pong

    results, pong = asyncio.run(main())
    assert [r[0][0].as_text() for r in results] == [f"r{k}" for k in range(6)]
    assert pong > 0


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_reply_before_the_close_is_delivered_when_a_pipelined_write_breaks(tmp_path, loop):
    # KubeMo's race, made certain: a one-shot server on a Unix socket answers the first
    # request and closes before the client's second write, which then fails with a broken
    # pipe while the reply still sits unread in the client's socket.  (Found when CI lost
    # that reply: the first call failed as "closed without replying".)  The reply is
    # delivered; the second request, sent into the closed connection, is retryable.
    path = str(tmp_path / "one-shot.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)
    listener.settimeout(TIMEOUT)
    closed = threading.Event()

    def one_shot_server():
        conn, _ = listener.accept()
        with conn:
            conn.settimeout(TIMEOUT)
            request = read_message(conn)
            assert isinstance(request, Inference)
            conn.sendall(mip.encode(Inference.reply([[Item.text("first")]])))
        closed.set()

    server = threading.Thread(target=one_shot_server, daemon=True)
    server.start()
    outcomes: dict[str, tuple] = {}

    async def main():
        client = AsyncClient(f"unix://{path}", timeout=TIMEOUT)
        await client.connect()
        done = asyncio.get_running_loop().create_future()

        def settle(name):
            def callback(frame, exc):
                outcomes[name] = (frame, exc)
                if len(outcomes) == 2:
                    done.set_result(None)

            return callback

        def request(text):
            return mip.encode(Inference.request([[Item.text(text)]]))

        assert client.send_nowait(request("a"), settle("first"))
        # The loop does not run while the server answers and closes: nothing is read yet.
        assert closed.wait(TIMEOUT)
        assert client.send_nowait(request("b"), settle("second"))
        await asyncio.wait_for(done, TIMEOUT)
        await client.close()

    try:
        run_loop(main(), loop)
    finally:
        listener.close()
        server.join(TIMEOUT)
    frame, exc = outcomes["first"]
    assert exc is None and mip.decode(frame).samples[0][0].as_text() == "first"
    frame, exc = outcomes["second"]
    assert frame is None and unanswered_retryable(exc) is True


def test_async_client_goes_one_at_a_time_once_the_server_shows_it_is_one_shot(kubemo_server):
    # KubeMo closes every connection after one reply (with unread requests behind it, which
    # can reset the connection and lose that reply).  Once the client has seen that, it sends
    # one request per connection: rounds of concurrent calls all come back, in order.
    async def main():
        async with AsyncClient(kubemo_server.address, timeout=TIMEOUT) as client:
            rounds = []
            for r in range(4):
                calls = (client.infer([[f"{r}-{k}"]]) for k in range(12))
                rounds.append(await asyncio.gather(*calls))
        return rounds

    rounds = asyncio.run(main())
    for r, results in enumerate(rounds):
        assert [x[0][0].as_text() for x in results] == [f"{r}-{k}" for k in range(12)]
