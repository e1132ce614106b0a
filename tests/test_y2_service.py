"""The y2 communication services (issue 20): ``wirekit y2 client`` / ``wirekit y2 service``.

Sans-IO state machines against both twins; then real clusters on loopback: a client and 3
node services (threads, and real processes through the CLI), each with a worker -- wirekit's
:class:`~wirekit.y2.worker.WorkerLink`, and y2's own ``Communication`` class when
``WIREKIT_Y2_COMMUNICATION`` gives the path of y2's
``worker_service/communications/communication.py`` (y2's worker is not on PyPI).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from twins import load_codec

from wirekit import y2
from wirekit.errors import DecodeError
from wirekit.y2.cluster import ClientService, NodeService
from wirekit.y2.service import (
    ABORT,
    DONE,
    FINISHED,
    HELLO,
    INDEX,
    MAX_BATCH,
    REFUSED,
    RUNTIME,
    STATUS,
    ClientRegistry,
    CloseWorker,
    ConnectPeers,
    NodeActivity,
    NodeSession,
    NodeState,
    Stop,
    ToClient,
    ToPeers,
)
from wirekit.y2.worker import WorkerLink

HERE = Path(__file__).resolve().parent
TIMEOUT = 60.0  # a bound for a hang, not a threshold: every wait ends early on success


def _i32(v: int) -> bytes:
    return v.to_bytes(4, "big", signed=True)


def _delta(codec, sender: int, seq: int, per: int = 3) -> bytes:
    # every word: layer = sender, index = seq (a Delta may repeat a word)
    return codec.encode(y2.Delta(codec.pack([sender] * per, [1] * per, [seq] * per, [0] * per)))


def _registered(codec, n: int = 3) -> ClientRegistry:
    reg = ClientRegistry(n, codec=codec)
    for i in range(n):
        reg.receive(f"node{i}".encode(), [HELLO, f"tcp://127.0.0.1:{7000 + i}".encode()])
    return reg


def _indexed_session(codec, node_id: int = 1, **kw) -> NodeSession:
    s = NodeSession(f"tcp://127.0.0.1:{7000 + node_id}", codec=codec, **kw)
    peers = [f"tcp://x:{7000 + i}".encode() for i in range(3)]
    s.client_message([INDEX, codec.encode(y2.NodeIndex(node_id, 3)), *peers])
    return s


# ------------------------------------------------------------------ scan_deltas (both twins)


def _d(words: int) -> bytes:
    return b"\x00\x00\x00\x01" + (4 * words).to_bytes(4, "big") + bytes(4 * words)


@pytest.mark.parametrize(
    "buf, pos, end, max_bytes, limit, expected",
    [
        (_d(1) + _d(2), 0, None, 1 << 20, 1 << 20, (28, 2)),
        (_d(1) + _d(2), 12, None, 1 << 20, 1 << 20, (28, 1)),
        (_d(1) + _d(2)[:10], 0, None, 1 << 20, 1 << 20, (12, 1)),  # partial message
        (_d(1) + _d(2), 0, 27, 1 << 20, 1 << 20, (12, 1)),  # end cuts the second
        (_d(1) + _d(2), 0, None, 12, 1 << 20, (12, 1)),  # max_bytes
        (_d(4), 0, None, 4, 1 << 20, (24, 1)),  # the first is taken whatever its size
        (_d(1) + _d(4), 0, None, 1 << 20, 20, (12, 1)),  # over the message limit
        (_d(0) + b"\x00\x00\x00\x03\x00\x00\x00\x00", 0, None, 99, 99, (8, 1)),  # Finished
        (b"\x00\x00\x00\x01\x00\x00\x00\x06" + bytes(6), 0, None, 99, 99, (0, 0)),
        (b"\x00\x00\x00\x01\xff\xff\xff\xfc", 0, None, 99, 99, (0, 0)),  # negative size
        (b"", 0, None, 99, 99, (0, 0)),
    ],
)
def test_scan_deltas(y2_codec, buf, pos, end, max_bytes, limit, expected):
    end = len(buf) if end is None else end
    assert y2_codec.scan_deltas(buf, pos, end, max_bytes, limit) == expected
    assert y2_codec.scan_deltas(bytearray(buf), pos, end, max_bytes, limit) == expected
    assert y2_codec.scan_deltas(memoryview(buf), pos, end, max_bytes, limit) == expected


@pytest.mark.parametrize("pos, end", [(-1, 8), (9, 8), (0, 9), (0, -1)])
def test_scan_deltas_refuses_positions_outside(y2_codec, pos, end):
    with pytest.raises(IndexError):
        y2_codec.scan_deltas(_d(0), pos, end, 99, 99)


def test_scan_deltas_twins_agree():
    fast, pure = load_codec("y2", "fast"), load_codec("y2", "pure")

    @given(
        st.binary(max_size=200),
        st.lists(st.integers(0, 5), max_size=6),
        st.integers(0, 80),
        st.integers(8, 60),
    )
    def check(junk, sizes, max_bytes, limit):
        buf = b"".join(_d(n) for n in sizes) + junk
        for pos in range(0, len(buf) + 1, 7):
            args = (buf, pos, len(buf), max_bytes, limit)
            assert fast.scan_deltas(*args) == pure.scan_deltas(*args)

    check()


# ------------------------------------------------------------------ client registry


def test_registry_gives_ids_in_order_and_index_to_everyone(y2_codec):
    reg = ClientRegistry(3, codec=y2_codec)
    assert reg.receive(b"a", [HELLO, b"tcp://h:1"]) == []
    assert reg.receive(b"b", [HELLO, b"tcp://h:2"]) == []
    replies = reg.receive(b"c", [HELLO, b"tcp://h:3"])
    assert [to for to, _ in replies] == [b"a", b"b", b"c"]
    for k, (_, frames) in enumerate(replies):
        assert frames[0] == INDEX
        assert y2_codec.decode(frames[1]) == y2.NodeIndex(k, 3)
        assert list(frames[2:]) == [b"tcp://h:1", b"tcp://h:2", b"tcp://h:3"]


def test_registry_same_name_gets_same_id_again(y2_codec):
    reg = _registered(y2_codec)
    [(to, frames)] = reg.receive(b"node2", [HELLO, b"tcp://127.0.0.1:7002"])
    assert to == b"node2" and y2_codec.decode(frames[1]) == y2.NodeIndex(2, 3)
    assert reg.counters.reconnections == 1 and len(reg.nodes) == 3


def test_registry_refuses_a_known_name_with_another_inbox(y2_codec):
    reg = _registered(y2_codec)
    [(to, frames)] = reg.receive(b"node1", [HELLO, b"tcp://elsewhere:1"])
    assert to == b"node1" and frames[0] == REFUSED
    assert b"restart it with --inbox tcp://127.0.0.1:7001" in frames[1]
    assert reg.counters.errors == 1 and reg.nodes[b"node1"].inbox == "tcp://127.0.0.1:7001"


def test_registry_refuses_a_node_too_many(y2_codec):
    reg = _registered(y2_codec)
    [(to, frames)] = reg.receive(b"extra", [HELLO, b"tcp://h:9"])
    assert to == b"extra" and frames[0] == REFUSED and b"3 nodes" in frames[1]
    assert reg.counters.refused == 1 and len(reg.nodes) == 3


def _report(reg: ClientRegistry, node_id: int, activity: NodeActivity) -> list:
    return reg.receive(f"node{node_id}".encode(), [STATUS, _i32(node_id), activity.to_bytes()])


def test_registry_is_done_when_every_node_finished_or_ended(y2_codec):
    reg = _registered(y2_codec)
    for i in range(3):
        assert _report(reg, i, NodeActivity(1, True, 1)) == []
    assert reg.receive(b"node0", [FINISHED, _i32(0)]) == []
    assert _report(reg, 1, NodeActivity(1, False, 1, 20, 80, 2, 0, 40)) == []  # ended
    assert not reg.done and reg.outcome == "running"
    assert reg.not_over() == ["node 2 (node2, running)"]
    replies = _report(reg, 2, NodeActivity(1, False, 1, 20, 80, 2, 0, 40))
    assert reg.done and reg.outcome == "ended"
    assert sorted(to for to, _ in replies) == [b"node0", b"node1", b"node2"]
    assert all(frames == (DONE,) for _, frames in replies)
    assert _report(reg, 2, NodeActivity(2, True, 2, 20, 80, 2, 0, 40)) == []  # done once
    summary = reg.summary()
    assert [n["state"] for n in summary["nodes"]] == ["finished", "ended", "running"]
    assert summary["nodes"][1]["activity"]["deltas_from_worker"] == 20
    assert summary["done"] is True and summary["outcome"] == "ended"
    assert summary["counters"]["status_received"] == 6


def test_registry_done_on_a_finished_has_that_nodes_counts(y2_codec):
    reg = _registered(y2_codec)
    for i in (1, 2):
        _report(reg, i, NodeActivity(1, False, 1, 7))  # ended
    at_finished = NodeActivity(1, True, 1, 20, 80, 2, 1, 40)
    assert reg.receive(b"node0", [FINISHED, _i32(0), at_finished.to_bytes()])
    assert reg.done and reg.nodes[b"node0"].activity == at_finished  # no status needed after


def test_registry_node_whose_worker_comes_back_runs_again(y2_codec):
    reg = _registered(y2_codec)
    _report(reg, 0, NodeActivity(1, False, 1, 5))  # ended ...
    assert reg.nodes[b"node0"].state is NodeState.ENDED
    _report(reg, 0, NodeActivity(2, True, 2, 5))  # ... and a worker connected again
    assert reg.nodes[b"node0"].state is NodeState.RUNNING
    for i in (1, 2):
        reg.receive(f"node{i}".encode(), [FINISHED, _i32(i)])
    assert not reg.done  # node 0 runs
    assert reg.receive(b"node0", [FINISHED, _i32(0)]) and reg.outcome == "finished"


def test_registry_progress_counts_what_moved_and_abort_tells_every_node(y2_codec):
    reg = ClientRegistry(3, codec=y2_codec)
    reg.receive(b"node0", [HELLO, b"tcp://h:1"])
    assert reg.progress == 1  # a registration
    assert reg.not_over() == ["node 0 (node0, waiting)", "2 of 3 nodes not registered"]
    reg = _registered(y2_codec)
    assert reg.progress == 3
    _report(reg, 0, NodeActivity(1, True))
    _report(reg, 0, NodeActivity(1, True))  # the same again: no progress
    assert reg.progress == 4
    reg.receive(b"node0", [RUNTIME, _i32(0), y2_codec.encode(y2.Runtime(1, 2, 3, 4))])
    assert reg.progress == 5
    replies = reg.abort("no progress for 5 s")
    assert [frames for _, frames in replies] == [(ABORT, b"no progress for 5 s")] * 3
    assert reg.outcome == "aborted" and reg.summary()["aborted"] == "no progress for 5 s"


def test_registry_survives_any_frames_from_a_registered_node(y2_codec):
    kinds = st.sampled_from([HELLO, RUNTIME, FINISHED, STATUS, DONE, b"", b"x"])
    frame = st.one_of(st.binary(max_size=70), st.just(_i32(1)), st.binary(min_size=64, max_size=64))

    @given(st.lists(st.tuples(kinds, st.lists(frame, max_size=3)), max_size=20))
    def check(messages):
        reg = _registered(y2_codec)
        for kind, rest in messages:
            for to, reply in reg.receive(b"node1", [kind, *rest]):
                assert to in reg.nodes and reply[0] in (INDEX, DONE, REFUSED)
        assert len(reg.nodes) == 3 and reg.outcome in ("running", "finished", "ended")
        assert reg.done == all(r.over for r in reg.nodes.values())

    check()


def test_registry_collects_reports_and_is_done_after_every_finished(y2_codec):
    reg = _registered(y2_codec)
    rt = y2_codec.encode(y2.Runtime(600, 1, 20, 2, 1500))
    assert reg.receive(b"node1", [RUNTIME, _i32(1), rt]) == []
    for i in (2, 0):
        assert reg.receive(f"node{i}".encode(), [FINISHED, _i32(i)]) == []
    assert not reg.done
    replies = reg.receive(b"node1", [FINISHED, _i32(1)])
    assert reg.done and sorted(to for to, _ in replies) == [b"node0", b"node1", b"node2"]
    assert all(frames == (DONE,) for _, frames in replies)
    assert reg.report.records == [
        (1, y2.Runtime(600, 1, 20, 2, 1500)),
        (2, y2.Finished()),
        (0, y2.Finished()),
        (1, y2.Finished()),
    ]
    # the report file: NodeIndex of the node before each record, readable as y2 messages
    stream = y2.Decoder(codec=y2_codec)
    stream.feed(reg.report_bytes())
    msgs = list(stream)
    assert msgs[0] == y2.NodeIndex(1, 3) and msgs[1] == y2.Runtime(600, 1, 20, 2, 1500)
    assert msgs[6] == y2.NodeIndex(1, 3) and msgs[7] == y2.Finished() and len(msgs) == 8


@pytest.mark.parametrize(
    "sender, frames",
    [
        (b"stranger", [RUNTIME, _i32(0), b""]),  # not registered
        (b"node0", [RUNTIME, _i32(1), b""]),  # claims another node's id
        (b"node0", [RUNTIME, _i32(0), b"\x00\x00\x00\x02\x00\x00\x00\x10"]),  # short payload
        (b"node0", [RUNTIME, _i32(0), b"\x00\x00\x00\x03\x00\x00\x00\x00"]),  # not a Runtime
        (b"node0", [b"what", _i32(0)]),
        (b"node0", [HELLO, b"\xff\xfe"]),  # endpoint not UTF-8
        (b"node0", [STATUS, _i32(0), bytes(63)]),  # an activity is 64 bytes
        (b"node0", [FINISHED, _i32(0), bytes(65)]),
        (b"node0", [STATUS, _i32(1), bytes(64)]),  # another node's id
        (b"new", [HELLO, b"tcp://0.0.0.0:5"]),  # not an address to connect to
        (b"new", [HELLO, b"tcp://h:*"]),
        (b"node0", []),
    ],
)
def test_registry_counts_malformed_service_messages(y2_codec, sender, frames):
    reg = _registered(y2_codec)
    assert reg.receive(sender, frames) == []
    assert reg.counters.errors == 1 and reg.errors and reg.report.records == []


# ------------------------------------------------------------------ node session


def test_session_worker_gets_index_then_deltas_go_to_peers(y2_codec):
    s = NodeSession("tcp://127.0.0.1:7001", codec=y2_codec)
    s.worker_connected()
    assert not s.accepts_worker_input  # no index yet
    index = y2_codec.encode(y2.NodeIndex(1, 3))
    events = s.client_message([INDEX, index, b"tcp://a:10", b"tcp://a:11", b"tcp://a:12"])
    assert events[0] == ConnectPeers(("tcp://a:10", "tcp://a:12"))
    assert events[1:] == [_status(1, NodeActivity(1, True))]  # the client: a worker is there
    assert bytes(s.data_to_worker()) == index  # the waiting worker gets its index
    s.worker_sent(len(index))
    d = _delta(y2_codec, 1, 0)
    rt = y2_codec.encode(y2.Runtime(1, 2, 3, 4))
    data = d + rt + y2_codec.encode(y2.Finished())
    events = s.worker_data(data[:5]) + s.worker_data(data[5:])
    assert events == [
        ToPeers((_i32(1), d)),
        ToClient((RUNTIME, _i32(1), rt)),
        ToClient((FINISHED, _i32(1), NodeActivity(1, True, 1, 1, 3, 1, 1).to_bytes())),
    ]  # Finished carries the counts up to it
    assert s.counters.deltas_from_worker == 1 and s.counters.words_from_worker == 3
    assert s.client_message([DONE]) == [Stop()] and s.stopped


def _status(node_id: int, activity: NodeActivity) -> ToClient:
    return ToClient((STATUS, _i32(node_id), activity.to_bytes()))


def test_activity_frame_round_trips_and_refuses_other_sizes():
    a = NodeActivity(2, True, 1, 40, 160, 3, 0, 80)
    assert len(a.to_bytes()) == 64 and NodeActivity.from_bytes(a.to_bytes()) == a
    assert NodeActivity.from_bytes(memoryview(a.to_bytes())) == a
    assert NodeActivity.from_bytes(a.to_bytes()[:-1]) is None
    assert NodeActivity.from_bytes(b"") is None
    assert a.state is NodeState.RUNNING
    assert NodeActivity().state is NodeState.WAITING
    assert NodeActivity(1, False).state is NodeState.WAITING  # a probe came and went
    assert NodeActivity(1, False, runtime_from_worker=1).state is NodeState.ENDED
    assert NodeActivity(1, False, deltas_from_worker=1).state is NodeState.ENDED
    assert NodeActivity(1, False, finished_from_worker=1).state is NodeState.FINISHED


def test_session_worker_gone_before_finished_tells_the_client_with_its_counts(y2_codec):
    # y2's main.py: Deltas and Runtime go out, Finished is queued, the link is stopped at
    # once and the connection closes before Finished leaves the worker
    s = _indexed_session(y2_codec, 1)
    assert s.worker_connected() == [_status(1, NodeActivity(1, True))]
    s.worker_sent(s.worker_buffered)  # its NodeIndex
    d = _delta(y2_codec, 1, 0)
    rt = y2_codec.encode(y2.Runtime(1, 2, 3, 4))
    s.worker_data(d + d + rt)
    assert s.peer_message([_i32(0), d])
    gone = s.worker_closed()
    assert gone == [_status(1, NodeActivity(1, False, 1, 2, 6, 1, 0, 1))]
    assert NodeActivity.from_bytes(gone[0].frames[2]).state is NodeState.ENDED
    assert s.progress() == []  # nothing moved since
    assert s.worker_closed() == []  # nor here: no second report of the same


def test_session_reports_progress_only_when_it_moved(y2_codec):
    s = _indexed_session(y2_codec, 0)
    assert s.progress() == []  # no worker yet: the client knows nothing new
    s.worker_connected()
    assert s.progress() == []  # reported when it connected
    s.worker_sent(s.worker_buffered)
    [status] = s.progress()
    assert NodeActivity.from_bytes(status.frames[2]).node_index_to_worker == 1
    s.worker_data(_delta(y2_codec, 0, 0))
    [status] = s.progress()
    assert NodeActivity.from_bytes(status.frames[2]).deltas_from_worker == 1
    [finished] = s.worker_data(y2_codec.encode(y2.Finished()))  # the counts go with it
    assert NodeActivity.from_bytes(finished.frames[2]).state is NodeState.FINISHED
    assert s.progress() == []
    [closed] = s.worker_closed()  # after Finished the node stays finished
    assert NodeActivity.from_bytes(closed.frames[2]).state is NodeState.FINISHED
    assert s.client_message([DONE]) == [Stop()]
    s.worker_connected()
    assert s.progress() == []  # stopped: nothing more for the client


def test_session_worker_that_came_and_went_before_the_index_is_reported_with_it(y2_codec):
    s = NodeSession("tcp://127.0.0.1:7001", codec=y2_codec)
    assert s.worker_connected() == [] and s.worker_closed() == []  # no id yet to report under
    index = y2_codec.encode(y2.NodeIndex(1, 3))
    events = s.client_message([INDEX, index, b"tcp://a:10", b"tcp://a:11", b"tcp://a:12"])
    assert events[1:] == [_status(1, NodeActivity(1, False))]


def test_session_abort_from_the_client_stops_with_its_reason(y2_codec):
    s = _indexed_session(y2_codec)
    [stop] = s.client_message([ABORT, b"no progress for 5 s"])
    assert stop == Stop("the client gave up: no progress for 5 s")
    assert s.stopped


def test_session_newest_worker_connection_wins(y2_codec):
    s = _indexed_session(y2_codec, 2)
    index = y2_codec.encode(y2.NodeIndex(2, 3))
    d = _delta(y2_codec, 0, 0)
    s.worker_connected()
    s.worker_sent(len(index))
    assert s.peer_message([_i32(0), d])
    s.worker_connected()  # before the old connection's end was seen
    assert s.counters.worker_replaced == 1 and s.counters.worker_connections == 2
    assert b"".join(bytes(b) for b in s.buffers_to_worker()) == index + d


def test_session_reconnected_worker_gets_its_index_again(y2_codec):
    s = _indexed_session(y2_codec, 2)
    index = y2_codec.encode(y2.NodeIndex(2, 3))
    for _ in range(2):
        s.worker_connected()
        assert bytes(s.data_to_worker()) == index
        s.worker_closed()
    assert s.counters.worker_connections == 2


@pytest.mark.parametrize(
    "data, field, offset",
    [
        (b"\x00\x00\x00\x07\x00\x00\x00\x00", "type", 0),  # unknown type
        (b"\x00\x00\x00\x02\x00\x00\x00\x0c", "size", 4),  # Runtime of 12 bytes
        (b"\x00\x00\x00\x01\xff\xff\xff\xfc", "size", 4),  # negative size
        (b"\x00\x00\x00\x00\x00\x00\x00\x08" + bytes(8), "type", 0),  # a worker's NodeIndex
    ],
)
def test_session_malformed_worker_input_closes_the_link(y2_codec, data, field, offset):
    s = _indexed_session(y2_codec)
    s.worker_connected()
    good = _delta(y2_codec, 1, 0)
    events = s.worker_data(good + data)
    assert events[0] == ToPeers((_i32(1), good))
    assert isinstance(events[1], CloseWorker) and len(events) == 2
    err = events[1].error
    assert isinstance(err, DecodeError) and err.protocol == "y2"
    assert (err.field, err.offset) == (field, len(good) + offset)
    assert s.counters.worker_errors == 1 and not s.worker_attached
    assert s.worker_data(good) == []  # nothing more from that link
    s.worker_connected()  # a new worker may come


def test_session_oversize_message_closes_the_link_before_buffering(y2_codec):
    s = _indexed_session(y2_codec, max_message_size=1024)
    s.worker_connected()
    [event] = s.worker_data(b"\x00\x00\x00\x01\x00\x00\x04\x00")  # 1032 bytes announced
    assert isinstance(event, CloseWorker) and event.error.field == "size"
    assert "exceeds the limit" in str(event.error)


@pytest.mark.parametrize(
    "frames",
    [
        [_i32(0)],  # no Delta frame
        [b"\x00\x00", b""],  # sender id not 4 bytes
        [_i32(1), b""],  # from this node itself
        [_i32(3), b""],  # no such node
        [_i32(0), b"\x00\x00\x00\x02\x00\x00\x00\x10" + bytes(16)],  # a Runtime
        [_i32(0), b"\x00\x00\x00\x01\x00\x00\x00\x08" + bytes(4)],  # size != frame
        [_i32(0), b"\x00\x00\x00\x01\x00\x00\x00\x06" + bytes(6)],  # not whole words
        [_i32(0), b"\x00\x00\x00\x01\x00\x00\x00\x04" + bytes(4) + bytes(3)],  # a tail
        [_i32(0), b"\x00\x00\x00\x01\x00\x00\x00\x00" + b"\x00\x00\x00\x03" + bytes(4)],
    ],
)
def test_session_malformed_peer_message_is_counted_and_dropped(y2_codec, frames):
    s = _indexed_session(y2_codec)
    s.worker_connected()
    s.worker_sent(s.worker_buffered)  # the index
    assert s.peer_message(frames) is False
    assert s.counters.peer_errors == 1 and s.worker_buffered == 0


def test_session_batches_the_deltas_of_one_read(y2_codec):
    s = _indexed_session(y2_codec)
    s.worker_connected()
    d = [_delta(y2_codec, 1, k) for k in range(3)]
    rt = y2_codec.encode(y2.Runtime(1, 2, 3, 4))
    events = s.worker_data(d[0] + d[1] + rt + d[2])
    assert events == [
        ToPeers((_i32(1), d[0] + d[1])),
        ToClient((RUNTIME, _i32(1), rt)),
        ToPeers((_i32(1), d[2])),
    ]
    assert (s.counters.deltas_from_worker, s.counters.words_from_worker) == (3, 9)
    # a receiving session takes the batch whole and counts its Deltas
    r = _indexed_session(y2_codec, 0)
    r.worker_connected()
    r.worker_sent(r.worker_buffered)
    assert r.peer_message([_i32(1), d[0] + d[1]])
    assert (r.counters.deltas_to_worker, r.counters.words_to_worker) == (2, 6)
    assert bytes(r.data_to_worker()) == d[0] + d[1]


def test_session_batch_is_capped(y2_codec):
    s = _indexed_session(y2_codec)
    s.worker_connected()
    per = 1000  # 4008 bytes a Delta
    big = _delta(y2_codec, 1, 0, per)
    n = 2 * MAX_BATCH // len(big) + 1
    events = s.worker_data(big * n)
    assert all(isinstance(e, ToPeers) for e in events) and len(events) == 3
    assert all(len(e.frames[1]) <= MAX_BATCH for e in events)
    assert sum(len(e.frames[1]) for e in events) == n * len(big)


def test_session_block_policy_stops_taking_peer_deltas_past_the_cap(y2_codec):
    d = _delta(y2_codec, 0, 0)
    s = _indexed_session(y2_codec, max_worker_buffer=3 * len(d))
    s.worker_connected()
    s.worker_data(_delta(y2_codec, 1, 0))  # it spoke: what it is written is its own
    s.worker_sent(s.worker_buffered)
    taken = 0
    while s.accepts_peer_input:
        assert s.peer_message([_i32(0), d])
        taken += 1
        assert taken < 100
    assert taken == 3 and s.worker_buffered == 3 * len(d)
    assert s.counters.deltas_dropped == 0
    s.worker_sent(len(d) + 5)  # the worker reads: room again
    assert s.accepts_peer_input
    assert bytes(s.data_to_worker()) == d[5:]


def test_session_drop_policy_drops_and_counts(y2_codec):
    d = _delta(y2_codec, 0, 0)
    s = _indexed_session(y2_codec, max_worker_buffer=2 * len(d), slow_worker="drop")
    s.worker_connected()
    s.worker_sent(s.worker_buffered)
    for _ in range(5):
        assert s.accepts_peer_input and s.peer_message([_i32(2), d])
    assert s.worker_buffered == 2 * len(d)
    assert (s.counters.deltas_to_worker, s.counters.deltas_dropped) == (2, 3)
    assert s.counters.words_dropped == 9


def test_session_keeps_deltas_for_a_worker_not_connected_yet(y2_codec):
    s = _indexed_session(y2_codec)
    index = y2_codec.encode(y2.NodeIndex(1, 3))
    d = [_delta(y2_codec, 0, k) for k in range(3)]
    assert s.peer_message([_i32(0), d[0]])  # no worker yet: kept, not written anywhere
    assert s.data_to_worker() is None and s.worker_buffered == len(d[0])
    s.worker_connected()
    assert b"".join(bytes(b) for b in s.buffers_to_worker()) == index + d[0]  # index first
    s.worker_data(_delta(y2_codec, 1, 0))  # it spoke: what it is written is its own
    s.worker_sent(len(index) + 5)  # the worker goes in the middle of a Delta
    assert s.peer_message([_i32(2), d[1]])
    s.worker_closed()
    assert (s.counters.deltas_dropped, s.counters.words_dropped) == (1, 3)  # the cut one
    assert s.peer_message([_i32(0), d[2]])
    s.worker_connected()  # the next worker: its index, then what was kept
    assert b"".join(bytes(b) for b in s.buffers_to_worker()) == index + d[1] + d[2]
    assert s.counters.deltas_to_worker == 3


def test_session_block_policy_holds_peers_back_until_the_worker_comes(y2_codec):
    d = _delta(y2_codec, 0, 0)
    s = _indexed_session(y2_codec, max_worker_buffer=2 * len(d))
    assert s.peer_message([_i32(0), d]) and s.peer_message([_i32(0), d])
    assert not s.accepts_peer_input and s.counters.deltas_dropped == 0
    s.worker_connected()
    s.worker_sent(s.worker_buffered)
    assert s.accepts_peer_input


def test_session_bad_client_messages_are_counted(y2_codec):
    s = NodeSession("tcp://x:1", codec=y2_codec)
    bad_index = b"\x00\x00\x00\x00\x00\x00\x00\x08" + _i32(5) + _i32(3)
    good_index = y2_codec.encode(y2.NodeIndex(0, 2))
    for frames in (
        [INDEX, bad_index, b"tcp://a:1", b"tcp://a:2", b"tcp://a:3"],
        [b"?"],
        [],
        [INDEX, b"", b"tcp://a:1"],
        [INDEX, good_index, b"tcp://a:1", b"junk"],  # an inbox no one can connect to
        [INDEX, good_index, b"tcp://a:1"],  # 2 nodes, 1 inbox
    ):
        assert s.client_message(frames) == []
    assert s.counters.client_errors == 6 and s.node is None
    assert s.client_message([REFUSED, b"full"]) == [Stop("full")]


# ------------------------------------------------------------------ clusters on loopback


@contextmanager
def _cluster(
    n: int = 3, first: dict | None = None, **service_kw
) -> Iterator[tuple[ClientService, list[NodeService]]]:
    """A client and ``n`` services in threads; ``first``: more options for service 0."""
    stop = threading.Event()
    client = ClientService(n, "tcp://127.0.0.1:*")
    services = [
        NodeService(
            client.address,
            ("127.0.0.1", 0),
            name=f"node-{k}",
            **service_kw,
            **((first or {}) if k == 0 else {}),
        )
        for k in range(n)
    ]
    threads = [threading.Thread(target=client.run, args=(stop,), daemon=True)]
    threads += [threading.Thread(target=s.run, args=(stop,), daemon=True) for s in services]
    for t in threads:
        t.start()
    try:
        yield client, services
    finally:
        stop.set()
        for t in threads:
            t.join(TIMEOUT)
        assert not any(t.is_alive() for t in threads)


def _exchange(links: list[WorkerLink], deltas: int, per: int = 3) -> dict[int, dict[int, list]]:
    """Every worker sends ``deltas`` Deltas; returns, per receiver, per sender, the seqs."""
    index = [link.node_index(TIMEOUT) for link in links]
    assert sorted(i.node_id for i in index) == list(range(len(links)))
    assert {i.node_count for i in index} == {len(links)}
    for link, ix in zip(links, index, strict=True):
        link.send_raw(b"".join(_delta(y2, ix.node_id, k, per) for k in range(deltas)))
    got: dict[int, dict[int, list]] = {}
    for link, ix in zip(links, index, strict=True):
        seen: dict[int, list] = {}
        for d in link.deltas((len(links) - 1) * deltas, TIMEOUT):
            layer, _, idx, _ = y2.unpack(np.asarray(d.words))
            assert len(set(layer.tolist())) == 1
            seen.setdefault(int(layer[0]), []).append(int(idx[0]))
        got[ix.node_id] = seen
    return got


def test_cluster_of_three_delivers_every_delta_once_in_order():
    deltas = 200
    with _cluster() as (client, services):
        links = [WorkerLink(s.worker_address) for s in services]
        try:
            got = _exchange(links, deltas)
            for receiver, seen in got.items():
                assert sorted(seen) == [i for i in range(3) if i != receiver]
                for sender in seen:
                    assert seen[sender] == list(range(deltas)), (receiver, sender)
            for link in links:
                ix = link.node_index()
                link.send(y2.Runtime(deltas, 1, 2, 3, 100 + ix.node_id))
                link.send(y2.Finished())
            for link in links:  # the client says done: every service closes its worker
                assert link.receive(TIMEOUT) is None
        finally:
            for link in links:
                link.close()
        reg = client.registry
        assert reg.done
        runtimes = {n: m for n, m in reg.report.records if isinstance(m, y2.Runtime)}
        assert runtimes == {i: y2.Runtime(deltas, 1, 2, 3, 100 + i) for i in range(3)}
        finished = sorted(n for n, m in reg.report.records if isinstance(m, y2.Finished))
        assert finished == [0, 1, 2]
        for s in services:
            c = s.counters()
            assert c["deltas_from_worker"] == deltas and c["deltas_to_worker"] == 2 * deltas
            assert c["deltas_dropped"] == c["peer_errors"] == c["worker_errors"] == 0


def test_worker_that_reconnects_gets_its_id_again():
    with _cluster() as (_client, services):
        links = [WorkerLink(s.worker_address) for s in services]
        try:
            first = [link.node_index(TIMEOUT) for link in links]
            links[1].close()
            links[1] = WorkerLink(services[1].worker_address)
            assert links[1].node_index(TIMEOUT) == first[1]
            got = _exchange(links, 5)  # and the cluster still works
            assert all(len(seen) == 2 for seen in got.values())
            assert services[1].counters()["worker_connections"] == 2
        finally:
            for link in links:
                link.close()


def test_restarted_service_gets_its_id_again(tmp_path):
    client = ClientService(3, "tcp://127.0.0.1:*")
    stop_all, stop_one = threading.Event(), threading.Event()

    def service(k: int) -> NodeService:
        inbox = f"ipc://{tmp_path}/inbox{k}"  # fixed: the others stay connected to it
        return NodeService(client.address, ("127.0.0.1", 0), name=f"n{k}", inbox=inbox)

    services = [service(k) for k in range(3)]
    threads = [threading.Thread(target=client.run, args=(stop_all,), daemon=True)]
    threads += [
        threading.Thread(target=s.run, args=(stop_one if k == 1 else stop_all,), daemon=True)
        for k, s in enumerate(services)
    ]
    for t in threads:
        t.start()
    links: list[WorkerLink] = []
    try:
        links = [WorkerLink(s.worker_address) for s in services]
        before = links[1].node_index(TIMEOUT)
        stop_one.set()
        threads[2].join(TIMEOUT)
        assert not threads[2].is_alive()
        links[1].close()
        services[1] = service(1)  # the same name and inbox, a new worker port
        threads[2] = threading.Thread(target=services[1].run, args=(stop_all,), daemon=True)
        threads[2].start()
        links[1] = WorkerLink(services[1].worker_address)
        assert links[1].node_index(TIMEOUT) == before
        assert client.registry.counters.reconnections == 1
        got = _exchange(links, 5)  # the cluster works on with the new service
        assert all(seen == {s: list(range(5)) for s in seen} for seen in got.values())
        assert all(len(seen) == 2 for seen in got.values())
    finally:
        stop_all.set()
        for link in links:
            link.close()
        for t in threads:
            t.join(TIMEOUT)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    out = bytearray()
    while len(out) < n and (chunk := sock.recv(n - len(out))):
        out += chunk
    return bytes(out)


def test_malformed_worker_input_closes_that_link_and_the_service_goes_on(caplog):
    caplog.set_level("INFO", logger="wirekit.y2.service")
    with _cluster() as (_client, services):
        links = [WorkerLink(s.worker_address) for s in services]
        try:
            index = links[0].node_index(TIMEOUT)
            links[0].send_raw(b"\x00\x00\x00\x09\x00\x00\x00\x00")  # type 9
            assert links[0].receive(TIMEOUT) is None  # the service closed the link
            links[0].close()
            # a second connection replaces the open one (a worker that reconnects before its
            # old connection's end is seen): it gets the index, the old link is closed
            index1 = links[1].node_index(TIMEOUT)
            with socket.create_connection(services[1].worker_address) as extra:
                extra.settimeout(TIMEOUT)
                assert _recv_exact(extra, 16) == y2.encode(index1)
                assert links[1].receive(TIMEOUT) is None
            links[1].close()
            links[1] = WorkerLink(services[1].worker_address)
            assert links[1].node_index(TIMEOUT) == index1
            links[0] = WorkerLink(services[0].worker_address)
            assert links[0].node_index(TIMEOUT) == index
            got = _exchange(links, 10)
            assert all(seen == {s: list(range(10)) for s in seen} for seen in got.values())
            c0, c1 = services[0].counters(), services[1].counters()
            assert c0["worker_errors"] == 1 and c1["worker_replaced"] >= 1
            assert (
                "worker link: y2: type at byte 0: unknown message type 9 (0..3); "
                "closing the link" in caplog.text
            )
        finally:
            for link in links:
                link.close()


def _wait_for(cond, what: str) -> None:
    """Wait until ``cond()`` (polled; ``TIMEOUT`` bounds a hang)."""
    done = threading.Event()
    deadline = TIMEOUT
    while not cond():
        done.wait(0.01)
        deadline -= 0.01
        assert deadline > 0, f"timed out waiting for {what}"


def _raw_worker(address: tuple[str, int]) -> socket.socket:
    """A worker that reads nothing until told: a socket with a small receive buffer."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(address)
    return sock


@pytest.mark.parametrize("policy", ["block", "drop"])
def test_slow_worker_is_bounded_by_the_policy(policy):
    deltas, per, cap = 2500, 1024, 64 * 1024  # 10 MB of Deltas, far past every buffer
    first = {"max_worker_buffer": cap, "slow_worker": policy}  # node 0's service only
    with _cluster(hwm=4, first=first) as (_client, services):
        slow = _raw_worker(services[0].worker_address)
        links = [WorkerLink(s.worker_address) for s in services[1:]]
        try:
            index = [link.node_index(TIMEOUT) for link in links]
            _wait_for(lambda: services[0].session.node is not None, "node 0's index")
            slow_id = services[0].session.node.node_id
            payload = b"".join(_delta(y2, index[0].node_id, k, per) for k in range(deltas))
            sender = threading.Thread(target=links[0].send_raw, args=(payload,), daemon=True)
            sender.start()
            c_slow = services[0].counters
            if policy == "block":
                # node 0's service stops taking Deltas at its cap (ZeroMQ then holds the
                # rest up to its high-water marks and the sender's service stops reading)
                _wait_for(lambda: c_slow()["peer_input_paused"] > 0, "node 0 to pause")
            else:
                # the others are not held up: the third node gets every Delta while node 0
                # still reads nothing
                third = links[1].deltas(deltas, TIMEOUT)
                assert len(third) == deltas
                _wait_for(
                    lambda: c_slow()["deltas_to_worker"] + c_slow()["deltas_dropped"] == deltas,
                    "every Delta taken or dropped",
                )
                assert c_slow()["deltas_dropped"] > 0
                assert c_slow()["words_dropped"] == per * c_slow()["deltas_dropped"]
            # the cap + one message from a peer (up to MAX_BATCH bytes of Deltas)
            assert c_slow()["worker_buffer_max"] < cap + MAX_BATCH
            # node 0's worker reads now: what its service took arrives whole and in order
            stream = y2.Decoder()
            expected = deltas if policy == "block" else None
            seqs: list[int] = []
            slow.settimeout(TIMEOUT)
            want = expected if expected is not None else c_slow()["deltas_to_worker"]
            while len(seqs) < want:
                stream.feed(slow.recv(1 << 20))
                for msg in stream:
                    if isinstance(msg, y2.Delta):
                        seqs.append(int(msg.words[0]) >> 1 & y2.MAX_INDEX)
                    else:
                        assert msg == y2.NodeIndex(slow_id, 3)
            assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
            if policy == "block":
                assert seqs == list(range(deltas)) and c_slow()["deltas_dropped"] == 0
                assert len(links[1].deltas(deltas, TIMEOUT)) == deltas
            sender.join(TIMEOUT)
            assert not sender.is_alive()
        finally:
            slow.close()
            for link in links:
                link.close()


# ------------------------------------------------------------------ real processes (CLI)


def _spawn(*args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "wirekit.cli", "y2", *args, "--log-level", "warning"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _line(proc: subprocess.Popen, prefix: str) -> str:
    line = proc.stdout.readline()
    assert line.startswith(prefix), (line, proc.stderr.read() if proc.poll() is not None else "")
    return line[len(prefix) :].strip()


def _stop_all(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(TIMEOUT)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        for stream in (p.stdout, p.stderr):
            stream.close()


@contextmanager
def _cli_cluster(tmp_path: Path, n: int = 3, *client_args: str):
    """A client (``--json`` unless ``client_args`` say otherwise) and ``n`` services, all
    processes of the CLI, the services started together (a client's ``--timeout`` then does
    not run out while they start one after the other); yields the client, (service, worker
    address) pairs in the order of their names ``n0``, ``n1``..., and the report file."""
    report = tmp_path / "run.y2"
    client = _spawn(
        "client", "--nodes", str(n), "--listen", "tcp://127.0.0.1:*", "--report", str(report),
        *(client_args or ("--json",)),
    )  # fmt: skip
    procs = [client]
    try:
        address = _line(client, "client listening on ")
        for k in range(n):
            args = ("--client", address, "--worker-listen", "127.0.0.1:0", "--name", f"n{k}")
            procs.append(_spawn("service", *args, "--json"))
        services = []
        for p in procs[1:]:
            host, port = _line(p, "worker link on ").rsplit(":", 1)
            _line(p, "inbox ")
            services.append((p, (host, int(port))))
        yield client, services, report
    finally:
        _stop_all(procs)


def test_cli_processes_client_and_three_services(tmp_path):
    deltas = 50
    with _cli_cluster(tmp_path) as (client, services, report):
        links = [WorkerLink(addr) for _, addr in services]
        try:
            got = _exchange(links, deltas)
            assert all(seen == {s: list(range(deltas)) for s in seen} for seen in got.values())
            assert all(len(seen) == 2 for seen in got.values())
            for link in links:
                link.send(y2.Runtime(deltas, 5, 6, 7))
                link.send(y2.Finished())
            out, err = client.communicate(timeout=TIMEOUT)
        finally:
            for link in links:
                link.close()
        assert client.returncode == 0, err
        summary = json.loads(out)
        assert summary["done"] is True
        assert [n["node_id"] for n in summary["nodes"]] == [0, 1, 2]
        runtimes = [r for r in summary["records"] if r["kind"] == "runtime"]
        assert sorted(r["node_id"] for r in runtimes) == [0, 1, 2]
        assert all(r["sample_count"] == deltas for r in runtimes)
        fins = [r["node_id"] for r in summary["records"] if r["kind"] == "finished"]
        assert sorted(fins) == [0, 1, 2]
        for p, _ in services:  # every service exits 0 once the client says done
            out, err = p.communicate(timeout=TIMEOUT)
            assert p.returncode == 0, err
            c = json.loads(out.splitlines()[-1])["counters"]
            assert c["deltas_from_worker"] == deltas and c["deltas_to_worker"] == 2 * deltas
        # the report: y2 messages that wirekit decode reads
        dec = subprocess.run(
            [sys.executable, "-m", "wirekit.cli", "decode", "--proto", "y2", "--json", str(report)],
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
        )
        assert dec.returncode == 0, dec.stderr
        records = [json.loads(line) for line in dec.stdout.splitlines() if line.strip()]
        kinds = [r["kind"] for r in records]
        assert kinds.count("node_index") == 6 and kinds.count("runtime") == 3
        assert kinds.count("finished") == 3


def test_cli_service_refuses_an_inbox_others_cannot_reach():
    p = _spawn("service", "--client", "tcp://127.0.0.1:1", "--worker-listen", "127.0.0.1:0",
               "--inbox", "tcp://0.0.0.0:*")  # fmt: skip
    _out, err = p.communicate(timeout=TIMEOUT)
    assert p.returncode == 2 and "give --advertise" in err


def test_cli_refused_node_exits_with_an_error(tmp_path):
    client = _spawn("client", "--nodes", "1", "--listen", "tcp://127.0.0.1:*")
    procs = [client]
    try:
        address = _line(client, "client listening on ")
        first = _spawn("service", "--client", address, "--worker-listen", "127.0.0.1:0")
        procs.append(first)
        _line(first, "worker link on ")
        second = _spawn(
            "service", "--client", address, "--worker-listen", "127.0.0.1:0", "--name", "other"
        )
        procs.append(second)
        _, err = second.communicate(timeout=TIMEOUT)
        assert second.returncode == 1 and "the cluster has 1 nodes" in err
    finally:
        _stop_all(procs)


# ------------------------------------------------------------------ how a cluster ends


def _node_links(services) -> tuple[list[WorkerLink], list[y2.NodeIndex]]:
    links = [WorkerLink(addr) for _, addr in services]
    return links, [link.node_index(TIMEOUT) for link in links]


def test_cli_worker_connections_closing_before_finished_end_the_cluster(tmp_path):
    # what y2's own workers do (see the tests with y2's class below): the connection closes
    # before Finished leaves the worker.  Node 0 finishes; the others only close.
    deltas, per = 20, 3
    with _cli_cluster(tmp_path) as (client, services, report):
        links, index = _node_links(services)
        try:
            got = _exchange(links, deltas, per)
            assert all(seen == {s: list(range(deltas)) for s in seen} for seen in got.values())
            for link, ix in zip(links, index, strict=True):
                link.send(y2.Runtime(deltas, 5, 6, 7, 100 + ix.node_id))
            links[0].send(y2.Finished())
        finally:
            for link in links:
                link.close()
        out, err = client.communicate(timeout=TIMEOUT)  # it ends by itself
        assert client.returncode == 0, err
        for p, _ in services:  # and so does every service
            p.communicate(timeout=TIMEOUT)
            assert p.returncode == 0
    summary = json.loads(out)
    assert summary["done"] is True and summary["outcome"] == "ended"
    nodes = {n["node_id"]: n for n in summary["nodes"]}
    finished = index[0].node_id
    assert {i: n["state"] for i, n in nodes.items()} == {
        i: "finished" if i == finished else "ended" for i in range(3)
    }
    for n in nodes.values():  # what each worker did, as its service saw it
        a = n["activity"]
        # the finished node's closing may reach the client after it is done
        assert a["worker_connections"] == 1 and a["node_index_to_worker"] == 1
        assert a["worker_attached"] is False or n["node_id"] == finished
        assert (a["deltas_from_worker"], a["words_from_worker"]) == (deltas, deltas * per)
        assert a["runtime_from_worker"] == 1 and a["deltas_to_worker"] == 2 * deltas
        assert a["finished_from_worker"] == (n["node_id"] == finished)
    runtimes = sorted(r["node_id"] for r in summary["records"] if r["kind"] == "runtime")
    assert runtimes == [0, 1, 2]
    assert [r["node_id"] for r in summary["records"] if r["kind"] == "finished"] == [finished]
    assert report.stat().st_size > 0


def test_cli_summary_for_a_person_says_which_nodes_ended(tmp_path):
    with _cli_cluster(tmp_path, 2, "--log-level", "warning") as (client, services, _report):
        links, index = _node_links(services)
        links[0].send(y2.Finished())
        links[1].send(y2.Runtime(1, 2, 3, 4))  # it spoke: its closing ends its node
        for link in links:
            link.close()
        out, err = client.communicate(timeout=TIMEOUT)
    assert client.returncode == 0, err
    ended = index[1].node_id
    lines = out.splitlines()
    assert (
        f"node {ended}: ended without Finished (its worker's connection closed); its worker "
        "sent 0 Deltas (0 words), 1 Runtime, 0 Finished; got 1 NodeIndex, 0 Deltas; "
        "1 connection(s)" in lines
    )
    assert any(line.startswith(f"node {index[0].node_id}: finished; ") for line in lines)
    assert lines[-1].startswith(f"every node finished or ended; without Finished: node {ended};")


def test_cli_timeout_gives_up_on_a_stalled_worker_and_stops_every_service(tmp_path):
    deltas = 10
    args = ("--timeout", "6", "--json")  # far more than a service's start on a loaded machine
    with _cli_cluster(tmp_path, 3, *args) as (client, services, _report):
        links, index = _node_links(services)
        try:
            _exchange(links, deltas)
            # two workers end; the third stays connected and sends nothing more
            for link in links[:2]:
                link.send(y2.Finished())
                link.close()
            out, err = client.communicate(timeout=TIMEOUT)
            service_ends = [p.communicate(timeout=TIMEOUT) for p, _ in services]
        finally:
            for link in links:
                link.close()
    stalled = index[2].node_id
    assert client.returncode == 1
    assert f"no progress for 6 s; still running: node {stalled} (n2, running)" in err
    summary = json.loads(out)
    assert summary["done"] is False and summary["outcome"] == "aborted"
    states = {n["node_id"]: n["state"] for n in summary["nodes"]}
    assert states == {i: "running" if i == stalled else "finished" for i in range(3)}
    stalled_activity = summary["nodes"][stalled]["activity"]
    assert stalled_activity["deltas_from_worker"] == deltas
    assert stalled_activity["deltas_to_worker"] == 2 * deltas
    for (p, _), (_out, service_err) in zip(services, service_ends, strict=True):
        assert p.returncode == 1
        assert "wirekit y2 service: the client gave up: no progress for 6 s" in service_err


def test_cli_timeout_names_the_nodes_that_never_registered():
    client = _spawn("client", "--nodes", "2", "--listen", "tcp://127.0.0.1:*", "--timeout", "0.5")
    out, err = client.communicate(timeout=TIMEOUT)
    assert client.returncode == 1
    assert "no progress for 0.5 s; still running: 2 of 2 nodes not registered" in err
    assert out.splitlines()[-1].startswith("gave up: no progress for 0.5 s;")


@pytest.mark.parametrize("bad", ["0", "nan", "soon"])
def test_cli_timeout_must_be_a_positive_number_of_seconds(bad):
    client = _spawn("client", "--nodes", "1", "--timeout", bad)
    _out, err = client.communicate(timeout=TIMEOUT)
    assert client.returncode == 2 and "--timeout" in err


# ------------------------------------------------------------------ y2's own worker class

Y2_COMMUNICATION = os.environ.get("WIREKIT_Y2_COMMUNICATION")
#: A Python with the janus y2 pins (3.7, janus 0.4.0); else this one, with a janus stand-in.
Y2_PYTHON = os.environ.get("WIREKIT_Y2_PYTHON") or sys.executable
EPOCHS = 2  # Runtime messages tests/y2_peer/run_y2_worker.py sends before its ending

needs_y2 = pytest.mark.skipif(
    not Y2_COMMUNICATION,
    reason="set WIREKIT_Y2_COMMUNICATION to y2's worker_service/communications/"
    "communication.py (y2's worker is not on PyPI), and WIREKIT_Y2_PYTHON to a Python 3.7 "
    "with janus==0.4.0",
)


def _y2_worker(port: int, deltas: int, per: int, ending: str) -> subprocess.Popen:
    """y2's ``Communication`` class as a node's worker, ending as ``ending`` says."""
    script = HERE / "y2_peer" / "run_y2_worker.py"
    return subprocess.Popen(
        [Y2_PYTHON, str(script), str(Y2_COMMUNICATION), str(port), str(deltas), str(per), ending],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _checked(result: dict) -> dict:
    """A worker's result; with ``WIREKIT_Y2_PYTHON``, it ran on the janus y2 pins."""
    if os.environ.get("WIREKIT_Y2_PYTHON"):
        assert result["janus"] == "0.4.0", result
    return result


def _y2_cluster_run(
    tmp_path: Path, endings: list[str], deltas: int, per: int, *client_args: str
) -> tuple[list[dict], subprocess.CompletedProcess, list[int]]:
    """Three services of the CLI and y2's class as their workers, each ending as
    ``endings`` says; waits for the client to exit by itself.  Returns the workers' results
    (in node order), the client's end and the services' exit codes."""
    with _cli_cluster(tmp_path, len(endings), *client_args) as (client, services, _report):
        workers = [
            _y2_worker(port, deltas, per, ending)
            for (_, (_h, port)), ending in zip(services, endings, strict=True)
        ]
        try:
            results = []
            for w, ending in zip(workers, endings, strict=True):
                if ending == "stall":  # its line comes before it stalls
                    line, err = w.stdout.readline(), ""
                else:
                    line, err = w.communicate(timeout=2 * TIMEOUT)
                    assert w.returncode == 0, err
                results.append(_checked(json.loads(line.splitlines()[-1])))
            out, err = client.communicate(timeout=TIMEOUT)  # the old client waited for ever
            service_codes = [p.wait(TIMEOUT) for p, _ in services]
        finally:
            _stop_all(workers)
    assert sorted(r["node_id"] for r in results) == [0, 1, 2]
    for r in results:  # every Delta arrived, once, in order
        senders = {int(k): v for k, v in r["received"].items()}
        assert senders == {i: list(range(deltas)) for i in range(3) if i != r["node_id"]}
    ended = subprocess.CompletedProcess(client.args, client.returncode, out, err)
    return sorted(results, key=lambda r: r["node_id"]), ended, service_codes


@needs_y2
def test_y2_own_communication_class_as_the_workers(tmp_path):
    _, client, service_codes = _y2_cluster_run(tmp_path, ["graceful"] * 3, 20, 4)
    assert client.returncode == 0, client.stderr
    assert service_codes == [0, 0, 0]
    summary = json.loads(client.stdout)
    assert summary["outcome"] == "finished"
    losses = sorted(
        (r["node_id"], r["loss_milli"]) for r in summary["records"] if "loss_milli" in r
    )
    assert losses == [(i, 4000 + 10 * i + e) for i in range(3) for e in range(EPOCHS)]
    fins = sorted(r["node_id"] for r in summary["records"] if r["kind"] == "finished")
    assert fins == [0, 1, 2]


@needs_y2
def test_y2_main_py_ending_ends_the_cluster(tmp_path):
    # y2's main.py queues Finished and stops its link at once: the last Runtime and Finished
    # usually never leave the worker (with janus 0.4.0: never, in our runs).  The client ends
    # by itself all the same, and says, per node, whether it finished or ended without
    # Finished, with what its worker did send.
    deltas, per = 20, 4
    _, client, service_codes = _y2_cluster_run(tmp_path, ["main"] * 3, deltas, per)
    assert client.returncode == 0, client.stderr
    assert service_codes == [0, 0, 0]
    summary = json.loads(client.stdout)
    assert summary["done"] is True
    finished = {r["node_id"] for r in summary["records"] if r["kind"] == "finished"}
    runtimes = [r["node_id"] for r in summary["records"] if r["kind"] == "runtime"]
    for n in summary["nodes"]:
        a = n["activity"]
        assert n["state"] == ("finished" if n["node_id"] in finished else "ended")
        assert a["node_index_to_worker"] == 1
        assert a["worker_attached"] is False or n["state"] == "finished"
        assert (a["deltas_from_worker"], a["words_from_worker"]) == (deltas, deltas * per)
        assert a["deltas_to_worker"] == 2 * deltas
        # the epochs' Runtime went out; the last one may have been lost with Finished
        assert a["runtime_from_worker"] == runtimes.count(n["node_id"])
        assert EPOCHS <= a["runtime_from_worker"] <= EPOCHS + 1
    assert summary["outcome"] == ("finished" if len(finished) == 3 else "ended")


@needs_y2
def test_y2_stalled_worker_times_out(tmp_path):
    results, client, service_codes = _y2_cluster_run(
        tmp_path, ["main", "main", "stall"], 10, 4, "--timeout", "6", "--json"
    )
    assert client.returncode == 1 and service_codes == [1, 1, 1]
    [stalled] = [r["node_id"] for r in results if r["ending"] == "stall"]
    summary = json.loads(client.stdout)
    assert summary["outcome"] == "aborted"
    states = {n["node_id"]: n["state"] for n in summary["nodes"]}
    assert states[stalled] == "running"
    assert all(states[i] in ("finished", "ended") for i in range(3) if i != stalled)
    assert summary["nodes"][stalled]["activity"]["runtime_from_worker"] == EPOCHS
    assert f"no progress for 6 s; still running: node {stalled} (n2, running)" in client.stderr
