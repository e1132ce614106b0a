"""ZMTP reader against real libzmq traffic: pyzmq ROUTER and DEALER through a recording proxy."""

from __future__ import annotations

import pytest
import zmq

from wirekit import zmtp
from wirekit.zmtp.record import RecordingProxy

TIMEOUT_MS = 5000

#: what the DEALER sends (its own empty delimiter first, as Clipper containers do)
SENT_BY_DEALER = [
    [b"", b"hello"],
    [b"", b"x" * 300, b"", b"\x00\xff" * 200],  # LONG frames and an empty frame
    [b""],  # a single empty frame
    [b"", bytes(range(256))],  # exactly 256 bytes: the first LONG size
    [b"", b"y" * 255],  # the largest short frame
]
#: what the ROUTER answers (after the routing identity, which ZeroMQ strips on the wire)
SENT_BY_ROUTER = [
    [b"", b"reply"],
    [b"", b"z" * 1000],
    [b"", b"", b"last"],
]


@pytest.fixture(scope="module")
def capture():
    """Capture one real DEALER↔ROUTER conversation in both directions."""
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    dealer = ctx.socket(zmq.DEALER)
    for sock in (router, dealer):
        sock.linger = 0
        sock.rcvtimeo = TIMEOUT_MS
        sock.sndtimeo = TIMEOUT_MS
    dealer.setsockopt(zmq.IDENTITY, b"container-7")
    try:
        port = router.bind_to_random_port("tcp://127.0.0.1")
        with RecordingProxy(("127.0.0.1", port), accept_timeout=10, idle_timeout=10) as proxy:
            dealer.connect(f"tcp://127.0.0.1:{proxy.port}")
            received = []
            for frames in SENT_BY_DEALER:
                dealer.send_multipart(frames)
                received.append(router.recv_multipart())
            peer = received[0][0]
            for frames in SENT_BY_ROUTER:
                router.send_multipart([peer, *frames])
            replies = [dealer.recv_multipart() for _ in SENT_BY_ROUTER]
            dealer.close()  # ends the connection: the proxy sees EOF in both directions
            assert proxy.wait(10), "the proxied connection did not close"
        assert proxy.error is None and not proxy.overflow
        return {
            "peer": peer,
            "received": received,
            "replies": replies,
            "up": bytes(proxy.upstream),
            "down": bytes(proxy.downstream),
        }
    finally:
        dealer.close()
        router.close()
        ctx.term()


def test_zmq_itself_delivered_what_was_sent(capture):
    assert capture["peer"] == b"container-7"
    assert [m[1:] for m in capture["received"]] == SENT_BY_DEALER
    assert capture["replies"] == SENT_BY_ROUTER


def _split(events):
    kinds = [type(e) for _, e in events]
    assert kinds[:2] == [zmtp.Greeting, zmtp.Ready]
    assert all(k is zmtp.Message for k in kinds[2:])
    return events[0][1], events[1][1], [list(e.frames) for _, e in events[2:]]


def test_dealer_side_capture_decodes_to_what_was_sent(zmtp_codec, capture):
    assert zmtp.is_zmtp(capture["up"])
    greeting, ready, messages = _split(zmtp_codec.decode_stream(capture["up"]))
    assert (greeting.major, greeting.mechanism, greeting.as_server) == (3, "NULL", False)
    assert ready.socket_type == "DEALER"
    assert ready.identity == b"container-7"
    assert messages == SENT_BY_DEALER


def test_router_side_capture_decodes_to_what_was_sent(zmtp_codec, capture):
    greeting, ready, messages = _split(zmtp_codec.decode_stream(capture["down"]))
    assert greeting.mechanism == "NULL"
    assert ready.socket_type == "ROUTER"
    assert messages == SENT_BY_ROUTER  # no routing identity on the wire


def test_real_capture_fed_byte_by_byte(zmtp_codec, capture):
    reader = zmtp.StreamReader(max_frame_size=4096, codec=zmtp_codec)
    events = []
    for k in range(len(capture["up"])):
        reader.feed(capture["up"][k : k + 1])
        events.extend(reader)
    reader.close()
    events.extend(reader)
    assert events == zmtp_codec.decode_stream(capture["up"])
    assert reader.socket_type == "DEALER" and reader.buffered == 0


def test_real_capture_equals_the_encoders_output(zmtp_codec, capture):
    """Our encoders write what libzmq writes (greeting, READY, frames), padding aside.

    libzmq fills the 8 signature padding bytes with the ZMTP 1.0 length of its identity
    (big-endian ``len(identity) + 1``); readers must ignore them, and wirekit writes 1.
    """
    expected = b"".join(
        [
            zmtp_codec.encode_greeting(),
            zmtp_codec.encode_ready("DEALER", b"container-7"),
            *(zmtp_codec.encode_message(m) for m in SENT_BY_DEALER),
        ]
    )
    assert capture["up"][1:9] == (len(b"container-7") + 1).to_bytes(8, "big")
    assert capture["up"][:1] + capture["up"][9:] == expected[:1] + expected[9:]
    assert capture["down"][1:9] == (1).to_bytes(8, "big")  # ROUTER: empty identity
