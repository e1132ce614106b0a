"""TF Serving's REST API at the HTTP door (``specs/tfserving.md``), also the KServe v1
protocol's.

* ``POST /v1/models/{m}[/versions/{v}]:predict``: ``{"instances": ...}`` (row format)
  answers ``{"predictions": ...}``, ``{"inputs": ...}`` (columnar format) answers
  ``{"outputs": ...}``; ``signature_name`` optional.  ``:classify`` and ``:regress`` are
  answered 501.
* ``GET /v1/models/{m}[/versions/{v}]``: the model's status (``model_version_status``, one
  entry per version, ``AVAILABLE`` while the model can serve), with KServe v1's ``name`` and
  ``ready``.
* ``GET /v1/models/{m}[/versions/{v}]/metadata``: its signature (``serving_default``), from
  the tensors the model declares.
* ``GET /v1/models``: the names of the models served (KServe v1).

How a body becomes MIP samples depends on what the model declares
(``models.<name>.inputs``):

* a model that declares its inputs gets OIP tensors, by the mapping of ``specs/oip.md``
  (``models.<name>.tensors``: one MIP sample, or one per row of dim 0).  The row format
  stacks its instances along a new dim 0; a single declared input may be given bare,
  several are named in an object per instance (row) or one object (columnar).  Each tensor
  is checked against the declaration (:func:`wirekit.oip.metadata.check_inputs`): a wrong
  name, datatype or shape is a 400 naming the tensor, answered at once.
* a model that declares none but is served by model servers (backend ``oip`` or
  ``tfserving``, which take OIP tensors only) gets OIP tensors too, each input's datatype
  read from its JSON values (:func:`infer_datatype`); a single input given bare is named
  ``input`` (:data:`BARE_INPUT`).
* any other model that declares none keeps wirekit's JSON-item mapping
  (:mod:`wirekit.serve.dispatch.payload`): each entry of ``instances`` is a sample of one
  item, each entry of an ``inputs`` list a sample of one item per value; the answer gives
  per sample its one value (``predictions``) or its list of values (``outputs``).

Every error is ``{"error": message}``; the request's id (the store's row) is the
``X-Request-Id`` header of every answer a request was submitted for.  In the metrics, the
requests of the JSON-item mapping count on ``door="http"`` (the HTTP door's JSON predict, as
before), those of OIP tensors on ``door="tfserving"``.
"""

from __future__ import annotations

import base64
import binascii
import struct
from collections.abc import Callable, Mapping
from typing import Any

from aiohttp import web

from wirekit.errors import DecodeError, EncodeError
from wirekit.mip import DEFAULT_MAX_ITEMS, ErrorReply, Inference
from wirekit.oip import (
    BackendError,
    InferRequest,
    Tensor,
    check_tensor,
    mip_item_count,
    request_to_mip,
    response_from_mip,
    tensor_from_json,
    tensor_to_json_data,
)
from wirekit.oip.metadata import TensorSpec, check_inputs

from ..config import SERVER_KINDS, ModelConfig
from ..control.metrics import DOOR_HTTP, DOOR_TFSERVING
from ..dispatch.dispatcher import MODEL_ERROR, Dispatcher, Outcome, UnknownModel
from ..dispatch.payload import Payload, outputs_json
from .answers import outcome_reason
from .answers import outcome_status as _outcome_status
from .http import (
    NAME,
    _body,
    _client,
    _error,
    _json,
    _payload,
    _too_many_items,
    _unknown,
)

#: the response header that carries the request's id (its row in the store)
REQUEST_ID_HEADER = "X-Request-Id"
#: the one signature a model served by wirekit has (TF Serving's default's name)
SIGNATURE = "serving_default"
#: the suffix of a tensor name whose BYTES values are always answered as ``{"b64": ...}``
BINARY_SUFFIX = "_bytes"
#: OIP datatype -> TensorFlow's DataType name (the metadata's ``dtype``)
TF_DTYPES = {
    "BOOL": "DT_BOOL",
    "UINT8": "DT_UINT8",
    "UINT16": "DT_UINT16",
    "UINT32": "DT_UINT32",
    "UINT64": "DT_UINT64",
    "INT8": "DT_INT8",
    "INT16": "DT_INT16",
    "INT32": "DT_INT32",
    "INT64": "DT_INT64",
    "FP16": "DT_HALF",
    "FP32": "DT_FLOAT",
    "FP64": "DT_DOUBLE",
    "BF16": "DT_BFLOAT16",
    "BYTES": "DT_STRING",
}
#: a version in a path: what follows ``/versions/``
_VERSION = "[^/:]+"
_U32 = struct.Struct("<I")


class BadBody(ValueError):
    """A ``:predict`` body this door cannot take: the message of its 400."""


#: the name of the one input given bare (not in an object naming it) to a model that
#: declares no inputs
BARE_INPUT = "input"


def infer_datatype(values: list[Any], where: str) -> str:
    """The OIP datatype of a tensor whose declaration is not known, read from its JSON
    values (row-major, flat): all true/false BOOL, all integers INT64, numbers with a
    fraction or an exponent among them FP64 (a JSON number's own precision), strings and
    ``{"b64": ...}`` BYTES; none FP64.  A mix of these is :class:`BadBody`."""
    kinds = set()
    for value in values:
        if isinstance(value, bool):
            kinds.add("BOOL")
        elif isinstance(value, int):
            kinds.add("INT64")
        elif isinstance(value, float):
            kinds.add("FP64")
        else:
            kinds.add("BYTES")
    if kinds == {"INT64", "FP64"}:
        return "FP64"
    if len(kinds) > 1:
        raise BadBody(f"{where}: mixes {' and '.join(sorted(kinds))} values (one datatype)")
    return kinds.pop() if kinds else "FP64"


# --- JSON values -> OIP tensors ------------------------------------------------------------


def _is_b64(value: Any) -> bool:
    """Whether ``value`` is TF Serving's binary value, ``{"b64": "..."}``."""
    return isinstance(value, dict) and len(value) == 1 and "b64" in value


def _is_named(value: Any) -> bool:
    """Whether ``value`` names tensors (an object that is not a binary value)."""
    return isinstance(value, dict) and not _is_b64(value)


def nested_shape(value: Any, where: str) -> tuple[int, ...]:
    """The shape of a tensor written as nested JSON lists (``()`` for a bare value);
    :class:`BadBody` when the lists are ragged or a value is an object (binary values
    ``{"b64": ...}`` aside)."""
    shape: list[int] = []
    level = value
    while isinstance(level, list):
        shape.append(len(level))
        if not level:
            break
        level = level[0]
    _check_nesting(value, tuple(shape), where)
    return tuple(shape)


def _check_nesting(value: Any, shape: tuple[int, ...], where: str) -> None:
    """:class:`BadBody` unless ``value`` is nested lists of exactly ``shape`` (checked level
    by level, without recursion) holding values that are not objects."""
    level = [value]
    for depth, size in enumerate(shape):
        following: list[Any] = []
        for entry in level:
            if not isinstance(entry, list) or len(entry) != size:
                raise _ragged(where, depth)
            following.extend(entry)
        level = following
    for entry in level:
        if isinstance(entry, list):
            raise _ragged(where, len(shape))
        if isinstance(entry, dict) and not _is_b64(entry):
            raise BadBody(f'{where}: a value is an object (only {{"b64": ...}} is one)')


def _ragged(where: str, depth: int) -> BadBody:
    return BadBody(
        f"{where}: the lists are ragged at depth {depth} (a tensor's lists have equal"
        " lengths at each depth)"
    )


def _flat(value: Any, depth: int) -> list[Any]:
    """The values of nested lists ``depth`` deep, in row-major order."""
    level = [value]
    for _ in range(depth):
        level = [entry for inner in level for entry in inner]
    return level


def _binary_value(value: Any, name: str) -> bytes:
    """One element of a BYTES tensor: a string's UTF-8 bytes, or a binary value decoded."""
    if isinstance(value, str):
        return value.encode("utf-8", "surrogatepass")
    if _is_b64(value) and isinstance(value["b64"], str):
        try:
            return base64.b64decode(value["b64"], validate=True)
        except (binascii.Error, ValueError):
            raise BadBody(f"input {name!r}: a b64 value is not base64") from None
    raise BadBody(f'input {name!r}: a BYTES value is a string or {{"b64": ...}}, got {value!r}')


def json_tensor(spec: TensorSpec, value: Any) -> Tensor:
    """The tensor named and typed by ``spec`` that the nested JSON ``value`` writes (its
    shape is the nesting's); :class:`BadBody` when the value does not fit the datatype."""
    where = f"input {spec.name!r}"
    shape = nested_shape(value, where)
    flat = _flat(value, len(shape))
    if spec.datatype == "BYTES":
        raw = b"".join(_U32.pack(len(e)) + e for e in (_binary_value(v, spec.name) for v in flat))
        return Tensor(spec.name, "BYTES", shape, raw)
    if any(_is_b64(v) for v in flat):
        raise BadBody(f"{where}: a b64 value in a {spec.datatype} tensor (BYTES only)")
    try:
        return tensor_from_json(spec.name, spec.datatype, list(shape), flat)
    except DecodeError as exc:
        raise BadBody(exc.reason) from None


def undeclared_tensor(name: str, value: Any) -> Tensor:
    """The tensor ``name`` that the nested JSON ``value`` writes, its datatype read from its
    values (:func:`infer_datatype`); :class:`BadBody` when they do not form one."""
    return json_tensor(_spec_of(name, (), value), value)


def _named_values(value: Any, inputs: tuple[TensorSpec, ...], where: str) -> dict[str, Any]:
    """The tensors of ``value`` by input name: an object naming them, or -- for a model of
    one input, or of undeclared inputs -- that input's value (named :data:`BARE_INPUT`
    when undeclared)."""
    if _is_named(value):
        return dict(value)
    if len(inputs) == 1:
        return {inputs[0].name: value}
    if not inputs:
        return {BARE_INPUT: value}
    names = ", ".join(spec.name for spec in inputs)
    raise BadBody(f"{where}: the model has {len(inputs)} inputs ({names}): name them in an object")


def _spec_of(name: str, inputs: tuple[TensorSpec, ...], value: Any = None) -> TensorSpec:
    """The declared input ``name``; :class:`BadBody` naming the inputs when there is none.
    No input declared: ``name`` with the datatype its JSON ``value`` has."""
    if not inputs:
        where = f"input {name!r}"
        flat = _flat(value, len(nested_shape(value, where)))
        flat = ["" if _is_b64(v) else v for v in flat]
        return TensorSpec(name, infer_datatype(flat, where), ())
    for spec in inputs:
        if spec.name == name:
            return spec
    names = ", ".join(spec.name for spec in inputs)
    raise BadBody(f"unknown input {name!r} (the model's inputs: {names})")


def row_request(instances: list[Any], inputs: tuple[TensorSpec, ...]) -> list[Tensor]:
    """The tensors of a row-format body: each input's values of every instance stacked along
    a new dim 0."""
    columns: dict[str, list[Any]] = {}
    for k, instance in enumerate(instances):
        named = _named_values(instance, inputs, f"instances[{k}]")
        if k and set(named) != set(columns):
            raise BadBody(
                f"instances[{k}]: names the inputs {', '.join(sorted(named))}, instances[0]"
                f" names {', '.join(sorted(columns))} (every instance names the same inputs)"
            )
        for name, value in named.items():
            columns.setdefault(name, []).append(value)
    return [json_tensor(_spec_of(name, inputs, values), values) for name, values in columns.items()]


def columnar_request(value: Any, inputs: tuple[TensorSpec, ...]) -> list[Tensor]:
    """The tensors of a columnar-format body (``inputs``)."""
    named = _named_values(value, inputs, "inputs")
    return [json_tensor(_spec_of(name, inputs, v), v) for name, v in named.items()]


# --- OIP tensors -> JSON values ------------------------------------------------------------


def _nest(flat: list[Any], shape: tuple[int, ...]) -> Any:
    """``flat`` (row-major) as nested lists of ``shape`` (a bare value for ``()``)."""
    if not shape:
        return flat[0]
    if 0 in shape:
        return _empty(shape)
    nested = flat
    for size in reversed(shape[1:]):
        nested = [nested[i : i + size] for i in range(0, len(nested), size)]
    return nested


def _empty(shape: tuple[int, ...]) -> list[Any]:
    """Nested lists of ``shape``, which holds no element."""
    if shape[0] == 0:
        return []
    return [_empty(shape[1:]) for _ in range(shape[0])]


def tensor_json(tensor: Tensor) -> Any:
    """A tensor's value as TF Serving writes it: nested lists of its shape; BYTES elements
    strings, or ``{"b64": ...}`` when the tensor's name ends in ``_bytes`` or the element is
    not UTF-8."""
    if tensor.datatype != "BYTES":
        return _nest(tensor_to_json_data(tensor), tuple(tensor.shape))
    check_tensor(tensor)  # its framing, before it is walked (DecodeError)
    view = memoryview(tensor.data).cast("B")
    binary = tensor.name.endswith(BINARY_SUFFIX)
    values: list[Any] = []
    pos = 0
    while pos < len(view):
        (length,) = _U32.unpack_from(view, pos)
        element = bytes(view[pos + 4 : pos + 4 + length])
        pos += 4 + length
        values.append(_bytes_json(element, binary))
    return _nest(values, tuple(tensor.shape))


def _bytes_json(element: bytes, binary: bool) -> Any:
    if not binary:
        try:
            return element.decode("utf-8")
        except UnicodeDecodeError:
            pass
    return {"b64": base64.b64encode(element).decode("ascii")}


class BadAnswer(ValueError):
    """A backend's outputs that cannot be written in the form asked for."""


def predictions(outputs: list[Tensor]) -> list[Any]:
    """The row format's answer: one output's rows, or per row an object of every output's
    row (they must share dim 0)."""
    if not outputs:
        raise BadAnswer("the model answered no output")
    values = {t.name: tensor_json(t) for t in outputs}
    rows = {t.shape[0] if t.shape else None for t in outputs}
    if None in rows or len(rows) != 1:
        shapes = ", ".join(f"{t.name} {list(t.shape)}" for t in outputs)
        raise BadAnswer(
            f"the model's outputs do not share a 0-th dimension ({shapes}): ask in the"
            ' columnar format ("inputs")'
        )
    if len(outputs) == 1:
        only: list[Any] = values[outputs[0].name]
        return only
    (count,) = rows
    assert count is not None
    return [{name: value[row] for name, value in values.items()} for row in range(count)]


def columnar_outputs(outputs: list[Tensor]) -> Any:
    """The columnar format's answer: the one output's value, or an object of every output's."""
    if len(outputs) == 1:
        return tensor_json(outputs[0])
    return {t.name: tensor_json(t) for t in outputs}


# --- the model documents -------------------------------------------------------------------


def model_status(
    model: ModelConfig, versions: tuple[int, ...], unready: str | None = None
) -> dict[str, Any]:
    """``GET /v1/models/{m}[/versions/{v}]``: TF Serving's ``GetModelStatusResponse`` of
    ``versions``, with KServe v1's ``name`` and ``ready``; ``unready``: why the model cannot
    serve now (None: it can)."""
    if unready is None:
        state, status = "AVAILABLE", {"error_code": "OK", "error_message": ""}
    else:
        state, status = "UNAVAILABLE", {"error_code": "UNAVAILABLE", "error_message": unready}
    return {
        "name": model.name,
        "ready": unready is None,
        "model_version_status": [
            {"version": str(v), "state": state, "status": dict(status)} for v in versions
        ],
    }


def _tensor_info(spec: TensorSpec) -> dict[str, Any]:
    """One tensor of a signature, as ``TensorInfo``'s JSON."""
    return {
        "name": spec.name,
        "dtype": TF_DTYPES[spec.datatype],
        "tensor_shape": {
            "dim": [{"size": str(size), "name": ""} for size in spec.shape],
            "unknown_rank": False,
        },
    }


def model_metadata(model: ModelConfig, version: int) -> dict[str, Any]:
    """``GET /v1/models/{m}[/versions/{v}]/metadata``: TF Serving's
    ``GetModelMetadataResponse`` with the one signature, ``serving_default``."""
    signature = {
        "inputs": {spec.name: _tensor_info(spec) for spec in model.inputs},
        "outputs": {spec.name: _tensor_info(spec) for spec in model.outputs},
        "method_name": "tensorflow/serving/predict",
    }
    return {
        "model_spec": {"name": model.name, "signature_name": "", "version": str(version)},
        "metadata": {"signature_def": {"signature_def": {SIGNATURE: signature}}},
    }


# --- the handlers --------------------------------------------------------------------------


def _with_id(response: web.Response, outcome: Outcome) -> web.Response:
    response.headers[REQUEST_ID_HEADER] = str(outcome.id)
    return response


def _outcome_error(outcome: Outcome) -> web.Response:
    """The ``{"error"}`` answer of a request that did not end ``ok``."""
    if outcome.cause == MODEL_ERROR:  # the model's own error message (its OIP ERROR item)
        return _with_id(_error(400, outcome.detail), outcome)
    msg = outcome.response.message
    if isinstance(msg, ErrorReply):
        return _with_id(_error(_outcome_status(outcome), outcome_reason(outcome)), outcome)
    return _with_id(_error(502, f"unexpected backend answer: {msg}"), outcome)


def _signature(doc: Mapping[str, Any]) -> str | None:
    """The body's ``signature_name`` (None when absent); :class:`BadBody` if not a string."""
    name = doc.get("signature_name")
    if name is not None and not isinstance(name, str):
        raise BadBody("signature_name must be a string")
    return name


def _tensors_body(doc: Mapping[str, Any]) -> tuple[str, Any]:
    """Which format the body uses (``"instances"`` or ``"inputs"``) and its value;
    :class:`BadBody` for neither or both."""
    if "instances" in doc and "inputs" in doc:
        raise BadBody('the body has both "instances" and "inputs": give one of them')
    if "instances" in doc:
        return "instances", doc["instances"]
    if "inputs" in doc:
        return "inputs", doc["inputs"]
    raise BadBody('the body needs "instances" (row format) or "inputs" (columnar format)')


class TfServingHandlers:
    """The handlers of TF Serving's REST API (see the module docstring), over the
    ``dispatcher`` (the models served, where requests go), ``max_items`` (MIP items per
    body) and ``readiness`` (``readiness(model)["ready"]``: the truth ``/readyz`` tells)."""

    def __init__(
        self,
        dispatcher: Dispatcher,
        max_items: int = DEFAULT_MAX_ITEMS,
        readiness: Callable[[str | None], dict[str, Any]] | None = None,
    ) -> None:
        self.dispatcher = dispatcher
        self.max_items = max_items
        self.readiness = readiness

    def _model(self, request: web.Request) -> tuple[ModelConfig, int] | web.Response:
        """The model the path names and the version asked for (its latest when the path
        names none), or the 404/410 that refuses the path."""
        info = request.match_info
        return self.model_at(info["model"], info.get("version"))

    def model_at(self, name: str, asked: str | None) -> tuple[ModelConfig, int] | web.Response:
        """The model ``name`` and the version ``asked`` (the path's; None: its latest), or
        the 404/410 that refuses them."""
        model = self.dispatcher.models.get(name)
        if model is None:
            return _unknown(self.dispatcher, name)
        if asked is None:
            return model, max(model.versions)
        version = int(asked) if asked.isdigit() and len(asked) < 20 else None
        if version not in model.versions:
            versions = ", ".join(str(v) for v in model.versions)
            return _error(404, f"model {name!r} has no version {asked} (its versions: {versions})")
        return model, version

    def _unready(self, model: str) -> str | None:
        """Why ``model`` cannot serve now (``/readyz?model=``'s reasons), or None."""
        if self.readiness is None:
            return None
        doc = self.readiness(model)
        return None if doc["ready"] else "; ".join(doc["reasons"]) or "not ready"

    async def predict(self, request: web.Request) -> web.Response:
        """``POST /v1/models/{m}[/versions/{v}]:predict``."""
        found = self._model(request)
        if isinstance(found, web.Response):
            return found
        return await self.predict_doc(found[0], await _body(request), _client(request))

    async def predict_doc(
        self, model: ModelConfig, doc: dict[str, Any], client: str
    ) -> web.Response:
        """The answer to a prediction of ``model`` whose body ``doc`` has been read (the
        JSON object; ``client``: as the store records it).  One truth for the aiohttp route
        (:meth:`predict`) and the HTTP door's lean path (:mod:`wirekit.serve.doors.lean`)."""
        try:
            signature = _signature(doc)
            form, value = _tensors_body(doc)
            if model.inputs or model.backend in SERVER_KINDS:
                return await self._predict_tensors(client, model, form, value, signature)
        except BadBody as exc:
            return _error(400, str(exc))
        return await self._predict_items(client, model.name, form, value)

    async def _submit(
        self, client: str, model: str, payload: Payload, door: str
    ) -> Outcome | web.Response:
        """The outcome of ``payload`` for ``model`` (``client``: as the store records it),
        counted on ``door`` in the metrics; the 404/410 of a model removed while the body
        was read."""
        try:
            return await self.dispatcher.submit(model, payload, client, door=door)
        except UnknownModel:  # removed while the body was read
            return _unknown(self.dispatcher, model)

    async def _predict_items(
        self, client: str, model: str, form: str, samples: Any
    ) -> web.Response:
        """A model that declares no inputs: wirekit's JSON-item mapping."""
        multi = form == "inputs"
        if isinstance(samples, dict):
            return _error(
                400,
                f"model {model!r} declares no inputs: a map of named tensors needs them"
                f" (models.{model}.inputs), or give a list of samples",
            )
        if not isinstance(samples, list) or not samples:
            return _error(400, f"{form} must be a non-empty list")
        count = sum(max(len(s), 1) if multi and isinstance(s, list) else 1 for s in samples)
        refusal = _too_many_items(count, self.max_items)
        if refusal is not None:
            return refusal
        payload = _payload(samples, multi)
        if isinstance(payload, web.Response):
            return payload
        outcome = await self._submit(client, model, payload, DOOR_HTTP)
        if isinstance(outcome, web.Response):
            return outcome
        if not outcome.ok:
            return _outcome_error(outcome)
        msg = outcome.response.message
        assert isinstance(msg, Inference)
        values = outputs_json(msg)
        if multi:
            return _with_id(_json({"outputs": values}), outcome)
        answers = [sample[0] if len(sample) == 1 else sample for sample in values]
        return _with_id(_json({"predictions": answers}), outcome)

    async def _predict_tensors(
        self,
        client: str,
        model: ModelConfig,
        form: str,
        value: Any,
        signature: str | None,
    ) -> web.Response:
        """A model that declares its inputs (or is served by model servers): OIP tensors, by
        the mapping of specs/oip.md."""
        if form == "instances":
            if not isinstance(value, list) or not value:
                raise BadBody("instances must be a non-empty list (one entry per row)")
            tensors = row_request(value, model.inputs)
        else:
            tensors = columnar_request(value, model.inputs)
        parameters = {"signature_name": signature} if signature is not None else {}
        req = InferRequest(tensors, parameters=parameters)
        problem = check_inputs(model, req)
        if problem is not None:
            raise BadBody(problem)
        rows = model.tensors == "rows"
        try:
            refusal = _too_many_items(mip_item_count(req, rows=rows), self.max_items)
            if refusal is not None:
                return refusal
            payload = Payload(request_to_mip(req, rows=rows))
        except DecodeError as exc:
            raise BadBody(exc.reason) from None
        outcome = await self._submit(client, model.name, payload, DOOR_TFSERVING)
        if isinstance(outcome, web.Response):
            return outcome
        if not outcome.ok:
            return _outcome_error(outcome)
        try:
            outputs, _parameters = response_from_mip(outcome.response.message, rows=rows)
            if form == "instances":
                answer = {"predictions": predictions(outputs)}
            else:
                answer = {"outputs": columnar_outputs(outputs)}
        except BackendError as exc:  # the model's own error message
            return _with_id(_error(400, exc.message), outcome)
        except (DecodeError, EncodeError) as exc:
            return _with_id(_error(502, f"the model's answer is not OIP's: {exc.reason}"), outcome)
        except BadAnswer as exc:
            return _with_id(_error(502, str(exc)), outcome)
        return _with_id(_json(answer), outcome)

    async def unsupported(self, request: web.Request) -> web.Response:
        """``:classify`` and ``:regress``: not served (501), after the model is found."""
        found = self._model(request)
        if isinstance(found, web.Response):
            return found
        verb = request.match_info["verb"]
        return _error(501, f"{verb} is not served by wirekit: use predict")

    async def status(self, request: web.Request) -> web.Response:
        """``GET /v1/models/{m}[/versions/{v}]``."""
        found = self._model(request)
        if isinstance(found, web.Response):
            return found
        model, version = found
        versions = model.versions if "version" not in request.match_info else (version,)
        unready = self._unready(model.name)
        return _json(model_status(model, versions, unready), 200 if unready is None else 503)

    async def metadata(self, request: web.Request) -> web.Response:
        """``GET /v1/models/{m}[/versions/{v}]/metadata``."""
        found = self._model(request)
        if isinstance(found, web.Response):
            return found
        return _json(model_metadata(*found))

    async def list_models(self, _request: web.Request) -> web.Response:
        """``GET /v1/models`` (KServe v1): the names of the models served."""
        return _json({"models": sorted(self.dispatcher.models)})

    async def not_found(self, request: web.Request) -> web.Response:
        """Any other path under ``/v1/models/``: 404 ``{"error"}`` (version labels too)."""
        return _error(404, f"no such API: {request.method} {request.path}")

    def add_routes(self, app: web.Application) -> None:
        """Route TF Serving's REST API of ``app`` to these handlers."""
        router = app.router
        model = f"/v1/models/{{model:{NAME}}}"
        for base in (model, f"{model}/versions/{{version:{_VERSION}}}"):
            router.add_post(f"{base}:predict", self.predict)
            router.add_post(f"{base}:{{verb:classify|regress}}", self.unsupported)
            router.add_get(f"{base}/metadata", self.metadata)
            router.add_get(base, self.status)
        router.add_get("/v1/models", self.list_models)
        # GET and POST only: another method on a route above stays a 405 (no CORS preflight)
        router.add_get("/v1/models/{rest:.*}", self.not_found)
        router.add_post("/v1/models/{rest:.*}", self.not_found)


__all__ = [
    "REQUEST_ID_HEADER",
    "SIGNATURE",
    "TF_DTYPES",
    "BadAnswer",
    "BadBody",
    "TfServingHandlers",
    "columnar_outputs",
    "columnar_request",
    "json_tensor",
    "model_metadata",
    "model_status",
    "nested_shape",
    "predictions",
    "row_request",
    "tensor_json",
]
