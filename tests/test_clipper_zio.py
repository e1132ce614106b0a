"""The Clipper runtimes' multipart I/O (``wirekit.clipper._zio``), both twins.

The Cython twin (``wirekit._fast.zio``) calls the libzmq pyzmq loaded; the pure twin calls
pyzmq's backend socket.  Both move the same frames with the same blocking, timeout and error
behaviour, checked here on real ZeroMQ sockets over 127.0.0.1.
"""

from __future__ import annotations

import threading
import types

import numpy as np
import pytest
import zmq
from twins import IMPLEMENTATIONS

from wirekit._impl import pure_requested
from wirekit.clipper import _zio


@pytest.fixture(scope="module", params=IMPLEMENTATIONS)
def zio(request):
    if request.param == "pure":
        return types.SimpleNamespace(
            send_frames=_zio._send_frames,
            recv_frames=_zio._recv_frames,
            recv_message=_zio._recv_message,
        )
    if pure_requested():
        pytest.skip("WIREKIT_PURE=1: the Cython twin is deliberately not used")
    from wirekit._fast import zio as fast

    fast.bind(_zio._backend_file())
    return fast


@pytest.fixture
def pair():
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    dealer = ctx.socket(zmq.DEALER)
    for sock in (router, dealer):
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVTIMEO, 5000)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    dealer.connect(f"tcp://127.0.0.1:{port}")
    yield router, dealer
    router.close(0)
    dealer.close(0)
    ctx.term()


def test_the_runtimes_use_the_cython_twin_unless_pure_was_asked_for():
    assert ("pure" if pure_requested() else "fast") == _zio.IMPLEMENTATION
    assert _zio.send_frames is not _zio._send_frames or pure_requested()


def test_multipart_round_trip_of_bytes_like_frames(zio, pair):
    router, dealer = pair
    big = bytes(range(256)) * 4096
    frames = [
        b"",
        b"\x01\x00\x00\x00",
        bytearray(b"ab"),
        memoryview(b"xyz")[1:],
        np.arange(3.0),
        big,
    ]
    zio.send_frames(dealer, frames)
    got = zio.recv_frames(router)
    assert got[1:] == [b"", b"\x01\x00\x00\x00", b"ab", b"yz", np.arange(3.0).tobytes(), big]
    assert all(type(f) is bytes for f in got)
    identity = got[0]
    zio.send_frames(router, [identity, b"back", b""])
    assert zio.recv_frames(dealer) == [b"back", b""]


def test_messages_stay_whole_and_in_order(zio, pair):
    router, dealer = pair
    for k in range(50):
        zio.send_frames(dealer, [k.to_bytes(4, "little")] * (1 + k % 7))
    for k in range(50):
        frames = zio.recv_frames(router)[1:]
        assert frames == [k.to_bytes(4, "little")] * (1 + k % 7)


def test_recv_message_gives_the_source_fd_and_none_when_empty(zio, pair):
    router, dealer = pair
    assert zio.recv_message(router, False) is None
    zio.send_frames(dealer, [b"one"])
    zio.send_frames(dealer, [b"two"])
    frames, fd = zio.recv_message(router)
    assert frames[1:] == [b"one"]
    head = router.recv(copy=False)  # pyzmq's own view of the same connection
    assert head.get(zmq.SRCFD) == fd >= 0
    assert router.recv() == b"two"
    assert zio.recv_message(router, False) is None


def test_receive_timeouts(zio, pair):
    router, _ = pair
    router.setsockopt(zmq.RCVTIMEO, 10)
    assert zio.recv_message(router) is None
    with pytest.raises(zmq.Again):
        zio.recv_frames(router)
    with pytest.raises(zmq.Again):
        zio.recv_frames(router, zmq.NOBLOCK)


def test_send_that_cannot_go_raises_again(zio):
    ctx = zmq.Context()
    lonely = ctx.socket(zmq.DEALER)  # no peer: nowhere to queue a message
    lonely.setsockopt(zmq.LINGER, 0)
    lonely.setsockopt(zmq.SNDTIMEO, 10)
    try:
        with pytest.raises(zmq.Again):
            zio.send_frames(lonely, [b"a", b"b"], zmq.NOBLOCK)
        with pytest.raises(zmq.Again):
            zio.send_frames(lonely, [b"a"])
    finally:
        lonely.close(0)
        ctx.term()


def test_bad_frames_are_refused_before_anything_is_sent(zio, pair):
    router, dealer = pair
    with pytest.raises(TypeError, match="frame 1"):
        zio.send_frames(dealer, [b"a", "text", b"c"])
    with pytest.raises(ValueError, match="frame 2"):
        zio.send_frames(dealer, [b"a", b"b", np.arange(10.0)[::2]])
    with pytest.raises(ValueError, match="frame 1"):
        zio.send_frames(dealer, [b"a", memoryview(b"abcdef")[::2]])
    with pytest.raises(ValueError):
        zio.send_frames(dealer, [])
    zio.send_frames(dealer, [b"whole"])
    assert zio.recv_frames(router)[1:] == [b"whole"]


def test_closed_socket_is_an_error_not_a_crash(zio):
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.close(0)
    try:
        with pytest.raises(zmq.ZMQError):
            zio.send_frames(sock, [b"x"])
        with pytest.raises(zmq.ZMQError):
            zio.recv_message(sock, False)
    finally:
        ctx.term()


def test_inproc_messages_have_no_source_fd(zio):
    ctx = zmq.Context()
    router, dealer = ctx.socket(zmq.ROUTER), ctx.socket(zmq.DEALER)
    try:
        router.bind("inproc://wirekit-zio-test")
        dealer.connect("inproc://wirekit-zio-test")
        zio.send_frames(dealer, [b"wake"])
        router.setsockopt(zmq.RCVTIMEO, 5000)
        frames, fd = zio.recv_message(router)
        assert (frames[1:], fd) == ([b"wake"], -1)
    finally:
        router.close(0)
        dealer.close(0)
        ctx.term()


def test_spinning_receive_gets_what_comes_and_still_times_out(zio, pair):
    router, dealer = pair
    router.setsockopt(zmq.RCVTIMEO, 10)
    assert zio.recv_message(router, True, 0.002) is None  # spin, then RCVTIMEO: nothing
    assert zio.recv_message(router, False, 0.002) is None  # no spin without blocking
    router.setsockopt(zmq.RCVTIMEO, 5000)
    later = threading.Timer(0.001, zio.send_frames, (dealer, [b"late", b"x"]))
    later.start()
    frames, _ = zio.recv_message(router, True, 0.5)
    later.join()
    assert frames[1:] == [b"late", b"x"]
    zio.send_frames(dealer, [b"queued"])
    router.setsockopt(zmq.RCVTIMEO, 5000)
    assert zio.recv_message(router, True, 0.0)[0][1:] == [b"queued"]


# --- how the compiled twin reaches libzmq, and when it cannot (issue 15) ---


def _compiled_zio():
    if pure_requested():
        pytest.skip("WIREKIT_PURE=1: the Cython twin is deliberately not used")
    from wirekit._fast import zio as fast

    return fast


def test_the_compiled_twin_reaches_libzmq_through_pyzmqs_backend_module():
    fast = _compiled_zio()
    assert _zio.IMPLEMENTATION == "fast"
    fast.bind(_zio._backend_file())  # again: the same functions, found the same way
    with pytest.raises(ImportError, match="is not loaded"):
        fast.bind("/nonexistent/libzmq.so")


def test_a_compiled_twin_that_cannot_reach_libzmq_falls_back_loudly(monkeypatch):
    from wirekit import _impl

    _compiled_zio()
    # (the benchmarks, collected in the same run, forbid fallbacks: allow this one)
    monkeypatch.delenv(_impl.REQUIRE_ENV_VAR, raising=False)

    def unreachable(module):
        raise ImportError("pyzmq has no Cython backend module here")

    with pytest.warns(_impl.FastPathMissing, match="no Cython backend module here"):
        assert _impl.load_fast_bound("zio", unreachable) is None


def test_a_message_of_many_parts_is_read_whole(zio, pair):
    """More parts than a Received holds at first (16): they move to a bigger array."""
    router, dealer = pair
    router.setsockopt(zmq.RCVTIMEO, 5000)
    parts = [bytes([i]) * (i % 7) for i in range(100)]
    zio.send_frames(dealer, parts)
    frames, _ = zio.recv_message(router)
    assert frames[1:] == parts
