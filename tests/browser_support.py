"""A real headless Chromium for the tests of ``wirekit serve``'s live page, driven over the
DevTools protocol (its websocket, with aiohttp's client): nothing is downloaded, no driver
binary is needed.

Chromium starts with ``--remote-debugging-port=0`` in a fresh profile directory and writes
the port it took to ``DevToolsActivePort`` there; :class:`Browser` connects to it, opens one
tab (a flat session of ``Target.attachToTarget``) and collects what the page reports: console
calls (``Runtime.consoleAPICalled``), uncaught exceptions (``Runtime.exceptionThrown``) and
the browser's own log entries (``Log.entryAdded``: failed loads, Content-Security-Policy
violations).  Every wait is bounded; on exit the browser is closed and its whole process
group killed, and the profile removed.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

#: seconds for Chromium to start and for one DevTools call
TIMEOUT = 30.0
IN_CI = os.environ.get("CI", "").lower() == "true"

#: flags for a quiet, offline, sandbox-less headless Chromium (containers run as root)
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--hide-scrollbars",
    "--mute-audio",
    "--remote-debugging-address=127.0.0.1",
    "--remote-debugging-port=0",
]


def chromium_path() -> str | None:
    """The Chromium binary (Debian's ``chromium``), or None."""
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path
    return None


def require_chromium() -> str:
    """The Chromium binary; else the test skips -- or fails under CI, where
    ``scripts/test.sh`` installs it."""
    import pytest

    path = chromium_path()
    if path is None:
        if IN_CI:
            pytest.fail("chromium is needed under CI: scripts/test.sh installs it")
        pytest.skip("chromium is not installed (apt-get install chromium)")
    return path


class DevToolsError(RuntimeError):
    """A DevTools call answered with an error, or the page threw."""


class Browser:
    """One headless Chromium and one tab of it (``async with Browser() as tab``)."""

    def __init__(self, binary: str, *, width: int = 1280, height: int = 900) -> None:
        self.binary = binary
        self.width = width
        self.height = height
        self.proc: subprocess.Popen | None = None
        self.profile = ""
        self._http: aiohttp.ClientSession | None = None
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        self._reader: asyncio.Task | None = None
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future] = {}
        self._session = ""
        #: every event the tab reported: (method, params)
        self.events: list[tuple[str, dict[str, Any]]] = []

    async def __aenter__(self) -> Browser:
        self.profile = tempfile.mkdtemp(prefix="wirekit-chromium-")
        log = open(Path(self.profile, "chromium.log"), "wb")  # noqa: SIM115 - closed below
        try:
            self.proc = subprocess.Popen(
                [self.binary, *FLAGS, f"--user-data-dir={self.profile}",
                 f"--window-size={self.width},{self.height}", "about:blank"],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                start_new_session=True,  # its helpers in one group: killed together
            )  # fmt: skip
        finally:
            log.close()
        try:
            port, path = await self._active_port()
            self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=TIMEOUT))
            self._ws = await self._http.ws_connect(
                f"ws://127.0.0.1:{port}{path}", max_msg_size=64 * 1024 * 1024
            )
            self._reader = asyncio.create_task(self._read())
            target = await self.call("Target.createTarget", {"url": "about:blank"})
            attached = await self.call(
                "Target.attachToTarget", {"targetId": target["targetId"], "flatten": True}
            )
            self._session = attached["sessionId"]
            for domain in ("Runtime", "Log", "Page"):
                await self.call(f"{domain}.enable")
            await self.call(
                "Emulation.setDeviceMetricsOverride",
                {"width": self.width, "height": self.height, "deviceScaleFactor": 1,
                 "mobile": False},
            )  # fmt: skip
        except BaseException:
            await self.close()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _active_port(self) -> tuple[int, str]:
        """The DevTools port and browser path Chromium wrote into the profile."""
        file = Path(self.profile, "DevToolsActivePort")
        until = time.monotonic() + TIMEOUT
        while time.monotonic() < until:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise DevToolsError(f"chromium exited with {self.proc.returncode}: {self.log}")
            with contextlib.suppress(FileNotFoundError, ValueError):
                lines = file.read_text().split()
                if len(lines) >= 2:
                    return int(lines[0]), lines[1]
            await asyncio.sleep(0.05)
        raise DevToolsError(f"chromium wrote no DevToolsActivePort in {TIMEOUT} s: {self.log}")

    @property
    def log(self) -> str:
        """The end of what Chromium printed."""
        with contextlib.suppress(OSError):
            return Path(self.profile, "chromium.log").read_text(errors="replace")[-4000:]
        return ""

    async def _read(self) -> None:
        assert self._ws is not None
        async for msg in self._ws:
            if msg.type != aiohttp.WSMsgType.TEXT:
                continue
            doc = json.loads(msg.data)
            if "id" in doc:
                future = self._pending.pop(doc["id"], None)
                if future is not None and not future.done():
                    future.set_result(doc)
            else:
                self.events.append((doc.get("method", ""), doc.get("params", {})))
        for future in self._pending.values():  # the connection ended
            if not future.done():
                future.set_exception(DevToolsError("the DevTools connection closed"))

    async def call(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        """One DevTools command (to the tab once it is attached); its result."""
        assert self._ws is not None
        ident = next(self._ids)
        message: dict[str, Any] = {"id": ident, "method": method, "params": params or {}}
        if self._session:
            message["sessionId"] = self._session
        future: asyncio.Future = asyncio.get_running_loop().create_future()
        self._pending[ident] = future
        await self._ws.send_str(json.dumps(message))
        answer = await asyncio.wait_for(future, TIMEOUT)
        if "error" in answer:
            raise DevToolsError(f"{method}: {answer['error']}")
        return answer.get("result", {})

    async def open(self, url: str) -> None:
        """Load ``url`` in the tab and wait for its load event."""
        start = len(self.events)
        await self.call("Page.navigate", {"url": url})
        until = time.monotonic() + TIMEOUT
        while not any(m == "Page.loadEventFired" for m, _ in self.events[start:]):
            if time.monotonic() > until:
                raise DevToolsError(f"{url} did not load in {TIMEOUT} s")
            await asyncio.sleep(0.05)

    async def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (awaited when a promise)."""
        result = await self.call(
            "Runtime.evaluate",
            {"expression": expression, "returnByValue": True, "awaitPromise": True},
        )
        if "exceptionDetails" in result:
            raise DevToolsError(f"{expression!r} threw: {result['exceptionDetails']}")
        return result["result"].get("value")

    async def wait_for(self, expression: str, timeout: float = TIMEOUT) -> Any:
        """The value of ``expression`` once it is truthy (DevToolsError past ``timeout``)."""
        until = time.monotonic() + timeout
        while True:
            value = await self.evaluate(expression)
            if value:
                return value
            if time.monotonic() > until:
                raise DevToolsError(f"{expression!r} still false after {timeout} s")
            await asyncio.sleep(0.1)

    def problems(self) -> list[str]:
        """What the page reported as wrong: console errors and warnings, uncaught
        exceptions, the browser's error and warning log entries (a failed load, a
        Content-Security-Policy violation)."""
        out = []
        for method, params in self.events:
            if method == "Runtime.exceptionThrown":
                out.append(f"exception: {params.get('exceptionDetails')}")
            elif method == "Runtime.consoleAPICalled" and params.get("type") in (
                "error",
                "warning",
                "assert",
            ):
                args = [a.get("value", a.get("description")) for a in params.get("args", [])]
                out.append(f"console.{params['type']}: {args}")
            elif method == "Log.entryAdded":
                entry = params.get("entry", {})
                if entry.get("level") in ("error", "warning"):
                    out.append(f"log {entry.get('level')}: {entry.get('text')} {entry.get('url')}")
        return out

    async def screenshot(self, path: Path, width: int | None = None) -> None:
        """A PNG of the whole page (its full height) at ``width`` CSS pixels."""
        width = width or self.width
        metrics = await self.call("Page.getLayoutMetrics")
        height = int(metrics["cssContentSize"]["height"]) + 1
        await self.call(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
        )
        shot = await self.call("Page.captureScreenshot", {"format": "png"})
        path.write_bytes(base64.b64decode(shot["data"]))

    async def close(self) -> None:
        """Close the browser (politely, then its process group by force) and clean up."""
        if self._ws is not None and not self._ws.closed:
            self._session = ""
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.call("Browser.close"), 5)
            await self._ws.close()
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._reader
        if self._http is not None:
            await self._http.close()
        if self.proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):  # Browser.close was sent
                self.proc.wait(5)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)  # its helpers too (its own group)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(TIMEOUT)
        if self.profile:
            shutil.rmtree(self.profile, ignore_errors=True)
