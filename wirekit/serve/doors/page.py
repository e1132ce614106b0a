"""The live page of ``wirekit serve``: ``GET /`` and the few static files it loads.

A read-only view for an operator, served by the dispatcher itself (no other service, no
build step): per model its request rate, response times by device, end states and queue;
the quota of every (node, device, model) row over the last minutes, with the controller's
decisions and their reasons on that timeline; the models added and removed.  The page is
plain HTML, CSS and JavaScript (``wirekit/serve/doors/static/``, shipped as package data, no
third-party code); its charts are SVG drawn by that script.  It polls ``GET /stats`` and
``GET /controller`` -- both read-only, neither needs the admin token -- and keeps what it has
seen in the browser, so the page adds no state and no state-changing route to the server.

Every file goes out with a strict Content-Security-Policy (scripts, styles, images and
fetches from this origin only; no inline script or style, no frames, no forms),
``X-Content-Type-Options: nosniff``, no ``Access-Control-*`` header (no CORS) and
``Cache-Control: no-cache``.  The files are a fixed list read once from the package: a
path names one of them or is answered 404, so no request reaches the file system.
"""

from __future__ import annotations

import functools
from importlib import resources

from aiohttp import web

#: the Content-Security-Policy of the page and its files: everything from this origin only,
#: nothing inline (the script builds the page with DOM calls, never HTML strings)
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'"
)

#: the headers of every answer of this module
SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}

#: the files under ``/static/`` -> their content type; ``index.html`` is served at ``/``
STATIC_FILES = {
    "page.js": "text/javascript; charset=utf-8",
    "page.css": "text/css; charset=utf-8",
    "favicon.svg": "image/svg+xml",
}
INDEX = "index.html"


@functools.cache
def static_file(name: str) -> bytes:
    """The bytes of the page's file ``name`` (one of :data:`STATIC_FILES` or
    :data:`INDEX`), read once from the package's ``static`` folder."""
    return resources.files(__package__).joinpath("static", name).read_bytes()


def _answer(name: str, content_type: str) -> web.Response:
    resp = web.Response(body=static_file(name), headers=SECURITY_HEADERS)
    resp.headers["Content-Type"] = content_type
    return resp


async def index(_request: web.Request) -> web.Response:
    """``GET /``: the page."""
    return _answer(INDEX, "text/html; charset=utf-8")


async def asset(request: web.Request) -> web.Response:
    """``GET /static/{name}``: one of :data:`STATIC_FILES`, else 404."""
    name = request.match_info["name"]
    content_type = STATIC_FILES.get(name)
    if content_type is None:
        return web.Response(
            status=404, text="no such file", content_type="text/plain", headers=SECURITY_HEADERS
        )
    return _answer(name, content_type)


def add_page_routes(app: web.Application) -> None:
    """Serve the live page from ``app``: ``GET /`` and ``GET /static/{name}`` (with HEAD)."""
    app.router.add_get("/", index)
    app.router.add_get("/static/{name}", asset)
