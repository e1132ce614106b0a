"""The compiled runtime helpers (``wirekit/_fast/mipnet.pyx``) against their pure-Python
definitions in ``wirekit.mip.runtime``: same results, same exceptions, for any input."""

from __future__ import annotations

import asyncio
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

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


@given(st.booleans(), st.integers(0, 255), st.integers(0, 255), st.integers(0, 65535),
       st.lists(st.builds(Item, st.integers(0, 5), st.binary(max_size=4)), max_size=4))
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
    assert outcomes[0] == {_returns: (True, "v"), _suspends: (False, None),
                           _raises: ("raised", ("v",))}[body]


def test_start_keeps_reference_counts():
    value = object()
    before = sys.getrefcount(value)
    for _ in range(1000):
        assert accel.start(_returns(value)) == (True, value)
    assert sys.getrefcount(value) == before
