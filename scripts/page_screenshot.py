"""Take the README's screenshot of ``wirekit serve``'s live page (docs/serve-page.png).

Runs the sample deployment as the README does (``samples/serve-deployment.json`` with
``--with-backends``), with a ``controller`` table added (a log actuator, p95 targets of
2 ms for m1 and 50 ms for m2), in a temporary directory (its ports moved by
``--port-offset`` so it can run beside another copy), opens ``/`` in a headless Chromium
(``tests/browser_support.py``) and puts load on it for about two and a half minutes:

1. light load on m1 and m2;
2. heavy load on m1: over its target, the controller gives it CPU share on n1/0, taken from
   m2; meanwhile a model m3 is added through the admin API (on a node n3, with its own
   ``wirekit mip serve``), called, and removed;
3. light load again: the shares drift back.

Then it saves a PNG of the whole page -- reduced to a palette with ``pngquant`` (Debian's
package) when it is installed, which keeps it near 100 KB.  Everything it starts stops with
it.

    python scripts/page_screenshot.py [--out docs/serve-page.png] [--port-offset 10000]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from browser_support import Browser, chromium_path  # noqa: E402

SERIAL = itertools.count()

CONTROLLER = {
    "period": 2,
    "window": 10,
    "cooldown": 4,
    "stabilization": 6,
    "max_step": 0.1,
    "min_share": 0.1,
    "targets": {"m1": 0.002, "m2": 0.05},
    "actuator": {"kind": "log"},
}


def deployment(directory: Path, offset: int) -> tuple[Path, int]:
    """The sample deployment in ``directory`` with the controller and ports moved; its path
    and HTTP port."""
    doc = json.loads((ROOT / "samples" / "serve-deployment.json").read_text())
    shutil.copy(ROOT / "samples" / "tiny_model.py", directory)
    doc["listen"]["http_port"] += offset
    doc["store"]["path"] = str(directory / "requests.db")
    for model in doc["models"].values():
        model["port"] += offset
    for node in doc["nodes"]:
        node["ports"] = [p + offset if p is not None else None for p in node["ports"]]
    doc["controller"] = CONTROLLER
    path = directory / "deployment.json"
    path.write_text(json.dumps(doc, indent=1))
    return path, doc["listen"]["http_port"]


async def load(http, base: str, model: str, until: float, pause: float, stop) -> int:
    """Predictions of ``model`` until ``until`` (monotonic), ``pause`` s apart; how many."""
    texts = ["a fine day", "so bad", "what a great day", "not nice at all", "I love it"]
    n = 0
    while time.monotonic() < until and not stop.is_set():
        # a text never asked before: answered by a backend, not from the cache
        body = {"inputs": [[f"{texts[n % len(texts)]} {next(SERIAL)}"]]}
        async with http.post(f"{base}/v1/models/{model}:predict", json=body) as resp:
            await resp.read()
        n += 1
        if pause:
            await asyncio.sleep(pause)
    return n


async def run(args, directory: Path) -> None:
    config, port = deployment(directory, args.port_offset)
    base = f"http://127.0.0.1:{port}"
    serve = subprocess.Popen(
        [sys.executable, "-m", "wirekit.cli", "serve", "--config", str(config), "--with-backends"],
        stdout=subprocess.PIPE, stderr=open(directory / "serve.log", "wb"), text=True,  # noqa: SIM115
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )  # fmt: skip
    m3_port = 9301 + args.port_offset
    m3 = subprocess.Popen(
        [sys.executable, "-m", "wirekit.cli", "mip", "serve", "--handler", "tiny_model:words",
         "--listen", f"tcp://127.0.0.1:{m3_port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=directory,
        env=dict(os.environ, PYTHONPATH=os.pathsep.join([str(directory), str(ROOT)]),
                 WIREKIT_ROW="n3/0/m3"),
    )  # fmt: skip
    try:
        assert serve.stdout is not None
        ready = json.loads(await asyncio.to_thread(serve.stdout.readline))
        token = Path(ready["admin_token_file"]).read_text().strip()
        admin = {"Authorization": f"Bearer {token}"}
        stop = asyncio.Event()
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http,
            Browser(args.chromium, width=args.width, height=900) as tab,
        ):
            await tab.open(f"{base}/?poll=1&minutes=3")
            t0 = time.monotonic()
            light = [
                asyncio.create_task(load(http, base, "m1", t0 + 150, 0.05, stop)),
                asyncio.create_task(load(http, base, "m2", t0 + 150, 0.08, stop)),
            ]
            await asyncio.sleep(35)
            heavy = [
                asyncio.create_task(load(http, base, "m1", t0 + 95, 0, stop)) for _ in range(4)
            ]
            await asyncio.sleep(10)
            added = {
                "models": {"m3": {"port": None, "timeout": 2.0, "target": 0.02}},
                "nodes": [{"id": "n3", "endpoint": "127.0.0.1", "devices": ["CPU"],
                           "models": ["m3"], "quotas": [1], "ports": [m3_port]}],
            }  # fmt: skip
            async with http.post(f"{base}/admin/models", json=added, headers=admin) as resp:
                print("add m3:", resp.status, file=sys.stderr)
            await load(http, base, "m3", time.monotonic() + 25, 0.1, stop)
            async with http.delete(f"{base}/admin/models/m3", headers=admin) as resp:
                print("remove m3:", resp.status, file=sys.stderr)
            await asyncio.gather(*heavy)
            await asyncio.gather(*light)
            await asyncio.sleep(3)
            problems = tab.problems()
            if problems:
                print("the page reported:", *problems, sep="\n  ", file=sys.stderr)
            await tab.screenshot(Path(args.out), width=args.width)
            if shutil.which("pngquant"):
                subprocess.run(
                    ["pngquant", "--quality=70-95", "--speed=1", "--force", "--strip",
                     "--output", args.out, args.out],
                    check=True, timeout=120,
                )  # fmt: skip
            print(f"{args.out}: {Path(args.out).stat().st_size} bytes", file=sys.stderr)
    finally:
        for proc in (serve, m3):
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        if serve.stdout is not None:
            serve.stdout.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(ROOT / "docs" / "serve-page.png"))
    parser.add_argument("--port-offset", type=int, default=0)
    parser.add_argument("--width", type=int, default=1200)
    parser.add_argument("--chromium", default=chromium_path())
    args = parser.parse_args()
    if not args.chromium:
        parser.error("no chromium found (apt-get install chromium)")
    with (
        tempfile.TemporaryDirectory(prefix="wirekit-page-") as tmp,
        contextlib.suppress(KeyboardInterrupt),
    ):
        asyncio.run(run(args, Path(tmp)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
