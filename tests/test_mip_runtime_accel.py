"""The compiled runtime helpers (``wirekit/_fast/mipnet.pyx``) against their pure-Python
definitions in ``wirekit.mip.runtime``: same results, same exceptions, for any input."""

from __future__ import annotations

import asyncio
import sys
from collections import deque

import pytest
from hypothesis import given
from hypothesis import strategies as st
from strategies import mip_messages, mutated

from wirekit import mip
from wirekit._impl import load_fast, pure_requested
from wirekit.mip import Inference, Item
from wirekit.mip import runtime as rt

accel = load_fast("mipnet")
pytestmark = pytest.mark.skipif(
    accel is None and pure_requested(), reason="WIREKIT_PURE=1: no compiled helpers to compare"
)


def test_the_compiled_helpers_are_the_ones_in_use():
    assert accel is not None, "wirekit._fast.mipnet is not built"
    assert rt._flatten is accel.flatten
    assert rt._new_inference is accel.new_inference
    assert rt._singles is accel.singles
    assert rt._start is accel.start
    assert rt.deliver_replies is accel.deliver


class Odd:
    """Not JSON-serialisable: to_item must refuse it the same way from both."""


values = st.one_of(
    st.text(max_size=8),
    st.binary(max_size=8),
    st.builds(Item, st.integers(0, 5), st.binary(max_size=8)),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
    st.integers(),
    st.none(),
    st.just(Odd()),
)
samples = st.one_of(
    st.lists(values, max_size=3),
    st.lists(values, max_size=3).map(tuple),
    st.lists(values, max_size=3).map(iter),  # any other iterable
    values,  # a bare single value
)


def _outcome(fn, *args):
    try:
        return ("ok", fn(*args))
    except rt._Ragged as exc:
        return ("ragged", exc.sample, exc.got, exc.width)
    except Exception as exc:  # the exception itself is what is compared
        return ("raised", type(exc), str(exc))


def _is_iter(sample) -> bool:
    return type(sample).__name__ == "list_iterator"


@given(st.lists(samples, max_size=6))
def test_flatten_agrees(batch):
    # An iterator sample is consumed: give each implementation its own.
    frozen = [(True, list(s)) if _is_iter(s) else (False, s) for s in batch]

    def fresh():
        return [iter(s) if it else s for it, s in frozen]

    got = _outcome(accel.flatten, fresh())
    want = _outcome(rt._flatten_py, fresh())
    assert got == want
    if got[0] == "ok":
        items = got[1][0]
        assert type(items) is tuple and all(type(i) is Item for i in items)


def test_flatten_of_a_non_iterable_raises_the_same():
    assert _outcome(accel.flatten, 5) == _outcome(rt._flatten_py, 5)


@given(
    st.booleans(),
    st.integers(0, 255),
    st.integers(0, 255),
    st.integers(0, 65535),
    st.lists(st.builds(Item, st.integers(0, 5), st.binary(max_size=4)), max_size=4),
)
def test_new_inference_is_the_dataclass(response, n_in, n_out, batch, items):
    got = accel.new_inference(response, n_in, n_out, batch, tuple(items))
    want = Inference(response, n_in, n_out, batch, tuple(items))
    assert type(got) is Inference and got == want and hash(got) == hash(want)
    with pytest.raises(AttributeError):
        got.n_input = 3  # still frozen


@given(st.lists(st.builds(Item, st.integers(0, 5), st.binary(max_size=4)), max_size=40))
def test_singles_agree(items):
    got = accel.singles(tuple(items))
    assert got == rt._singles_py(tuple(items))
    assert type(got) is tuple and all(type(s) is tuple and len(s) == 1 for s in got)


async def _returns(value):
    return value


async def _suspends(value):
    await asyncio.sleep(0)
    return value


async def _raises(value):
    raise KeyError(value)


@pytest.mark.parametrize("body", [_returns, _suspends, _raises])
def test_start_agrees(body):
    outcomes = []
    for start in (accel.start, rt._start_py):
        coro = body("v")
        try:
            done, value = start(coro)
            outcomes.append((done, value))
        except KeyError as exc:
            outcomes.append(("raised", exc.args))
        finally:
            coro.close()
    assert outcomes[0] == outcomes[1]
    assert (
        outcomes[0]
        == {_returns: (True, "v"), _suspends: (False, None), _raises: ("raised", ("v",))}[body]
    )


def test_start_keeps_reference_counts():
    value = object()
    before = sys.getrefcount(value)
    for _ in range(1000):
        assert accel.start(_returns(value)) == (True, value)
    assert sys.getrefcount(value) == before


class _Recorder:
    """A pending call whose future records what it is given (``done`` from the start when
    it stands for a call that timed out)."""

    def __init__(self, log: list, done: bool) -> None:
        self.future = self
        self.log = log
        self.settled = done

    def done(self) -> bool:
        return self.settled

    def set_result(self, frame: bytes) -> None:
        assert not self.settled
        self.settled = True
        self.log.append(bytes(frame))


def _deliver_with(deliver, data, dones, max_size):
    log: list = []
    waiting = deque(_Recorder(log, d) for d in dones)
    taken, used = deliver(data, waiting, max_size)
    return taken, used, log, len(waiting)


@given(
    st.lists(
        st.one_of(mip_messages.map(mip.encode), mip_messages.map(mip.encode).flatmap(mutated)),
        max_size=5,
    ),
    st.lists(st.booleans(), max_size=6),
    st.sampled_from([12, 64, 1 << 20]),
)
def test_reply_delivery_agrees(messages, dones, max_size):
    data = b"".join(messages)
    pure = _deliver_with(rt._deliver_py, data, dones, max_size)
    assert _deliver_with(accel.deliver, data, dones, max_size) == pure
    taken, used, log, _left = pure
    # what was taken is whole inference replies from the start, in order, each within the
    # limit; the rest is left to the decoder
    pos = 0
    for _ in range(taken):
        frame = data[pos : pos + 8 + int.from_bytes(data[pos + 4 : pos + 8], "big")]
        assert frame[1] == 2 and len(frame) <= max_size
        pos += len(frame)
    assert pos == used
    assert len(log) == sum(1 for d in dones[:taken] if not d)
