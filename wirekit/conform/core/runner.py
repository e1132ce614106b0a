"""Run a suite's cases against a target: selection, time bounds, verdicts, exit status.

Every case runs under a :class:`~wirekit.conform.core.net.Deadline` that bounds each of its
waits; the runner runs it on a worker thread as well and gives up on it shortly after its
deadline, so one case that hangs cannot stall the run (its sockets time out by themselves).

A target that stops serving is a result, not a reason to skip: the cases that may end it
(``may_end_target``) run last; after each of them, and after any case that did not pass,
the runner asks the target whether it still serves (its ``is_serving(deadline)``; a target
process conform runs must also still be running).  When it does not, the runner restarts
it (``--target-cmd``, ``--restart-cmd``: :mod:`~wirekit.conform.core.target`) or, without
a way to, reports every MUST case left as failed: "the target stopped serving after case X".

A slow target is not a wrong one: on a target whose cases can run again
(``repeatable_cases``), a case that failed for lack of an answer in time runs once more,
once the target serves again, with :data:`RETRY_SCALE` times its budget plus the time the
target took to serve again (measured).
"""

from __future__ import annotations

import fnmatch
import math
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from .cases import DEFAULT_TIMEOUT, Case, Failed, Level, NothingConnected, Skipped, Suite, TimedOut
from .net import Deadline
from .target import TargetLifecycle

PASS, FAIL, SKIP = "pass", "fail", "skip"
EXIT_OK, EXIT_MUST_FAILED, EXIT_USAGE = 0, 1, 2
_GRACE = 2.0  # seconds the runner waits past a case's deadline before giving up on it
_REACH_SECONDS = 5.0  # at most, for a server target to take the first connection
#: a case that timed out on a repeatable target runs again with this many times its budget
RETRY_SCALE = 3.0
#: the least time the runner gives a target to show it still serves (a busy machine)
SERVING_PATIENCE = 10.0


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
    #: the case ended for lack of an answer in time (the target may only be slow)
    timed_out: bool = False

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


def run_case(
    case: Case, target: Any, timeout: float = DEFAULT_TIMEOUT, *, scale: float = 1.0,
    extra: float = 0.0,
) -> Result:  # fmt: skip
    """Run one case against ``target``; never raises for what the target does.  A target
    with state across cases may have ``begin_case()``, called first, and
    ``timeout_for(case, seconds)``, the time the case may take.  ``scale`` and ``extra``
    stretch that time (a second try)."""
    seconds = case.timeout if case.timeout is not None else timeout
    timeout_for = getattr(target, "timeout_for", None)
    if timeout_for is not None:
        seconds = timeout_for(case, seconds)
    seconds = seconds * scale + extra
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
            late = isinstance(exc, TimedOut)
            outcome.append(Result(case, FAIL, exc.expected, exc.got, exc.received, 0.0, late))
        except Skipped as exc:
            outcome.append(Result(case, SKIP, got=str(exc)))
        except NothingConnected as exc:  # the run is over: reported by the command
            outcome.append(Result(case, SKIP, got=str(exc)))
            absent.append(exc)
        except Exception as exc:  # a bug in the case itself: reported, the run goes on
            last = traceback.extract_tb(exc.__traceback__)[-1]
            where = f"{last.filename.rsplit('/', 1)[-1]}:{last.lineno}"
            outcome.append(
                Result(case, FAIL, case.expect, f"the case itself failed: {exc!r} at {where}")
            )
        else:
            outcome.append(Result(case, PASS))

    absent: list[NothingConnected] = []
    worker = threading.Thread(target=attempt, name=f"conform-{case.id}", daemon=True)
    worker.start()
    worker.join(seconds + _GRACE)
    elapsed = time.monotonic() - start
    if absent:
        raise absent[0]
    if not outcome:
        got = f"no verdict within {seconds:g} s"
        return Result(case, FAIL, case.expect, got, b"", elapsed, timed_out=True)
    r = outcome[0]
    return Result(r.case, r.status, r.expected, r.got, r.received, elapsed, r.timed_out)


def not_run(case: Case, reason: str) -> Result:
    """The verdict on a case that could not run because the target stopped serving: a
    failure for a MUST case (what it requires was not shown), a skip for the others."""
    if case.level is Level.MUST:
        return Result(case, FAIL, case.expect, reason)
    return Result(case, SKIP, got=reason)


def in_run_order(cases: Iterable[Case]) -> list[Case]:
    """``cases`` with those that may end the target moved last (each group in order)."""
    cases = list(cases)
    return [c for c in cases if not c.may_end_target] + [c for c in cases if c.may_end_target]


def serves(target: Any, lifecycle: TargetLifecycle | None, seconds: float) -> float | None:
    """Wait up to ``seconds`` for the target to serve: the time it took, or None.  A
    target without ``is_serving`` counts as serving while its process (if conform runs it)
    runs."""
    end = time.monotonic() + seconds
    start = time.monotonic()
    is_serving = getattr(target, "is_serving", None)
    while True:
        if lifecycle is not None and not lifecycle.running():
            return None
        left = end - time.monotonic()
        if is_serving is None or is_serving(Deadline(max(0.5, min(left, seconds)))):
            return time.monotonic() - start
        if time.monotonic() >= end:
            return None
        time.sleep(0.1)


def come_back(target: Any, lifecycle: TargetLifecycle) -> bool:
    """After a restart: the target serves again within the lifecycle's start timeout (a
    target that waits for its peer to come, ``restarted(deadline)``, is asked that)."""
    restarted = getattr(target, "restarted", None)
    if restarted is not None:
        return bool(restarted(Deadline(lifecycle.start_timeout)))
    return serves(target, lifecycle, lifecycle.start_timeout) is not None


def stopped_serving(target: Any, lifecycle: TargetLifecycle | None, timeout: float) -> str | None:
    """None when the target still serves (or serves again after a restart); otherwise
    why the run cannot go on with it (after "the target stopped serving")."""
    patience = max(timeout, SERVING_PATIENCE)
    if (lifecycle is None or lifecycle.running()) and serves(target, None, patience) is not None:
        return None
    if lifecycle is None:
        return ""
    ended = lifecycle.describe_exit()
    problem = lifecycle.restart()
    if problem is not None:
        return f"{ended}; the restart failed: {problem}"
    if not come_back(target, lifecycle):
        again = lifecycle.describe_exit()
        return f"{ended}; restarted, it did not serve within {lifecycle.start_timeout:g} s{again}"
    return None


def run_suite(
    suite: Suite,
    target: Any,
    cases: Sequence[Case] | None = None,
    *,
    timeout: float = DEFAULT_TIMEOUT,
    progress: Callable[[Result], None] | None = None,
    lifecycle: TargetLifecycle | None = None,
) -> list[Result]:
    """Run ``cases`` (default: all of ``suite``), those that may end the target last;
    ``progress`` sees each result.  ``lifecycle`` restarts a target that stopped serving
    (see the module's docstring).  Raises :class:`NothingConnected` when there was nothing
    to test: no peer came, or a target conform started never served."""
    starting = lifecycle is not None and lifecycle.owns_process
    # (a target whose peer comes to it, with ``restarted()``, waits in its first case)
    if starting and hasattr(target, "is_serving") and not hasattr(target, "restarted"):
        assert lifecycle is not None
        if serves(target, lifecycle, lifecycle.start_timeout) is None:
            ended = lifecycle.describe_exit()  # " (it exited 1: ...)", or "" if it runs
            seconds = lifecycle.start_timeout
            raise NothingConnected(
                f"the target (--target-cmd) ended before it served{ended}"
                if ended
                else f"the target (--target-cmd) did not serve within {seconds:g} s of its start"
            )
    unreachable = getattr(target, "unreachable", None)
    if unreachable is not None and not starting:  # (a target conform starts: waited for above)
        why = unreachable(min(timeout, _REACH_SECONDS))
        if why is not None:
            raise NothingConnected(
                f"nothing takes a connection at {target} ({why}): no case was run"
            )
    results: list[Result] = []
    stopped: str | None = None  # why the cases left cannot run
    last = ""
    for case in in_run_order(suite.cases if cases is None else cases):
        if stopped is not None:
            result = not_run(case, stopped)
        else:
            result = run_case(case, target, timeout)
            if result.timed_out and getattr(target, "repeatable_cases", False):
                result = _second_try(case, target, timeout, result, lifecycle)
            if result.status != PASS or case.may_end_target:
                problem = stopped_serving(target, lifecycle, timeout)
                if problem is not None:
                    if result.status == SKIP and case.level is Level.MUST and last:
                        # it did not run because the target had stopped: a failure
                        result = not_run(case, f"the target stopped serving after case {last}")
                    stopped = f"the target stopped serving after case {case.id}{problem}"
            last = case.id
        results.append(result)
        if progress is not None:
            progress(result)
    return results


def _second_try(
    case: Case, target: Any, timeout: float, first: Result, lifecycle: TargetLifecycle | None
) -> Result:
    """Run a case that timed out once more, once the target serves again, with
    :data:`RETRY_SCALE` times its budget plus the time the target took to serve again."""
    busy = serves(target, lifecycle, max(timeout, SERVING_PATIENCE) * RETRY_SCALE)
    if busy is None:
        return first
    busy = math.ceil(busy * 10) / 10  # to the tenth of a second above: a budget that reads well
    again = run_case(case, target, timeout, scale=RETRY_SCALE, extra=busy)
    if again.status == FAIL and again.timed_out:
        got = f"{again.got} (on a second try too; first: {first.got})"
        return Result(case, FAIL, again.expected, got, again.received, again.elapsed, True)
    return again


def exit_status(results: Iterable[Result]) -> int:
    """0 when every MUST case passed (or was skipped), 1 when one failed."""
    return EXIT_MUST_FAILED if any(r.must_failed for r in results) else EXIT_OK
