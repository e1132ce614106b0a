"""The ``serve_store`` fuzz target (``fuzz/differential.py``): it notices a compiled store
writer (``wirekit._fast.journal``, ``wirekit._fast.storewriter``) that does not do what its
pure twin does, and its seeds (``fuzz/seeds.py``) reach every writer with real work."""

from __future__ import annotations

from types import SimpleNamespace

import differential
import pytest
import seeds

from wirekit._impl import pure_requested

SEEDS = seeds.seeds("serve_store")


@pytest.fixture(autouse=True)
def both_twins():
    if pure_requested():
        pytest.skip("WIREKIT_PURE=1: the differential check needs the Cython twin")


def _fast_with(monkeypatch, **wrappers):
    """Make the target see compiled writers of which ``wrappers`` (name -> function of the
    real compiled one) are changed."""
    fast, pure = differential.serve_store_twins()
    changed = {name: wrap(getattr(fast, name)) for name, wrap in wrappers.items()}
    wrong = SimpleNamespace(**{**vars(fast), **changed})
    monkeypatch.setattr(differential, "serve_store_twins", lambda: (wrong, pure))


def _one_byte_more(real):
    def arrival_records(*args):
        lines, nbytes, ops = real(*args)
        return lines, nbytes + 1, ops

    return arrival_records


def _names_asked_again(real):
    def ok_records(answers, time_out, tout, names_of, journal, payloads):
        for _rid, device, *_rest in answers:
            names_of(device)  # no memo
        return real(answers, time_out, tout, names_of, journal, payloads)

    return ok_records


def _status_changed(real):
    def ok_records(*args):
        lines, nbytes, ops = real(*args)
        return lines, nbytes, [(kind, (*row[:2], "OK", *row[3:])) for kind, row in ops]

    return ok_records


def _update_lost(real):
    def merge_ops(ops, chunk):
        chunks, rest, updates = real(ops, chunk)
        return chunks, rest, updates[:-1]

    return merge_ops


@pytest.mark.parametrize(
    ("name", "wrap", "match"),
    [
        ("arrival_records", _one_byte_more, r"journal\.arrival_records"),
        ("ok_records", _names_asked_again, "names_of asked"),
        ("ok_records", _status_changed, r"journal\.ok_records"),
        ("merge_ops", _update_lost, r"storewriter\.merge_ops"),
    ],
)
def test_a_writer_unlike_its_twin_is_a_disagreement(monkeypatch, name, wrap, match):
    _fast_with(monkeypatch, **{name: wrap})
    with pytest.raises(differential.Disagreement, match=match):
        differential.serve_store(SEEDS["flags2-chunk0"])


def test_the_seeds_give_every_writer_work():
    fast, pure = differential.serve_store_twins()
    seen = []

    def recorded(name):
        real = getattr(pure, name)

        def call(*args):
            result = real(*args)
            seen.append((name, args, result))
            return result

        return call

    calls = SimpleNamespace(
        **{n: recorded(n) for n in ("arrival_records", "ok_records", "merge_ops")}
    )
    for data in SEEDS.values():
        differential.store_program_trace(fast, calls, data)

    # journal on and off, payloads on and off, records written
    written = {(args[-2], args[-1]) for name, args, _ in seen if name != "merge_ops"}
    assert written == {(False, False), (True, False), (True, True), (False, True)}
    assert any(name == "arrival_records" and result[0] for name, _, result in seen)
    assert any(name == "ok_records" and result[0] for name, _, result in seen)
    merges = [result for name, _, result in seen if name == "merge_ops"]
    assert any(chunks for chunks, _, _ in merges)  # full statements
    assert any(rest for _, rest, _ in merges)  # rows left over
    assert any(updates for _, _, updates in merges)  # completions of earlier arrivals
    merged = [row for chunks, rest, _ in merges for row in rest if row[8] != "queued"]
    assert merged  # an arrival and its end in one hand-over: one complete row
