"""Drivers: what a client under test runs while ``wirekit conform mip client`` tests it.

A kit cannot see what a client does with an answer, so the client reports it, over MIP
itself.  The driver (a few lines in any language, around the client under test):

1. pings, then sends an outcome report;
2. sends one sample of three items built the client's usual way: the TEXT
   ``conform:types``, the JSON value ``{"conform": [1, 2]}`` and the IMAGE :data:`IMAGE`
   (a 1x1 PNG), then an outcome report;
3. in a loop, sends the inference request ``[[TEXT "conform:next"]]`` and then an outcome
   report, until the answer to ``conform:next`` is the TEXT ``conform:done``;
4. except when that answer names a step (its report is then the step's own):
   ``conform:step:reuse``: build the sample ``[TEXT "conform:reuse"]`` once, the client's
   usual way, and send that same built sample twice, each send followed by an outcome
   report; ``conform:step:empty``: send a batch of no samples, then an outcome report
   (``ok:`` and the number of samples answered).  A step that cannot run (the sample
   could not be built) still sends its reports (``failed:`` and why).

An outcome report is the request ``[[TEXT "conform:outcome", TEXT OUTCOME]]`` with OUTCOME
``ok:`` followed by the first output's text (``ok`` for a ping), ``error:CODE`` when the
client raised the server's error reply CODE, or ``failed:`` and a description when the call
failed any other way (a malformed reply, a lost connection, a timeout).  The kit answers
each ``conform:next`` with the answer its current case is about.

:func:`mip_client` is the driver of wirekit's own blocking client:
``python -m wirekit.conform.drivers tcp://127.0.0.1:PORT``.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Sequence

NEXT = "conform:next"
TYPES = "conform:types"
JSON_VALUE = {"conform": [1, 2]}
DONE = "conform:done"
OUTCOME = "conform:outcome"
#: the answer to ``conform:next`` asking for step 4: one built sample sent twice
STEP_REUSE = "conform:step:reuse"
#: the one TEXT of the sample the reuse step builds
REUSE = "conform:reuse"
#: the answer to ``conform:next`` asking for step 4: a batch of no samples
STEP_EMPTY = "conform:step:empty"
#: the longest run of cases a driver goes through (a kit that never says done)
MAX_ROUNDS = 1000


def image() -> bytes:
    """The IMAGE item a driver sends: a 1x1 PNG."""
    from .suites.mip_server import PNG

    return PNG


def drive(ping: Callable[[], object], infer: Callable[[Sequence[str]], str],
          typed: Callable[[str, object, bytes], str],
          error_code: Callable[[BaseException], int | None], *,
          build: Callable[[Sequence[str]], object] | None = None,
          send: Callable[[Sequence[object]], Sequence[str]] | None = None) -> int:  # fmt: skip
    """The driver loop around any client: ``ping()``; ``infer(texts)`` sends one sample of
    TEXT items and returns the first output's text; ``typed(text, json_value, image)``
    sends one sample of a TEXT, a JSON and an IMAGE item and returns the first output's
    text; ``error_code(exc)`` is the server's error code an exception carries, or None.
    For the steps: ``build(texts)`` is one sample of TEXT items built the client's usual
    way (what a caller keeps and passes again), ``send(samples)`` sends a batch of built
    samples and returns each sample's first output text (without them a step reports
    ``failed:``).  Returns the rounds driven."""

    def outcome(call: Callable[[], str]) -> tuple[str, bool]:
        try:
            text = call()
        except Exception as exc:  # what the client raised is the outcome
            code = error_code(exc)
            if code is not None:
                return f"error:{code}", False
            return f"failed:{type(exc).__name__}: {exc}"[:200], False
        return f"ok:{text}", text == DONE

    def report(text: str) -> None:
        with contextlib.suppress(Exception):  # the kit judges the report's absence
            infer([OUTCOME, text])

    def send_batch(samples: Sequence[object]) -> Sequence[str]:
        if send is None:
            raise NotImplementedError("this driver has no send() for the steps")
        return send(samples)

    def reuse_step() -> None:
        try:
            if build is None:
                raise NotImplementedError("this driver has no build() for the steps")
            sample = build([REUSE])
        except Exception as exc:
            failed = f"failed:{type(exc).__name__}: {exc}"[:200]
            report(failed)
            report(failed)
            return
        for _ in range(2):  # the same built sample, twice
            report(outcome(lambda: send_batch([sample])[0])[0])

    steps = {
        f"ok:{STEP_REUSE}": reuse_step,
        f"ok:{STEP_EMPTY}": lambda: report(outcome(lambda: str(len(send_batch([]))))[0]),
    }
    result, _ = outcome(lambda: (ping(), "")[1])
    report("ok" if result == "ok:" else result)
    report(outcome(lambda: typed(TYPES, JSON_VALUE, image()))[0])
    for rounds in range(1, MAX_ROUNDS + 1):
        result, done = outcome(lambda: infer([NEXT]))
        if done:
            return rounds
        step = steps.get(result)
        if step is not None:
            step()
        else:
            report(result)
    return MAX_ROUNDS


def mip_client(address: str, timeout: float = 5.0) -> int:
    """Drive wirekit's blocking :class:`~wirekit.mip.client.Client` against the kit."""
    from wirekit.mip import Item
    from wirekit.mip.client import Client, ServerError

    with Client(address, timeout=timeout) as client:
        return drive(
            client.ping,
            lambda texts: client.infer([list(texts)])[0][0].as_text(),
            lambda text, value, png: client.infer([[text, value, png]])[0][0].as_text(),
            lambda exc: exc.code if isinstance(exc, ServerError) else None,
            build=lambda texts: [Item.text(t) for t in texts],
            send=lambda samples: [out[0].as_text() for out in client.infer(list(samples))],
        )


if __name__ == "__main__":
    mip_client(sys.argv[1])
