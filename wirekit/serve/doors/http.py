"""The HTTP/JSON front door (aiohttp): predictions, ``/metrics`` and ``/stats``.

* TF Serving's REST API (``/v1/models/...``: ``:predict``, model status and metadata; see
  :mod:`wirekit.serve.doors.tfserving` and ``specs/tfserving.md``).
* ``POST /{app}/predict`` is Clipper's query frontend: ``{"input": v}`` answers
  ``{"query_id": n, "output": v, "default": false}``; ``{"input_batch": [v, ...]}`` answers
  ``{"batch_predictions": [...]}``.  When no device answers, the answer is Clipper's default
  form: ``"default": true`` with a ``default_explanation``.
* ``GET /metrics`` (Prometheus text), ``GET /stats`` (JSON), ``GET /healthz`` (200 while
  the process and its loop answer) and ``GET /readyz`` (200 when it can serve, 503 with the
  reasons in the JSON body when not; ``/readyz?model=m`` for one model); none needs a
  token.
* The admin API (models added and removed while the dispatcher runs; see ``specs/serve.md``):
  ``GET /admin/models``, ``POST /admin/models``, ``DELETE /admin/models/{name}``,
  ``PATCH /admin/models/{name}`` (its settings), ``PUT /admin/models/{name}/quota``.  Each
  needs ``Authorization: Bearer <token>`` (compared in constant time; 401 without it), a
  ``Host`` naming this server and no foreign ``Origin`` (403), and a JSON body where it
  changes state (415): see :mod:`wirekit.serve.doors.adminauth`.  A request for a removed model
  is answered 410.
* ``GET /controller`` (JSON): the current quotas, the models' targets and the controller's last
  decisions (``specs/controller.md``).
* ``GET /``: the live page, read-only (:mod:`wirekit.serve.doors.page`).
* ``/v2/...``: the Open Inference Protocol over REST, JSON and binary tensor data
  (:mod:`wirekit.serve.doors.oiprest`).
"""

from __future__ import annotations

import inspect
import itertools
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from aiohttp import web

from wirekit.mip import DEFAULT_MAX_ITEMS, Inference
from wirekit.mip.decoder import DEFAULT_MAX_MESSAGE_SIZE
from wirekit.mip.limits import BufferBudget

from ..backends.oipcontrol import ModelLoadError
from ..config import ConfigError, HttpLimits
from ..control.catalog import CatalogError
from ..control.metrics import DOOR_CLIPPER
from ..dispatch.dispatcher import REFUSED, Dispatcher, Outcome, UnknownModel
from ..dispatch.payload import Payload, dumps, loads, outputs_json, request_from_json
from ..record.decisions import operator
from .adminauth import AdminAccess
from .httpbody import READER_KEY, BodyReader
from .lean import LEAN_KEY, LeanHandlers
from .oiprest import OipRestHandlers
from .page import add_page_routes

#: the route pattern of a name in a path (a model, an app): one whole, percent-decoded path
#: segment -- any name :func:`~wirekit.serve.config.check_name` takes (braces included,
#: which aiohttp's default pattern refuses) can be called and removed
NAME = "[^/]+"


#: the ``Content-Type`` of a JSON answer: exactly ``application/json`` (JSON has no charset
#: parameter; the ``kserve`` client reads an error's message only under that type)
JSON_TYPE = "application/json"


def _json(doc: Any, status: int = 200) -> web.Response:
    """A JSON answer (:data:`JSON_TYPE`)."""
    return web.Response(body=dumps(doc).encode(), status=status, content_type=JSON_TYPE)


def _error(status: int, message: str, **extra: Any) -> web.Response:
    return _json({"error": message, **extra}, status)


def _bad_request(message: str) -> web.HTTPBadRequest:
    """The 400 ``{"error": message}`` that a body refused by :func:`_body` raises."""
    refusal = web.HTTPBadRequest(text=dumps({"error": message}))
    refusal.headers["Content-Type"] = JSON_TYPE  # the text's charset parameter dropped
    return refusal


async def _body(request: web.Request) -> dict[str, Any]:
    """The request's JSON object, read and parsed within the HTTP door's limits and the
    memory budget (:mod:`wirekit.serve.doors.httpbody`: 413/503/408/415 when they refuse it)."""
    reader: BodyReader | None = request.get(READER_KEY)
    if reader is None:  # an application served without the door: its default limits
        reader = BodyReader(HttpLimits(), BufferBudget(4 * HttpLimits().max_body_size))
    return json_object(reader, await reader.read(request))


def json_object(reader: BodyReader, raw: bytes | bytearray) -> dict[str, Any]:
    """The JSON object of a body read (``raw``), its parsed form charged to the budget
    first (:meth:`BodyReader.hold_json`); the 400 :func:`_bad_request` raises when it is
    not one.  The aiohttp routes (:func:`_body`) and the HTTP door's lean path
    (:mod:`wirekit.serve.doors.lean`) both read a body through it."""
    reader.hold_json(raw)
    try:
        doc = loads(raw)  # strict JSON: NaN and Infinity are refused (payload.loads)
    except (UnicodeDecodeError, ValueError) as exc:
        raise _bad_request(f"body is not JSON: {exc}") from None
    except RecursionError:
        raise _bad_request("body is not JSON this server reads: nested too deeply") from None
    if not isinstance(doc, dict):
        raise _bad_request("body must be a JSON object")
    return doc


def _too_many_items(count: int, max_items: int) -> web.Response | None:
    """The answer to a body of more MIP items than the front doors accept, or None.

    Checked on the parsed JSON before any item is built, with the MIP front door's limit
    (``mip.max_items``), so an HTTP body costs no more per item than a MIP message does; an
    empty sample counts as one item (it costs a row all the same).  The parsed JSON itself
    was bounded before parsing (:func:`wirekit.serve.doors.httpbody.json_cost`).
    """
    if count <= max_items:
        return None
    return _error(413, f"{count} items exceed the limit of {max_items} per request (mip.max_items)")


def _client(request: web.Request) -> str:
    return f"http:{request.remote or '?'}"


def _unknown(dispatcher: Dispatcher, name: str, what: str = "model") -> web.Response:
    """404 for a name never served, 410 for a model removed while the dispatcher runs."""
    model = dispatcher.removed.get(name)
    if model is not None:
        return _error(410, f"model {model!r} was removed", removed=model)
    return _error(404, f"unknown {what} {name!r}")


class Admin(Protocol):
    """What the admin API calls (:class:`wirekit.serve.admin.ModelAdmin`)."""

    def models_doc(self) -> dict[str, Any]: ...

    # ``by``: who asked (:func:`wirekit.serve.record.decisions.operator`): each change is
    # recorded as an operator's decision

    def add_model_doc(self, doc: Any, *, by: str) -> Awaitable[dict[str, Any]]: ...

    def remove_model(self, name: str, *, by: str) -> Awaitable[dict[str, Any]]: ...

    def set_quota_doc(self, name: str, doc: Any, *, by: str) -> Awaitable[dict[str, Any]]: ...

    def set_model_doc(self, name: str, doc: Any, *, by: str) -> Awaitable[dict[str, Any]]: ...


def _clipper_values(doc: dict[str, Any]) -> tuple[list[Any], bool] | web.Response:
    """The queries of a Clipper body and whether it is a batch, or the 400 that refuses it."""
    if "input" in doc:
        return [doc["input"]], False
    batch = doc.get("input_batch")
    if "input_batch" in doc and isinstance(batch, list) and batch:
        return batch, True
    return _error(400, 'the body needs "input" or a non-empty "input_batch"')


def _payload(samples: list[Any], multi: bool) -> Payload | web.Response:
    """The request of ``samples``, encoded now (an input that cannot be encoded is the
    client's fault: 400)."""
    try:
        payload = Payload(None, request_from_json(samples, multi=multi))
        payload.wire  # noqa: B018 - encode now: an EncodeError is the client's fault
    except ValueError as exc:
        return _error(400, str(exc))
    except RecursionError:
        return _error(400, "an input is nested too deeply to encode as JSON")
    return payload


def _clipper_answer(outcome: Outcome, query_id: int) -> dict[str, Any]:
    """One Clipper query's answer: its output, or Clipper's default form when no device
    answered it."""
    msg = outcome.response.message
    if outcome.ok and isinstance(msg, Inference) and msg.batch_size == 1:
        outs = outputs_json(msg)[0]
        return {
            "query_id": query_id,
            "output": outs[0] if len(outs) == 1 else outs,
            "default": False,
        }
    return {
        "query_id": query_id,
        "output": None,
        "default": True,
        "default_explanation": outcome.detail or f"backend answered {msg}",
    }


class Handlers:
    """The handlers of the HTTP door's routes but the admin API's, over what they read:
    ``dispatcher`` (the models served, where requests go), ``app_models`` (Clipper's
    applications, read at each request), ``max_items`` (MIP items per body), and the
    documents of ``/stats``, ``/metrics``, ``/controller``, ``/healthz`` and ``/readyz``
    (see :func:`build_app`)."""

    def __init__(
        self,
        dispatcher: Dispatcher,
        app_models: dict[str, str],
        stats: Callable[[], dict[str, Any] | Awaitable[dict[str, Any]]],
        metrics_text: Callable[[], bytes | Awaitable[bytes]],
        max_items: int = DEFAULT_MAX_ITEMS,
        controller: Callable[[], dict[str, Any]] | None = None,
        health: Callable[[], dict[str, Any]] | None = None,
        readiness: Callable[[str | None], dict[str, Any]] | None = None,
    ) -> None:
        self.dispatcher = dispatcher
        self.app_models = app_models
        self.stats = stats
        self.metrics_text = metrics_text
        self.max_items = max_items
        self.controller = controller
        self.health = health
        self.readiness = readiness
        self.query_ids = itertools.count()  #: Clipper's query ids, one per query answered

    async def clipper_predict(self, request: web.Request) -> web.Response:
        """``POST /{app}/predict``: Clipper's query frontend, each query of a batch answered
        on its own."""
        dispatcher = self.dispatcher
        app = request.match_info["app"]
        model = self.app_models.get(app)
        if model is None:
            return _unknown(dispatcher, app, "application")
        found = _clipper_values(await _body(request))
        if isinstance(found, web.Response):
            return found
        values, batch = found
        refusal = _too_many_items(len(values), self.max_items)
        if refusal is not None:
            return refusal
        answers = []
        for value in values:
            payload = _payload([value], False)
            if isinstance(payload, web.Response):
                return payload
            try:
                outcome = await dispatcher.submit(
                    model, payload, _client(request), door=DOOR_CLIPPER
                )
            except UnknownModel:  # removed while the body was read, or during the batch
                return _unknown(dispatcher, app, "application")
            if outcome.cause == REFUSED:  # not sent anywhere (the journal cannot be written)
                return _error(503, outcome.detail)
            answers.append(_clipper_answer(outcome, next(self.query_ids)))
        return _json({"batch_predictions": answers} if batch else answers[0])

    async def get_stats(self, _request: web.Request) -> web.Response:
        """``GET /stats``."""
        doc = self.stats()
        return _json(await doc if inspect.isawaitable(doc) else doc)

    async def get_metrics(self, _request: web.Request) -> web.Response:
        """``GET /metrics``: Prometheus' text format."""
        from prometheus_client import CONTENT_TYPE_LATEST

        text = self.metrics_text()
        resp = web.Response(body=await text if inspect.isawaitable(text) else text)
        resp.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return resp

    async def healthz(self, _request: web.Request) -> web.Response:
        """``GET /healthz``."""
        return _json(self.health() if self.health is not None else {"ok": True})

    async def readyz(self, request: web.Request) -> web.Response:
        """``GET /readyz`` (``?model=m``: that model's readiness)."""
        model = request.query.get("model")
        if self.readiness is None:
            return _json({"ready": True, "reasons": []})
        if model is not None and model not in self.dispatcher.models:
            return _unknown(self.dispatcher, model)
        doc = self.readiness(model)
        return _json(doc, 200 if doc["ready"] else 503)

    async def get_controller(self, _request: web.Request) -> web.Response:
        """``GET /controller``."""
        if self.controller is None:
            return _error(404, "no controller in this service")
        return _json(self.controller())

    def add_routes(self, app: web.Application) -> None:
        """Route the requests of ``app`` (the live page's too) to these handlers."""
        app.router.add_get("/metrics", self.get_metrics)
        app.router.add_get("/stats", self.get_stats)
        app.router.add_get("/healthz", self.healthz)
        app.router.add_get("/readyz", self.readyz)
        app.router.add_get("/controller", self.get_controller)
        app.router.add_post(f"/{{app:{NAME}}}/predict", self.clipper_predict)
        add_page_routes(app)  # GET /: the live page (read-only; wirekit.serve.doors.page)


def build_app(
    dispatcher: Dispatcher,
    app_models: dict[str, str],
    stats: Callable[[], dict[str, Any] | Awaitable[dict[str, Any]]],
    metrics_text: Callable[[], bytes | Awaitable[bytes]],
    max_items: int = DEFAULT_MAX_ITEMS,
    admin: Admin | None = None,
    admin_access: AdminAccess | None = None,
    controller: Callable[[], dict[str, Any]] | None = None,
    limits: HttpLimits | None = None,
    health: Callable[[], dict[str, Any]] | None = None,
    readiness: Callable[[str | None], dict[str, Any]] | None = None,
    max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
) -> web.Application:
    """The aiohttp application of the front door; ``max_items`` bounds the MIP items one
    body may ask for (the config's ``mip.max_items``).  ``app_models`` is read at each
    request (the caller keeps it up to date).  ``admin``: serve the admin API, to the
    requests ``admin_access`` lets through (required with ``admin``).  ``limits``: the
    ``http`` table; served by a :class:`wirekit.serve.doors.httpdoor.HttpDoor`, request bodies
    are read within it and charged to the process's memory budget.  ``health`` and
    ``readiness``: the documents of ``/healthz`` and ``/readyz`` (``readiness(model)``,
    ``model`` from ``/readyz?model=...`` or None for every model; ``["ready"]`` false: 503);
    without them ``/healthz`` answers ``{"ok": true}`` and ``/readyz`` 200.
    ``max_message_size``: the bytes of a MIP request an Open Inference Protocol body may
    become (the config's ``mip.max_message_size``; :mod:`wirekit.serve.doors.oiprest`)."""
    limits = limits or HttpLimits()
    app = web.Application(client_max_size=limits.max_body_size)
    if admin is not None:
        if admin_access is None:
            raise ValueError("the admin API needs its admin_access (a token, the host checks)")
        AdminHandlers(admin).add_routes(app, admin_access)
    handlers = Handlers(
        dispatcher, app_models, stats, metrics_text, max_items, controller, health, readiness
    )
    from .tfserving import TfServingHandlers  # it imports this module's answers

    tfs = TfServingHandlers(dispatcher, max_items, readiness)
    tfs.add_routes(app)
    handlers.add_routes(app)
    oip_rest = OipRestHandlers(
        dispatcher, readiness, max_items=max_items, max_message_size=max_message_size
    )
    oip_rest.add_routes(app)
    app[LEAN_KEY] = LeanHandlers(oip_rest, tfs)  # the HTTP door's lean path answers with them
    return app


Handler = Callable[[web.Request], Awaitable[web.Response]]


def guarded(access: AdminAccess, handler: Handler) -> Handler:
    """``handler`` behind ``access``: a request it refuses is answered its refusal (401,
    403, 415) before its body is read."""

    async def check(request: web.Request) -> web.Response:
        headers = request.headers
        refusal = access.refusal(
            method=request.method,
            host=headers.get("Host"),
            origin=headers.get("Origin"),
            authorization=headers.get("Authorization"),
            content_type=headers.get("Content-Type"),
            has_body=request.body_exists,
        )
        if refusal is not None:
            resp = _error(refusal.status, refusal.message)
            resp.headers.update(refusal.headers)
            return resp
        return await handler(request)

    return check


class AdminHandlers:
    """The handlers of the admin API (``/admin/models``: list, add, change, remove, set a
    quota; see the module docstring), over the :class:`Admin` they call."""

    def __init__(self, admin: Admin) -> None:
        self.admin = admin

    def _free_devices(self) -> list[dict[str, Any]]:
        """The devices with a share free (a 409's ``free``)."""
        return [d for d in self.admin.models_doc()["devices"] if d["free"] > 0]

    async def list_models(self, _request: web.Request) -> web.Response:
        """``GET /admin/models``."""
        return _json(self.admin.models_doc())

    async def add_model(self, request: web.Request) -> web.Response:
        """``POST /admin/models``."""
        doc = await _body(request)
        try:
            added = await self.admin.add_model_doc(doc, by=operator(request.remote))
        except ConfigError as exc:
            return _error(400, str(exc), where=exc.where)
        except ModelLoadError as exc:  # a server refused or failed the load: nothing added
            return _error(502, str(exc), devices=exc.results, rollback=exc.rollback)
        except CatalogError as exc:  # the share asked for is not free (the message says what is)
            return _error(409, str(exc), free=self._free_devices())
        return _json(added, 201)

    async def remove_model(self, request: web.Request) -> web.Response:
        """``DELETE /admin/models/{name}``."""
        name = request.match_info["name"]
        try:
            removed = await self.admin.remove_model(name, by=operator(request.remote))
        except KeyError:
            return _error(404, f"unknown model {name!r}")
        except CatalogError as exc:
            return _error(409, str(exc))
        return _json(removed)

    async def set_quota(self, request: web.Request) -> web.Response:
        """``PUT /admin/models/{name}/quota``."""
        name = request.match_info["name"]
        doc = await _body(request)
        try:
            decision = await self.admin.set_quota_doc(name, doc, by=operator(request.remote))
        except KeyError:
            return _error(404, f"unknown model {name!r}")
        except ConfigError as exc:
            return _error(400, str(exc), where=exc.where)
        if decision["status"] == "refused":  # the catalog's message says what is free
            return _error(409, decision["error"], decision=decision, free=self._free_devices())
        if decision["status"] == "failed":  # the actuator failed: the quota was put back
            return _error(502, decision["error"], decision=decision)
        return _json(decision)

    async def set_model(self, request: web.Request) -> web.Response:
        """``PATCH /admin/models/{name}``: its settings."""
        name = request.match_info["name"]
        doc = await _body(request)
        try:
            changed = await self.admin.set_model_doc(name, doc, by=operator(request.remote))
        except KeyError:
            return _error(404, f"unknown model {name!r}")
        except ConfigError as exc:  # the config's own message, and where
            return _error(400, str(exc), where=exc.where)
        except CatalogError as exc:  # being removed
            return _error(409, str(exc))
        return _json(changed)

    def add_routes(self, app: web.Application, access: AdminAccess) -> None:
        """Route ``/admin/models`` of ``app`` to these handlers, each behind ``access``."""
        router = app.router
        router.add_get("/admin/models", guarded(access, self.list_models))
        router.add_patch(f"/admin/models/{{name:{NAME}}}", guarded(access, self.set_model))
        router.add_put(f"/admin/models/{{name:{NAME}}}/quota", guarded(access, self.set_quota))
        router.add_post("/admin/models", guarded(access, self.add_model))
        router.add_delete(f"/admin/models/{{name:{NAME}}}", guarded(access, self.remove_model))


__all__ = ["NAME", "Admin", "AdminHandlers", "Handlers", "build_app", "guarded"]
