"""Run a suite's cases against a target: selection, time bounds, verdicts, exit status.

Every case runs under a :class:`~wirekit.conform.core.net.Deadline` that bounds each of its
waits; the runner runs it on a worker thread as well and gives up on it shortly after its
deadline, so one case that hangs cannot stall the run (its sockets time out by themselves).
"""

from __future__ import annotations

import fnmatch
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from .cases import DEFAULT_TIMEOUT, Case, Failed, Level, Skipped, Suite
from .net import Deadline

PASS, FAIL, SKIP = "pass", "fail", "skip"
EXIT_OK, EXIT_MUST_FAILED, EXIT_USAGE = 0, 1, 2
_GRACE = 2.0  # seconds the runner waits past a case's deadline before giving up on it


@dataclass(frozen=True)
class Result:
    """The verdict on one case: ``status`` pass/fail/skip; on a failure what was expected,
    what came instead and the bytes received; on a skip the reason (``got``)."""

    case: Case
    status: str
    expected: str = ""
    got: str = ""
    received: bytes = b""
    elapsed: float = 0.0

    @property
    def must_failed(self) -> bool:
        return self.status == FAIL and self.case.level is Level.MUST


def select(
    cases: Iterable[Case], patterns: Sequence[str] | None, always: Sequence[str] = ()
) -> list[Case]:
    """The cases whose id matches one of ``patterns`` (all when there are none), with the
    ``always`` ones in front when any matched.

    A pattern with ``*``, ``?`` or ``[`` is a glob on the id; otherwise it matches that id
    and the ids below it (``error`` selects ``error.shape``)."""
    cases = list(cases)
    if not patterns:
        return cases
    chosen = []
    for case in cases:
        for pattern in patterns:
            if any(ch in pattern for ch in "*?["):
                hit = fnmatch.fnmatchcase(case.id, pattern)
            else:
                hit = case.id == pattern or case.id.startswith(pattern + ".")
            if hit:
                chosen.append(case)
                break
    if chosen:
        chosen = [c for c in cases if c.id in always or c in chosen]
    return chosen


def run_case(case: Case, target: Any, timeout: float = DEFAULT_TIMEOUT) -> Result:
    """Run one case against ``target``; never raises for what the target does.  A target
    with state across cases may have ``begin_case()``, called first, and
    ``timeout_for(case, seconds)``, the time the case may take."""
    seconds = case.timeout if case.timeout is not None else timeout
    timeout_for = getattr(target, "timeout_for", None)
    if timeout_for is not None:
        seconds = timeout_for(case, seconds)
    deadline = Deadline(seconds)
    outcome: list[Result] = []
    start = time.monotonic()

    def attempt() -> None:
        try:
            begin = getattr(target, "begin_case", None)
            if begin is not None:
                begin()
            case.body(target, deadline)
        except Failed as exc:
            outcome.append(Result(case, FAIL, exc.expected, exc.got, exc.received))
        except Skipped as exc:
            outcome.append(Result(case, SKIP, got=str(exc)))
        except Exception as exc:  # a bug in the case itself: reported, the run goes on
            last = traceback.extract_tb(exc.__traceback__)[-1]
            where = f"{last.filename.rsplit('/', 1)[-1]}:{last.lineno}"
            outcome.append(
                Result(case, FAIL, case.expect, f"the case itself failed: {exc!r} at {where}")
            )
        else:
            outcome.append(Result(case, PASS))

    worker = threading.Thread(target=attempt, name=f"conform-{case.id}", daemon=True)
    worker.start()
    worker.join(seconds + _GRACE)
    elapsed = time.monotonic() - start
    if not outcome:
        return Result(case, FAIL, case.expect, f"no verdict within {seconds:g} s", b"", elapsed)
    result = outcome[0]
    return Result(result.case, result.status, result.expected, result.got, result.received, elapsed)


def run_suite(
    suite: Suite,
    target: Any,
    cases: Sequence[Case] | None = None,
    *,
    timeout: float = DEFAULT_TIMEOUT,
    progress: Callable[[Result], None] | None = None,
) -> list[Result]:
    """Run ``cases`` (default: all of ``suite``) in order; ``progress`` sees each result."""
    results = []
    for case in suite.cases if cases is None else cases:
        result = run_case(case, target, timeout)
        results.append(result)
        if progress is not None:
            progress(result)
    return results


def exit_status(results: Iterable[Result]) -> int:
    """0 when every MUST case passed (or was skipped), 1 when one failed."""
    return EXIT_MUST_FAILED if any(r.must_failed for r in results) else EXIT_OK
