"""``wirekit conform oip server``: wirekit plays an Open Inference Protocol client.

TARGET is the server under test: ``http://HOST:PORT`` (or ``HOST:PORT``), its REST port; with
``--grpc`` its gRPC port.  The cases follow the OIP specification (KServe's "V2 inference
protocol": github.com/kserve/open-inference-protocol, ``inference_rest.md`` and
``open_inference_grpc.proto``) and two extensions it names, which a server MAY offer:
the binary tensor data extension (Triton's ``extension_binary_data.md``) and the model
repository extension (``extension_model_repository.md``).  Levels are the spec's words:

* MUST -- the spec says so (``must``, or a field its JSON schema does not mark optional);
* SHOULD -- the spec's ``should``, or what it implies without requiring it;
* MAY -- optional behaviour (a datatype or shape a model need not take, an extension): a
  server that declines it (an error answer, a 404 for an extension's endpoint) skips the
  case with the reason; one that does it is checked to do it right.

The model under test (``--model``; else the first READY model of the server's repository
index) is expected to echo: each output equal to the input of its name, as wirekit's
conformance model does (specs/conformance.md).  A case's detail records the server's
answer (status and body, or the gRPC status and message).
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from wirekit.errors import DecodeError

from ..core.cases import Failed, Level, Skipped, Suite
from ..core.net import Deadline, refused_connection
from ..core.options import SuiteOptions

SUITE = Suite("oip", "server", "OIP server")
MUST, SHOULD, MAY = Level.MUST, Level.SHOULD, Level.MAY

#: where the cases' rules are written: wirekit's specs (the spec text each case follows is
#: quoted in specs/conformance.md, "OIP server cases")
CASES = "specs/conformance.md#oip-server-cases"
HEALTH = SERVER_METADATA = MODEL_METADATA = MODEL_READY = REPOSITORY = CASES
INFERENCE = PARAMETERS = "specs/oip.md#rest-json-bodies"
ERRORS = "specs/oip.md#errors"
TENSORS = "specs/oip.md#tensors"
BINARY = "specs/oip.md#rest-the-binary-tensor-data-extension"

HEADER = "Inference-Header-Content-Length"
UNKNOWN_MODEL = "wirekit-conform-no-such-model"
_SHOW = 400  # characters of a body kept in a case's detail

#: each datatype's sample elements (six, exact in the datatype and in JSON)
SAMPLES: dict[str, list[Any]] = {
    "BOOL": [True, False, True, True, False, False],
    "UINT8": [0, 1, 2, 100, 254, 255],
    "UINT16": [0, 1, 2, 300, 65534, 65535],
    "UINT32": [0, 1, 2, 70000, 4294967294, 4294967295],
    "UINT64": [0, 1, 2, 70000, 2**40, 2**53],
    "INT8": [-128, -1, 0, 1, 2, 127],
    "INT16": [-32768, -1, 0, 1, 300, 32767],
    "INT32": [-(2**31), -1, 0, 1, 70000, 2**31 - 1],
    "INT64": [-(2**53), -1, 0, 1, 2**40, 2**53],
    "FP16": [0.5, -1.5, 2.0, 0.0, 1.0, -0.25],
    "FP32": [0.5, -1.5, 2.0, 0.0, 1.0, -0.25],
    "FP64": [0.5, -1.5, 2.0, 0.0, 0.1, -0.25],
    "BF16": [0.5, -1.5, 2.0, 0.0, 1.0, -0.25],
    "BYTES": ["a", "bc", "", "def", "x", "yz"],
}
#: shapes a model may take (MAY): name -> shape
SHAPES: dict[str, tuple[int, ...]] = {
    "vector": (6,),
    "matrix": (2, 3),
    "rank4": (1, 2, 1, 3),
    "scalar": (),
    "empty": (0, 4),
}


# --------------------------------------------------------------------------- answers


@dataclass
class Answer:
    """What the server said: HTTP status (gRPC: 200 for OK, else the status code's name in
    ``code``), headers, body; for gRPC the decoded message in ``message``."""

    status: int
    body: bytes = b""
    headers: dict[str, str] | None = None
    code: str = "OK"
    message: Any = None

    def header(self, name: str) -> str | None:
        for key, value in (self.headers or {}).items():
            if key.lower() == name.lower():
                return value
        return None

    def json(self) -> Any:
        """The body as JSON (a ``Failed`` when it is not)."""
        length = self.header(HEADER)
        body = self.body[: int(length)] if length and length.isdigit() else self.body
        try:
            return json.loads(body)
        except ValueError:
            raise Failed("a JSON body", self.text(), self.body) from None

    def text(self) -> str:
        """The answer in a line, for a case's detail."""
        if self.headers is None:
            if self.code == "OK":
                return f"gRPC OK: {_brief(self.message)}"
            return f"gRPC {self.code}: {self.body.decode(errors='replace')[:_SHOW]}"
        shown = self.body[:_SHOW].decode(errors="replace")
        more = f"... ({len(self.body)} bytes)" if len(self.body) > _SHOW else ""
        extra = f" {HEADER}: {self.header(HEADER)}" if self.header(HEADER) else ""
        return f"HTTP {self.status}{extra} {shown}{more}"


def _error_body(answer: Answer, want: str) -> None:
    """Fail unless ``answer`` is an HTTP error status with ``{"error": $string}``."""
    if answer.headers is None:  # gRPC: a status other than OK
        if answer.code == "OK":
            raise Failed(f"{want}: a gRPC error status", "OK " + _brief(answer.message))
        return
    if answer.status < 400:
        raise Failed(f"{want}: an HTTP error status (typically 400)", answer.text(), answer.body)
    try:
        doc = json.loads(answer.body)
    except ValueError:
        doc = None
    if not isinstance(doc, dict) or not isinstance(doc.get("error"), str):
        raise Failed(f'{want}: a body {{"error": $string}}', answer.text(), answer.body)


def _brief(message: Any) -> str:
    text = str(message).replace("\n", " ")
    return text[:_SHOW]


# --------------------------------------------------------------------------- the target


class OipServer:
    """The server under test, over REST or gRPC, and the model the cases use."""

    def __init__(
        self,
        address: tuple[str, int],
        *,
        grpc: bool,
        models: list[str],
        load_timeout: float,
        unload: bool = False,
    ) -> None:
        self.host, self.port = address
        self.unload = unload
        self.grpc = grpc
        self.asked_models = models
        self.load_timeout = load_timeout
        self._model: str | None = None
        self._metadata: dict[str, Any] | None = None
        self._channel: Any = None
        self._stubs: dict[str, Any] = {}

    def __str__(self) -> str:
        scheme = "grpc" if self.grpc else "http"
        model = f" (model {self._model})" if self._model else ""
        return f"{scheme}://{self.host}:{self.port}{model}"

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()

    def unreachable(self, seconds: float) -> str | None:
        """Why nothing takes a connection at the server's port (None: something does)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return refused_connection(f"tcp://{host}:{self.port}", seconds)

    def timeout_for(self, case: Any, seconds: float) -> float:
        """The repository cases wait for a load: ``--load-timeout`` on top."""
        return seconds + self.load_timeout if case.id.startswith("repository.") else seconds

    # --- REST

    def http(
        self,
        method: str,
        path: str,
        deadline: Deadline,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> Answer:
        """One HTTP/1.1 exchange on a connection of its own."""
        conn = http.client.HTTPConnection(self.host, self.port, timeout=deadline.remaining())
        try:
            sent = dict(headers or {})
            if body is not None:
                sent.setdefault("Content-Type", "application/json")
            conn.request(method, path, body=body, headers=sent)
            response = conn.getresponse()
            data = response.read()
            return Answer(response.status, data, dict(response.getheaders()))
        except (OSError, http.client.HTTPException) as exc:
            raise Failed(f"an answer to {method} {path}", f"{type(exc).__name__}: {exc}") from None
        finally:
            conn.close()

    # --- gRPC

    def call(self, method: str, deadline: Deadline, **fields: Any) -> Answer:
        """One gRPC call of ``inference.GRPCInferenceService``: the answer with the decoded
        response in ``message`` (status OK), or the status code's name and its details."""
        import grpc

        from wirekit.oip.grpc import SERVICE, message_class

        if self._channel is None:
            self._channel = grpc.insecure_channel(f"{_bracket(self.host)}:{self.port}")
        if method not in self._stubs:
            request_class = message_class(f"{method}Request")
            response_class = message_class(f"{method}Response")
            stub = self._channel.unary_unary(
                f"/{SERVICE}/{method}",
                request_serializer=request_class.SerializeToString,
                response_deserializer=response_class.FromString,
            )
            self._stubs[method] = (stub, request_class)
        stub, request_class = self._stubs[method]
        request = fields.pop("request", None) or request_class(**fields)
        try:
            reply = stub(request, timeout=deadline.remaining())
        except grpc.RpcError as exc:
            code = exc.code()
            name = code.name if code is not None else "UNKNOWN"
            if name == "DEADLINE_EXCEEDED" and deadline.passed:
                raise Failed(
                    f"an answer to {method}", f"none within {deadline.seconds:g} s"
                ) from None
            if name == "UNAVAILABLE":
                raise Failed(f"an answer to {method}", f"UNAVAILABLE: {exc.details()}") from None
            return Answer(0, (exc.details() or "").encode(), None, name)
        return Answer(200, b"", None, "OK", reply)

    # --- the model

    def model(self, deadline: Deadline) -> str:
        """The model the cases use: the first of ``--model`` that says ready, else the
        first READY model of the repository index (REST), else a ``Skipped``."""
        if self._model is not None:
            return self._model
        for name in self.asked_models:
            if self.model_ready(name, deadline):
                self._model = name
                return name
        if self.asked_models:
            raise Skipped(f"none of the models asked for ({', '.join(self.asked_models)}) is ready")
        if not self.grpc:
            index = self.http("POST", "/v2/repository/index", deadline, b"{}")
            if index.status == 200:
                with contextlib.suppress(Failed):
                    for entry in index.json():
                        if isinstance(entry, dict) and str(entry.get("state", "READY")) == "READY":
                            found = entry.get("name")
                            if isinstance(found, str) and self.model_ready(found, deadline):
                                self._model = found
                                return found
        raise Skipped("no model to test: give --model NAME (the server has no repository index)")

    def model_ready(self, name: str, deadline: Deadline) -> bool:
        if self.grpc:
            answer = self.call("ModelReady", deadline, name=name)
            return answer.code == "OK" and bool(answer.message.ready)
        return self.http("GET", f"/v2/models/{name}/ready", deadline).status == 200

    def metadata(self, deadline: Deadline) -> dict[str, Any]:
        """The model's metadata as REST's JSON (``{}`` when it cannot be had)."""
        if self._metadata is None:
            name = self.model(deadline)
            doc: dict[str, Any] = {}
            if self.grpc:
                answer = self.call("ModelMetadata", deadline, name=name)
                if answer.code == "OK":
                    m = answer.message
                    doc = {
                        "name": m.name,
                        "platform": m.platform,
                        "inputs": [_grpc_tensor_meta(t) for t in m.inputs],
                        "outputs": [_grpc_tensor_meta(t) for t in m.outputs],
                    }
            else:
                answer = self.http("GET", f"/v2/models/{name}", deadline)
                if answer.status == 200:
                    with contextlib.suppress(Failed):
                        got = answer.json()
                        doc = got if isinstance(got, dict) else {}
            self._metadata = doc
        return self._metadata

    def declared_input(self, deadline: Deadline) -> tuple[str, str | None, tuple[int, ...] | None]:
        """The model's first declared input: (name, datatype or None, shape with -1 as 1, or
        None); ("input0", None, None) when it declares none."""
        inputs = self.metadata(deadline).get("inputs") or []
        if inputs and isinstance(inputs[0], dict) and isinstance(inputs[0].get("name"), str):
            first = inputs[0]
            shape = first.get("shape")
            dims = (
                tuple(1 if d == -1 else int(d) for d in shape) if isinstance(shape, list) else None
            )
            datatype = first.get("datatype") if isinstance(first.get("datatype"), str) else None
            return first["name"], datatype, dims
        return "input0", None, None

    def basic_input(self, deadline: Deadline) -> dict[str, Any]:
        """An input the model takes: its first declared input (FP32 [1,4] when it declares
        none), filled with sample elements."""
        name, datatype, shape = self.declared_input(deadline)
        datatype = datatype if datatype in SAMPLES else "FP32"
        shape = shape if shape is not None else (1, 4)
        return tensor_doc(name, datatype, shape)

    # --- inference

    def infer(
        self,
        doc: dict[str, Any],
        deadline: Deadline,
        *,
        model: str | None = None,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> Answer:
        """An inference request given as REST's JSON document (gRPC: the same, as a
        ``ModelInferRequest`` with raw contents)."""
        name = model or self.model(deadline)
        if self.grpc:
            return self.call("ModelInfer", deadline, request=grpc_request(name, doc))
        data = body if body is not None else json.dumps(doc).encode()
        return self.http("POST", f"/v2/models/{name}/infer", deadline, data, headers)

    def outputs(self, answer: Answer) -> tuple[dict[str, Any], list[Any]]:
        """A successful inference answer's (document without outputs, outputs as wirekit
        Tensors); a ``Failed`` naming what is wrong with it."""
        from wirekit.oip import decode_rest_response

        if self.grpc:
            if answer.code != "OK":
                raise Failed("an inference answer (gRPC OK)", answer.text())
            try:
                return grpc_response(answer.message)
            except DecodeError as exc:
                raise Failed("a well-formed ModelInferResponse", str(exc)) from None
        if answer.status != 200:
            raise Failed("an inference answer (HTTP 200)", answer.text(), answer.body)
        try:
            response = decode_rest_response(answer.body, answer.header(HEADER))
        except DecodeError as exc:
            raise Failed(
                "a well-formed $inference_response", f"{exc}: {answer.text()}", answer.body
            ) from None
        head = {
            "model_name": response.model_name,
            "id": response.id,
            "model_version": response.model_version,
            "parameters": response.parameters,
        }
        return head, response.outputs


def _bracket(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _grpc_tensor_meta(t: Any) -> dict[str, Any]:
    return {"name": t.name, "datatype": t.datatype, "shape": list(t.shape)}


def tensor_doc(name: str, datatype: str, shape: tuple[int, ...], **extra: Any) -> dict[str, Any]:
    """A request input of ``datatype`` and ``shape`` holding sample elements."""
    count = 1
    for dim in shape:
        count *= dim
    samples = SAMPLES[datatype]
    data = [samples[i % len(samples)] for i in range(count)]
    return {"name": name, "datatype": datatype, "shape": list(shape), "data": data, **extra}


def expected_tensor(doc: dict[str, Any]) -> Any:
    """The wirekit Tensor a request input's JSON holds (what an echo answers)."""
    from wirekit.oip import tensor_from_json

    return tensor_from_json(doc["name"], doc["datatype"], doc["shape"], doc["data"])


def grpc_request(model: str, doc: dict[str, Any]) -> Any:
    """REST's $inference_request ``doc`` as a ``ModelInferRequest`` (raw contents)."""
    from wirekit.oip.grpc import message_class, parameters_to_grpc

    msg = message_class("ModelInferRequest")(model_name=model)
    if doc.get("id") is not None:
        msg.id = doc["id"]
    parameters_to_grpc(doc.get("parameters") or {}, msg.parameters)
    for given in doc.get("inputs", []):
        tensor = msg.inputs.add(name=given["name"], datatype=given["datatype"])
        tensor.shape.extend(given["shape"])
        parameters_to_grpc(given.get("parameters") or {}, tensor.parameters)
        msg.raw_input_contents.append(bytes(expected_tensor(given).data))
    for wanted in doc.get("outputs", []):
        out = msg.outputs.add(name=wanted["name"])
        parameters_to_grpc(wanted.get("parameters") or {}, out.parameters)
    return msg


def grpc_response(msg: Any) -> tuple[dict[str, Any], list[Any]]:
    """A ``ModelInferResponse`` as (its head, its outputs as wirekit Tensors)."""
    from wirekit.oip import Tensor
    from wirekit.oip.grpc import parameters_from_grpc
    from wirekit.oip.grpc.convert import _typed_bytes

    raw = list(msg.raw_output_contents)
    outputs = []
    for i, out in enumerate(msg.outputs):
        shape = tuple(out.shape)
        data = raw[i] if raw else _typed_bytes(f"outputs[{i}]", out.datatype, shape, out.contents)
        outputs.append(
            Tensor(out.name, out.datatype, shape, data, parameters_from_grpc(out.parameters))
        )
    head = {
        "model_name": msg.model_name,
        "id": msg.id or None,
        "model_version": msg.model_version or None,
        "parameters": parameters_from_grpc(msg.parameters),
    }
    return head, outputs


def _describe(tensors: list[Any]) -> str:
    return ", ".join(
        f"{t.name} {t.datatype} {list(t.shape)} {bytes(t.data)[:48].hex()}" for t in tensors
    )


def check_echo(
    server: OipServer, answer: Answer, sent: list[dict[str, Any]], wanted: list[str] | None = None
) -> tuple[dict[str, Any], list[Any]]:
    """Fail unless ``answer`` is a well-formed inference answer whose outputs named like the
    inputs ``sent`` (or only ``wanted`` of them) equal them: name, datatype, shape, bytes."""
    head, outputs = server.outputs(answer)
    by_name = {t.name: t for t in outputs}
    for given in sent:
        if wanted is not None and given["name"] not in wanted:
            continue
        want = expected_tensor(given)
        got = by_name.get(want.name)
        if got is None:
            raise Failed(
                f"output {want.name!r}",
                f"outputs {_describe(outputs)}; {answer.text()}",
                answer.body,
            )
        if (got.datatype, tuple(got.shape), bytes(got.data)) != (
            want.datatype,
            tuple(want.shape),
            bytes(want.data),
        ):
            raise Failed(
                f"output {_describe([want])}", f"{_describe([got])}; {answer.text()}", answer.body
            )
    return head, outputs


def declined(answer: Answer) -> bool:
    """The server answered an error (it does not take what was sent)."""
    return answer.code != "OK" if answer.headers is None else answer.status >= 400


#: why the repository cases are REST only
_REPOSITORY_REST_ONLY = (
    "REST only (the repository extension's gRPC services differ from server to server: "
    "Triton's, KServe's and MLServer's protos are not the same)"
)


def rest_only(
    server: OipServer, why: str = "REST only (gRPC carries this in its own fields)"
) -> None:
    """Skip a case that exists over REST only."""
    if server.grpc:
        raise Skipped(why)


# --------------------------------------------------------------------------- health


@SUITE.case(
    "health.live",
    HEALTH,
    MUST,
    send="GET /v2/health/live (gRPC ServerLive)",
    expect="200 (gRPC: live true)",
)
def health_live(server: OipServer, deadline: Deadline) -> None:
    if server.grpc:
        answer = server.call("ServerLive", deadline)
        if answer.code != "OK" or not answer.message.live:
            raise Failed(
                "live: true", answer.text() if answer.code != "OK" else _brief(answer.message)
            )
        return
    answer = server.http("GET", "/v2/health/live", deadline)
    if answer.status != 200:
        raise Failed("HTTP 200", answer.text(), answer.body)


@SUITE.case(
    "health.ready",
    HEALTH,
    MUST,
    send="GET /v2/health/ready (gRPC ServerReady)",
    expect="200 (gRPC: ready true)",
)
def health_ready(server: OipServer, deadline: Deadline) -> None:
    if server.grpc:
        answer = server.call("ServerReady", deadline)
        if answer.code != "OK" or not answer.message.ready:
            raise Failed(
                "ready: true", answer.text() if answer.code != "OK" else _brief(answer.message)
            )
        return
    answer = server.http("GET", "/v2/health/ready", deadline)
    if answer.status != 200:
        raise Failed("HTTP 200", answer.text(), answer.body)


@SUITE.case(
    "ready.model",
    MODEL_READY,
    MUST,
    send="GET /v2/models/M/ready (gRPC ModelReady)",
    expect="200 (gRPC: ready true)",
)
def ready_model(server: OipServer, deadline: Deadline) -> None:
    name = server.model(deadline)
    if not server.model_ready(name, deadline):
        raise Failed(f"model {name!r} ready", "not ready")


@SUITE.case(
    "ready.unknown-model",
    MODEL_READY,
    MUST,
    send="GET /v2/models/UNKNOWN/ready (gRPC ModelReady)",
    expect="not ready: a 4xx status (gRPC: an error status or ready false)",
)
def ready_unknown_model(server: OipServer, deadline: Deadline) -> None:
    if server.grpc:
        answer = server.call("ModelReady", deadline, name=UNKNOWN_MODEL)
        if answer.code == "OK" and answer.message.ready:
            raise Failed("not ready", "ready: true")
        return
    answer = server.http("GET", f"/v2/models/{UNKNOWN_MODEL}/ready", deadline)
    if not 400 <= answer.status < 500:
        raise Failed("a 4xx status (false)", answer.text(), answer.body)


# --------------------------------------------------------------------------- metadata


@SUITE.case(
    "metadata.server",
    SERVER_METADATA,
    MUST,
    send="GET /v2 (gRPC ServerMetadata)",
    expect='200 and {"name": $string, "version": $string, "extensions": [$string...]}',
)
def metadata_server(server: OipServer, deadline: Deadline) -> None:
    if server.grpc:
        answer = server.call("ServerMetadata", deadline)
        if answer.code != "OK" or not answer.message.name:
            raise Failed(
                "a ServerMetadataResponse with a name",
                answer.text() if answer.code != "OK" else _brief(answer.message),
            )
        return
    answer = server.http("GET", "/v2", deadline)
    if answer.status != 200:
        raise Failed("HTTP 200", answer.text(), answer.body)
    doc = answer.json()
    problems = []
    if not isinstance(doc, dict):
        problems.append("not an object")
    else:
        for key in ("name", "version"):
            if not isinstance(doc.get(key), str):
                problems.append(f"{key!r} is not a string")
        ext = doc.get("extensions")
        if not isinstance(ext, list) or not all(isinstance(e, str) for e in ext):
            problems.append("'extensions' is not a list of strings")
    if problems:
        raise Failed(
            "$metadata_server_response", f"{'; '.join(problems)}: {answer.text()}", answer.body
        )


def _check_metadata_tensor(t: Any) -> str | None:
    from wirekit.oip import DATATYPES

    if not isinstance(t, dict) or not isinstance(t.get("name"), str):
        return f"{t!r} has no name"
    if t.get("datatype") not in DATATYPES:
        return f"{t.get('name')}: datatype {t.get('datatype')!r} is not one of the spec's"
    shape = t.get("shape")
    if not isinstance(shape, list) or not all(isinstance(d, int) and d >= -1 for d in shape):
        return f"{t.get('name')}: shape {shape!r} is not a list of integers (-1: variable)"
    return None


@SUITE.case(
    "metadata.model",
    MODEL_METADATA,
    MUST,
    send="GET /v2/models/M (gRPC ModelMetadata)",
    expect='200 and {"name": M, "platform": $string, "inputs": [...], "outputs": [...]}, '
    "each tensor {name, datatype, shape}",
)
def metadata_model(server: OipServer, deadline: Deadline) -> None:
    name = server.model(deadline)
    if server.grpc:
        answer = server.call("ModelMetadata", deadline, name=name)
        if answer.code != "OK":
            raise Failed("a ModelMetadataResponse", answer.text())
        m = answer.message
        doc: Any = {
            "name": m.name,
            "platform": m.platform,
            "inputs": [_grpc_tensor_meta(t) for t in m.inputs],
            "outputs": [_grpc_tensor_meta(t) for t in m.outputs],
        }
        shown = _brief(m)
    else:
        answer = server.http("GET", f"/v2/models/{name}", deadline)
        if answer.status != 200:
            raise Failed("HTTP 200", answer.text(), answer.body)
        doc = answer.json()
        shown = answer.text()
    problems = []
    if not isinstance(doc, dict):
        raise Failed("$metadata_model_response", shown, answer.body)
    if doc.get("name") != name:
        problems.append(f"name {doc.get('name')!r}")
    if not isinstance(doc.get("platform"), str):
        problems.append("no 'platform' string")
    for key in ("inputs", "outputs"):
        tensors = doc.get(key)
        if not isinstance(tensors, list):
            problems.append(f"no {key!r} list")
            continue
        problems += [p for p in map(_check_metadata_tensor, tensors) if p]
    if problems:
        raise Failed("$metadata_model_response", f"{'; '.join(problems)}: {shown}", answer.body)


@SUITE.case(
    "metadata.unknown-model",
    ERRORS,
    MUST,
    send="GET /v2/models/UNKNOWN (gRPC ModelMetadata)",
    expect='an HTTP error status and {"error": $string} (gRPC: an error status)',
)
def metadata_unknown_model(server: OipServer, deadline: Deadline) -> None:
    if server.grpc:
        _error_body(server.call("ModelMetadata", deadline, name=UNKNOWN_MODEL), "an error")
        return
    _error_body(server.http("GET", f"/v2/models/{UNKNOWN_MODEL}", deadline), "an error")


# --------------------------------------------------------------------------- inference


@SUITE.case(
    "infer.basic",
    INFERENCE,
    MUST,
    send="the model's first declared input (FP32 [1,4] when none), JSON data",
    expect='200, {"model_name": M, "outputs": [...]}: the output of that name equal to it',
)
def infer_basic(server: OipServer, deadline: Deadline) -> None:
    given = server.basic_input(deadline)
    answer = server.infer({"inputs": [given]}, deadline)
    head, _ = check_echo(server, answer, [given])
    if head["model_name"] != server.model(deadline):
        raise Failed(
            f"model_name {server.model(deadline)!r}", f"{head['model_name']!r}; {answer.text()}"
        )


@SUITE.case(
    "infer.id",
    INFERENCE,
    MUST,
    send='a request with "id": "conform-42"',
    expect='the answer\'s "id" is "conform-42" ("if specified this identifier must be '
    'returned in the response")',
)
def infer_id(server: OipServer, deadline: Deadline) -> None:
    answer = server.infer({"id": "conform-42", "inputs": [server.basic_input(deadline)]}, deadline)
    head, _ = server.outputs(answer)
    if head["id"] != "conform-42":
        raise Failed('"id": "conform-42"', f"{head['id']!r}; {answer.text()}", answer.body)


@SUITE.case(
    "infer.outputs.requested",
    INFERENCE,
    MUST,
    send='a request naming one output in "outputs"',
    expect='that output in the answer ("each requested output must be returned")',
)
def infer_outputs_requested(server: OipServer, deadline: Deadline) -> None:
    given = server.basic_input(deadline)
    doc = {"inputs": [given], "outputs": [{"name": given["name"]}]}
    check_echo(server, server.infer(doc, deadline), [given])


@SUITE.case(
    "infer.outputs.only-requested",
    INFERENCE,
    SHOULD,
    send='two inputs (an echo: two outputs), "outputs" naming the second',
    expect="only that output answered",
)
def infer_outputs_only_requested(server: OipServer, deadline: Deadline) -> None:
    _, datatype, _ = server.declared_input(deadline)
    if datatype is not None and len(server.metadata(deadline).get("inputs") or []) < 2:
        raise Skipped("the model declares one input: no second output to leave out")
    first = server.basic_input(deadline)
    second = tensor_doc("conform_second", "INT32", (3,))
    answer = server.infer(
        {"inputs": [first, second], "outputs": [{"name": "conform_second"}]}, deadline
    )
    if declined(answer):
        raise Skipped(f"the model does not take a second input: {answer.text()}")
    _, outputs = check_echo(server, answer, [second])
    names = [t.name for t in outputs]
    if names != ["conform_second"]:
        raise Failed("outputs ['conform_second']", f"{names}; {answer.text()}", answer.body)


@SUITE.case(
    "infer.parameters",
    PARAMETERS,
    SHOULD,
    send='"parameters" on the request and on its input ({"conform": "x", "n": 3, "b": true})',
    expect="the request answered as without them",
)
def infer_parameters(server: OipServer, deadline: Deadline) -> None:
    params = {"conform": "x", "n": 3, "b": True}
    given = {**server.basic_input(deadline), "parameters": dict(params)}
    answer = server.infer({"parameters": params, "inputs": [given]}, deadline)
    check_echo(server, answer, [given])


def _datatype_case(datatype: str) -> None:
    @SUITE.case(
        f"infer.datatype.{datatype}",
        TENSORS,
        MAY,
        send=f"one {datatype} input [2,3] (JSON data; gRPC raw contents)",
        expect="refused with an error (the model does not take it: skip), or echoed "
        "bit-exact (datatype, shape, elements)",
    )
    def case(server: OipServer, deadline: Deadline) -> None:
        name, declared, _ = server.declared_input(deadline)
        if declared is not None and declared != datatype:
            raise Skipped(f"the model's input {name!r} is declared {declared}")
        given = tensor_doc(name, datatype, (2, 3))
        answer = server.infer({"inputs": [given]}, deadline)
        if declined(answer):
            raise Skipped(f"the server does not take {datatype}: {answer.text()}")
        check_echo(server, answer, [given])


for _datatype in SAMPLES:
    _datatype_case(_datatype)


def _shape_case(label: str, shape: tuple[int, ...]) -> None:
    @SUITE.case(
        f"infer.shape.{label}",
        TENSORS,
        MAY,
        send=f"one FP32 input of shape {list(shape)}",
        expect="refused with an error (skip), or echoed with that shape and its elements",
    )
    def case(server: OipServer, deadline: Deadline) -> None:
        name, declared, _ = server.declared_input(deadline)
        if declared is not None and declared != "FP32":
            raise Skipped(f"the model's input {name!r} is declared {declared}")
        given = tensor_doc(name, "FP32", shape)
        answer = server.infer({"inputs": [given]}, deadline)
        if declined(answer):
            raise Skipped(f"the server does not take shape {list(shape)}: {answer.text()}")
        check_echo(server, answer, [given])


for _label, _shape in SHAPES.items():
    _shape_case(_label, _shape)


# --------------------------------------------------------------------------- errors


@SUITE.case(
    "error.unknown-model",
    ERRORS,
    MUST,
    send="an inference request to an unknown model",
    expect='an HTTP error status and {"error": $string} (gRPC: an error status)',
)
def error_unknown_model(server: OipServer, deadline: Deadline) -> None:
    given = tensor_doc("input0", "FP32", (1, 4))
    _error_body(server.infer({"inputs": [given]}, deadline, model=UNKNOWN_MODEL), "an error")


def _bad_datatype(server: OipServer, deadline: Deadline) -> Answer:
    """An input whose datatype is "FLOAT32" (not one of the spec's), answered."""
    name, _, _ = server.declared_input(deadline)
    return _bad_input(server, deadline, name, "FLOAT32", [1, 4], [1.0, 2.0, 3.0, 4.0])


def _bad_shape(server: OipServer, deadline: Deadline) -> Answer:
    """An FP32 input of shape [2,4] holding 4 elements, answered."""
    name, _, _ = server.declared_input(deadline)
    return _bad_input(server, deadline, name, "FP32", [2, 4], [1.0, 2.0, 3.0, 4.0])


def _bad_input(
    server: OipServer,
    deadline: Deadline,
    name: str,
    datatype: str,
    shape: list[int],
    data: list[float],
) -> Answer:
    if server.grpc:
        from wirekit.oip.grpc import message_class

        msg = message_class("ModelInferRequest")(model_name=server.model(deadline))
        tensor = msg.inputs.add(name=name, datatype=datatype)
        tensor.shape.extend(shape)
        msg.raw_input_contents.append(struct.pack(f"<{len(data)}f", *data))
        return server.call("ModelInfer", deadline, request=msg)
    doc = {"name": name, "datatype": datatype, "shape": shape, "data": data}
    return server.infer({"inputs": [doc]}, deadline)


def _refusal_form(answer: Answer, refused_case: str) -> None:
    """The refusal of an invalid request is a failed inference: its form is the spec's
    MUST.  A server that answers the request instead is judged by ``refused_case``."""
    if not declined(answer):
        raise Skipped(f"the server answered it (see {refused_case}): {answer.text()}")
    _error_body(answer, "an error")


def _refused(answer: Answer) -> None:
    if not declined(answer):
        raise Failed("the request refused (an error status)", answer.text(), answer.body)


@SUITE.case(
    "error.datatype",
    ERRORS,
    MUST,
    send='an input whose "datatype" is "FLOAT32" (not one of the spec\'s datatypes)',
    expect='if refused: an HTTP error status and {"error": $string} (gRPC: an error '
    "status); answered: skip (error.datatype-refused)",
)
def error_datatype(server: OipServer, deadline: Deadline) -> None:
    _refusal_form(_bad_datatype(server, deadline), "error.datatype-refused")


@SUITE.case(
    "error.datatype-refused",
    TENSORS,
    SHOULD,
    send='an input whose "datatype" is "FLOAT32"',
    expect="refused (the spec lists the datatypes; it does not say in so many words "
    "that a server must refuse another)",
)
def error_datatype_refused(server: OipServer, deadline: Deadline) -> None:
    _refused(_bad_datatype(server, deadline))


@SUITE.case(
    "error.shape",
    ERRORS,
    MUST,
    send="an input of shape [2,4] with 4 elements (gRPC: 16 raw bytes)",
    expect='if refused: an HTTP error status and {"error": $string} (gRPC: an error '
    "status); answered: skip (error.shape-refused)",
)
def error_shape(server: OipServer, deadline: Deadline) -> None:
    _refusal_form(_bad_shape(server, deadline), "error.shape-refused")


@SUITE.case(
    "error.shape-refused",
    TENSORS,
    SHOULD,
    send="an input of shape [2,4] with 4 elements",
    expect='refused ("the shape and data must represent the full shape and contents": '
    "a rule for the request; the spec does not say a server must refuse one that breaks it)",
)
def error_shape_refused(server: OipServer, deadline: Deadline) -> None:
    _refused(_bad_shape(server, deadline))


@SUITE.case(
    "error.malformed-json",
    ERRORS,
    MUST,
    send='a body that is not JSON ({"inputs": [)',
    expect='an HTTP error status and {"error": $string}',
)
def error_malformed_json(server: OipServer, deadline: Deadline) -> None:
    rest_only(server, "REST only (a gRPC request is a protobuf message, not JSON)")
    _error_body(server.infer({}, deadline, body=b'{"inputs": ['), "an error")


# --------------------------------------------------------------------------- binary data extension


def _binary_body(doc: dict[str, Any], tensors: list[bytes]) -> tuple[bytes, int]:
    head = json.dumps(doc).encode()
    return head + b"".join(tensors), len(head)


@SUITE.case(
    "binary.request",
    BINARY,
    MAY,
    send="the basic input as binary data (binary_data_size, Inference-Header-Content-Length)",
    expect="refused with an error (no extension: skip), or the same answer as in JSON",
)
def binary_request(server: OipServer, deadline: Deadline) -> None:
    rest_only(server)
    given = server.basic_input(deadline)
    raw = bytes(expected_tensor(given).data)
    head = {k: v for k, v in given.items() if k != "data"}
    head["parameters"] = {"binary_data_size": len(raw)}
    body, length = _binary_body({"inputs": [head]}, [raw])
    answer = server.infer(
        {},
        deadline,
        body=body,
        headers={HEADER: str(length), "Content-Type": "application/octet-stream"},
    )
    if declined(answer):
        raise Skipped(f"the server does not take binary inputs: {answer.text()}")
    check_echo(server, answer, [given])


@SUITE.case(
    "binary.output",
    BINARY,
    MAY,
    send='a JSON request whose requested output has "binary_data": true',
    expect="no extension: a JSON answer (skip); else Inference-Header-Content-Length "
    "and the output's bytes after the JSON (binary_data_size)",
)
def binary_output(server: OipServer, deadline: Deadline) -> None:
    rest_only(server)
    given = server.basic_input(deadline)
    doc = {
        "inputs": [given],
        "outputs": [{"name": given["name"], "parameters": {"binary_data": True}}],
    }
    answer = server.infer(doc, deadline)
    if answer.status == 200 and answer.header(HEADER) is None:
        raise Skipped(f"the server answers JSON (no binary outputs): {answer.text()}")
    check_echo(server, answer, [given])
    entry = _json_entry(answer, given["name"])
    size = (entry.get("parameters") or {}).get("binary_data_size")
    if not isinstance(size, int) or "data" in entry:
        raise Failed("the output's binary_data_size and no data", answer.text(), answer.body)


def _json_entry(answer: Answer, name: str) -> dict[str, Any]:
    doc = answer.json()
    for entry in doc.get("outputs", []) if isinstance(doc, dict) else []:
        if isinstance(entry, dict) and entry.get("name") == name:
            return entry
    raise Failed(f"output {name!r} in the JSON", answer.text(), answer.body)


@SUITE.case(
    "binary.output-per-output",
    BINARY,
    MAY,
    send='two inputs; outputs: the first "binary_data": true, the second false',
    expect="the first output binary, the second JSON data",
)
def binary_output_per_output(server: OipServer, deadline: Deadline) -> None:
    rest_only(server)
    first = server.basic_input(deadline)
    second = tensor_doc("conform_second", "INT32", (3,))
    doc = {
        "inputs": [first, second],
        "outputs": [
            {"name": first["name"], "parameters": {"binary_data": True}},
            {"name": "conform_second", "parameters": {"binary_data": False}},
        ],
    }
    answer = server.infer(doc, deadline)
    if declined(answer):
        raise Skipped(f"the model does not take a second input: {answer.text()}")
    if answer.header(HEADER) is None:
        raise Skipped(f"the server answers JSON (no binary outputs): {answer.text()}")
    check_echo(server, answer, [first, second])
    one, two = _json_entry(answer, first["name"]), _json_entry(answer, "conform_second")
    if "data" in one or "data" not in two:
        raise Failed(f"{first['name']} binary, conform_second JSON", answer.text(), answer.body)


# --------------------------------------------------------------------------- repository extension


def _repository(server: OipServer, deadline: Deadline, path: str) -> Answer:
    rest_only(server, _REPOSITORY_REST_ONLY)
    answer = server.http("POST", path, deadline, b"{}")
    if answer.status in (404, 405, 501):
        raise Skipped(
            f"the server does not offer the repository extension: POST {path}: {answer.text()}"
        )
    return answer


@SUITE.case(
    "repository.index",
    REPOSITORY,
    MAY,
    send="POST /v2/repository/index",
    expect='no extension: 404 (skip); else 200 and [{"name": $string, ...}...] naming M',
)
def repository_index(server: OipServer, deadline: Deadline) -> None:
    answer = _repository(server, deadline, "/v2/repository/index")
    if answer.status != 200:
        raise Failed("HTTP 200", answer.text(), answer.body)
    doc = answer.json()
    names = [e.get("name") for e in doc if isinstance(e, dict)] if isinstance(doc, list) else None
    if names is None or server.model(deadline) not in names:
        raise Failed(
            f"a list of models naming {server.model(deadline)!r}", answer.text(), answer.body
        )


@SUITE.case(
    "repository.load-unknown",
    REPOSITORY,
    MAY,
    send="POST /v2/repository/models/UNKNOWN/load",
    expect='no extension: skip; else an HTTP error status and {"error": $string}',
)
def repository_load_unknown(server: OipServer, deadline: Deadline) -> None:
    rest_only(server, _REPOSITORY_REST_ONLY)
    answer = server.http("POST", f"/v2/repository/models/{UNKNOWN_MODEL}/load", deadline, b"{}")
    index = server.http("POST", "/v2/repository/index", deadline, b"{}")
    if answer.status in (404, 405, 501) and index.status in (404, 405, 501):
        raise Skipped(f"the server does not offer the repository extension: {answer.text()}")
    _error_body(answer, "an error")


@SUITE.case(
    "repository.unload-load",
    REPOSITORY,
    MAY,
    send="(with --unload) POST /v2/repository/models/M/unload, then .../load",
    expect="no extension: skip; else 200 each; M not ready after the unload, ready "
    "again within --load-timeout of the load",
)
def repository_unload_load(server: OipServer, deadline: Deadline) -> None:
    rest_only(server, _REPOSITORY_REST_ONLY)
    if not server.unload:
        raise Skipped("give --unload to have the model under test unloaded and loaded again")
    name = server.model(deadline)
    answer = _repository(server, deadline, f"/v2/repository/models/{name}/unload")
    if answer.status != 200:
        raise Failed("the unload answered 200", answer.text(), answer.body)
    still = server.http("GET", f"/v2/models/{name}/ready", deadline)
    load = server.http("POST", f"/v2/repository/models/{name}/load", deadline, b"{}")
    if load.status != 200:
        raise Failed("the load answered 200", load.text(), load.body)
    while not server.model_ready(name, deadline):
        if deadline.passed:
            raise Failed(f"{name!r} ready again after the load", "not ready")
        time.sleep(0.1)
    if still.status == 200:
        raise Failed(f"{name!r} not ready after the unload", still.text(), still.body)


# --------------------------------------------------------------------------- the command


def server_address(text: str) -> tuple[str, int]:
    """TARGET: ``http://HOST:PORT``, ``HOST:PORT`` or ``tcp://HOST:PORT`` -> (host, port)."""
    rest = text
    for scheme in ("http://", "tcp://", "grpc://"):
        if rest.startswith(scheme):
            rest = rest[len(scheme) :]
    rest = rest.rstrip("/")
    host, sep, port = rest.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"expected http://HOST:PORT or HOST:PORT, got {text!r}")
    return host, int(port)


def add_arguments(options: SuiteOptions) -> None:
    """TARGET (http://HOST:PORT), ``--grpc``, ``--model``, ``--load-timeout``."""
    options.target(server_address, note="oip server: http://HOST:PORT or HOST:PORT")
    options.add_argument(
        "--grpc",
        action="store_true",
        help="oip server: TARGET is the gRPC port; run the cases over gRPC",
    )
    options.add_argument(
        "--model",
        action="append",
        default=[],
        metavar="NAME",
        help="oip server: the model to test (an echo: outputs = inputs); "
        "repeatable, the first ready one is used (default: the first READY "
        "model of the server's repository index)",
    )
    options.add_argument(
        "--unload",
        action="store_true",
        help="oip server: let repository.unload-load unload the model under "
        "test and load it again (without: that case skips)",
    )
    options.add_argument(
        "--load-timeout",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="oip server: the time a model may take to load again in the "
        "repository cases, on top of --case-timeout (default 30)",
    )


def check_arguments(args: argparse.Namespace) -> str | None:
    if not args.target:
        return "oip server: give the server's address: http://HOST:PORT (gRPC: HOST:PORT --grpc)"
    if args.load_timeout <= 0:
        return "oip server: --load-timeout must be positive"
    return None


@contextlib.contextmanager
def open_target(args: argparse.Namespace) -> Iterator[OipServer]:
    server = OipServer(
        args.target,
        grpc=args.grpc,
        models=list(args.model),
        load_timeout=args.load_timeout,
        unload=args.unload,
    )
    try:
        yield server
    finally:
        server.close()
