"""The OIP gRPC door of ``wirekit serve`` (``inference.GRPCInferenceService``, issue 36).

The real clients from PyPI, unchanged -- ``tritonclient.grpc`` and kserve's
``InferenceGRPCClient`` -- against a running ``wirekit serve --with-backends`` process on
loopback (wirekit's MIP echo backends), on each event loop the service supports: every OIP
datatype round-trips bit-exact, readiness and metadata say what the config says, and each
bad input gets its clear error (a regression test each).  The clients run in processes of
their own (tests/oip_grpc_clients.py: the two register the same protobuf names).  Hostile
messages no client would send go over a bare gRPC channel with wirekit's own message
classes.  Run on both twins (``WIREKIT_PURE=1`` too: the served process inherits it).
"""

from __future__ import annotations

import importlib.util
import json
import socket
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from google.protobuf.message import DecodeError as ProtobufDecodeError
from support.loops import LOOPS
from support.ports import free_port
from support.process import TESTS, ServerProcess, env_with

from wirekit.cli import EXIT_BAD_INPUT
from wirekit.errors import DecodeError
from wirekit.oip.grpc import messages as pb
from wirekit.oip.grpc.convert import (
    TYPED_CONTENTS,
    encode_response,
    parameters_from_grpc,
    parameters_to_grpc,
    request_from_grpc,
    response_to_grpc,
    split_raw_inputs,
)
from wirekit.oip.messages import DATATYPES, Tensor
from wirekit.serve.config import ConfigError, Deployment, GrpcLimits, parse_config

grpc = pytest.importorskip("grpc")

#: bound on one client script's run, seconds
CLIENT_TIMEOUT = 120.0
#: the 14 OIP datatypes
ALL_DATATYPES = list(DATATYPES)
MIB = 1024 * 1024


def deployment(store: Path, port: int, refusing_port: int = 0) -> dict[str, Any]:
    """The deployment tests/oip_grpc_clients.py expects: ``echo`` (nothing declared),
    ``rows`` (the ``rows`` rule), ``typed`` (declared tensors, versions, platform), each on
    wirekit's MIP echo handler (one backend process on ``port``), and ``refusing``, whose
    MIP model answers an OIP error (on ``refusing_port``); gRPC messages up to 4 MiB, a
    memory budget of 2 MiB."""
    return {
        "listen": {"http_port": 0, "grpc_port": 0},
        "store": {"path": str(store)},
        "memory_budget": 2 * MIB,
        "mip": {"max_message_size": MIB},
        "grpc": {"max_message_size": 4 * MIB},
        "models": {
            "echo": {},
            "rows": {"tensors": "rows"},
            "typed": {
                "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 2]}],
                "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, 2]}],
                "versions": [1, 2],
                "platform": "wirekit-test",
            },
            "refusing": {"handler": "oip_grpc_handlers:refuse_all"},
        },
        "nodes": [
            {
                "id": "n",
                "devices": ["CPU"],
                "models": ["echo", "rows", "typed"],
                "quotas": [0.3, 0.3, 0.3],
                "ports": [port, port, port],
            },
            {
                "id": "r",
                "devices": ["CPU"],
                "models": ["refusing"],
                "quotas": [1],
                "ports": [refusing_port or port + 1],
            },
        ],
    }


class Served:
    """A running ``wirekit serve`` process: its ready line and its gRPC address."""

    def __init__(self, proc: ServerProcess, ready: dict[str, Any]) -> None:
        self.proc = proc
        self.ready = ready
        self.address = f"127.0.0.1:{ready['grpc']}"


@pytest.fixture(scope="module", params=LOOPS)
def served(request: pytest.FixtureRequest) -> Iterator[Served]:
    """``wirekit serve --with-backends`` on the event loop of the parameter, gRPC door on."""
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "d.json"
        config.write_text(json.dumps(deployment(Path(tmp) / "r.db", free_port(), free_port())))
        argv = [sys.executable, "-m", "wirekit", "serve", "--config", str(config),
                "--with-backends", "--loop", request.param]  # fmt: skip
        with ServerProcess(argv, ready=None, cwd=Path(tmp)) as proc:
            ready = json.loads(proc.first_line) if proc.first_line else {}
            assert ready.get("event") == "ready", proc.log
            assert isinstance(ready["grpc"], int) and ready["grpc"] > 0
            yield Served(proc, ready)
            assert proc.stop() == 0, proc.log


def run_client(which: str, address: str) -> dict[str, Any]:
    """What the client ``which`` (triton, kserve) saw of the service at ``address``."""
    done = subprocess.run(
        [sys.executable, str(TESTS / "oip_grpc_clients.py"), which, address],
        capture_output=True,
        text=True,
        timeout=CLIENT_TIMEOUT,
        env=env_with(),
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def triton(served: Served) -> dict[str, Any]:
    """What tritonclient.grpc saw (one run per served process)."""
    return run_client("triton", served.address)


# --------------------------------------------------------------------------- real clients


def test_triton_health_and_metadata_say_what_the_config_says(triton):
    assert triton["live"] is True
    assert triton["ready"] is True
    assert triton["model_ready"] is True
    assert triton["model_ready_v2"] is True
    import wirekit

    assert triton["server_metadata"] == {
        "name": "wirekit",
        "version": wirekit.__version__,
        "extensions": ["binary_tensor_data"],
    }
    assert triton["model_metadata"] == {  # int64 shapes are strings in protobuf's JSON
        "name": "typed",
        "versions": ["1", "2"],
        "platform": "wirekit-test",
        "inputs": [{"name": "x", "datatype": "FP32", "shape": ["-1", "2"]}],
        "outputs": [{"name": "y", "datatype": "FP32", "shape": ["-1", "2"]}],
    }


@pytest.mark.parametrize("model", ["echo", "rows"])
@pytest.mark.parametrize("datatype", ALL_DATATYPES)
def test_triton_every_datatype_round_trips_bit_exact(triton, model, datatype):
    # one request of the 14 tensors (shape [2, 3] each); the echo answers them back
    seen = triton[f"infer_{model}"]
    assert list(seen["outputs"]) == ALL_DATATYPES  # all of them, in the request's order
    assert seen["outputs"][datatype] == {
        "datatype": datatype,
        "shape": [2, 3],
        "bytes_equal": True,
        "numpy_equal": True,
    }


@pytest.mark.parametrize("model", ["echo", "rows"])
def test_triton_request_id_parameters_and_version_come_back(triton, model):
    seen = triton[f"infer_{model}"]
    assert (seen["id"], seen["model_name"], seen["model_version"]) == (f"{model}-1", model, "1")
    assert seen["parameters"] == {"p": 7, "q": "s"}  # the echo answers the request's
    assert triton["versioned"] == "2"  # a version asked for is the version answered


def test_triton_outputs_asked_for_are_the_outputs_answered(triton):
    assert triton["selected"] == ["INT8"]


def test_kserve_grpc_v2_client(served):
    seen = run_client("kserve", served.address)
    assert (seen["live"], seen["ready"], seen["model_ready"]) == (True, True, True)
    assert seen["typed"] == {
        "id": "k-1",
        "name": "x",
        "datatype": "FP32",
        "shape": [2, 2],
        "equal": True,
    }
    assert seen["bytes"] == ["ab", "c"]


# --------------------------------------------------------------------------- bad input


def _refusal(triton: dict[str, Any], case: str) -> list[str]:
    assert triton["after"] == [[1.0, 2.0]]  # the service still answers after all of them
    return triton["refusals"][case]


def test_wrong_datatype_is_invalid_argument_naming_the_tensor(triton):
    assert _refusal(triton, "wrong_datatype") == [
        "StatusCode.INVALID_ARGUMENT",
        "input 'x': expected datatype FP32, got INT32",
    ]


def test_wrong_shape_is_invalid_argument_naming_the_tensor(triton):
    assert _refusal(triton, "wrong_shape") == [
        "StatusCode.INVALID_ARGUMENT",
        "input 'x': expected shape [-1, 2], got [1, 3]",
    ]


def test_an_input_the_model_does_not_declare_is_invalid_argument(triton):
    assert _refusal(triton, "wrong_name") == [
        "StatusCode.INVALID_ARGUMENT",
        "unknown input 'w' (the model's inputs: x)",
    ]


def test_unknown_model_and_version_are_not_found(triton):
    assert _refusal(triton, "unknown_model") == ["StatusCode.NOT_FOUND", "unknown model 'nope'"]
    unknown_version = [
        "StatusCode.NOT_FOUND",
        "unknown version '9' of model 'typed' (its versions: 1, 2)",
    ]
    assert _refusal(triton, "unknown_version") == unknown_version
    assert triton["model_metadata_unknown_version"] == unknown_version
    assert triton["model_ready_unknown"] == ["StatusCode.NOT_FOUND", "unknown model 'nope'"]


def test_an_unknown_output_asked_for_is_invalid_argument(triton):
    assert _refusal(triton, "unknown_output") == [
        "StatusCode.INVALID_ARGUMENT",
        'outputs[0].name: unknown output "nothing"',
    ]


def test_a_tensor_larger_than_the_message_limit_is_resource_exhausted(triton):
    code, message = _refusal(triton, "too_large")
    assert code == "StatusCode.RESOURCE_EXHAUSTED"
    assert "larger than max" in message and "4194304" in message  # grpc.max_message_size


def test_a_tensor_over_the_memory_budget_is_resource_exhausted(triton):
    assert _refusal(triton, "over_budget") == [
        "StatusCode.RESOURCE_EXHAUSTED",
        "the request would take 3145755 bytes: over the process's memory budget of 2097152 bytes",
    ]


def _infer(served: Served, request: Any) -> Any:
    """ModelInfer over a bare channel: the response, or the RpcError it raised."""
    with grpc.insecure_channel(served.address) as channel:
        call = channel.unary_unary(
            f"/{pb.SERVICE}/ModelInfer",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=pb.ModelInferResponse.FromString,
        )
        try:
            return call(request, timeout=30)
        except grpc.RpcError as exc:
            return exc


def test_raw_contents_not_matching_the_shape_are_invalid_argument(served):
    request = pb.ModelInferRequest(model_name="echo")
    request.inputs.add(name="x", datatype="FP32", shape=[1, 2])
    request.raw_input_contents.append(b"\0" * 12)
    refused = _infer(served, request)
    assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (
        refused.details()
        == 'inputs[0].data: tensor "x": 12 bytes of data, shape [1, 2] of FP32 needs 8'
    )


def test_raw_contents_not_one_per_input_are_invalid_argument(served):
    request = pb.ModelInferRequest(model_name="echo")
    request.inputs.add(name="x", datatype="FP32", shape=[1])
    request.inputs.add(name="y", datatype="FP32", shape=[1])
    request.raw_input_contents.append(b"\0" * 4)
    refused = _infer(served, request)
    assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert refused.details() == (
        "raw_input_contents: 1 raw contents for 2 inputs: give one per input, in order"
    )


def test_bytes_framing_that_lies_is_invalid_argument(served):
    request = pb.ModelInferRequest(model_name="echo")
    request.inputs.add(name="s", datatype="BYTES", shape=[1])
    request.raw_input_contents.append(b"\x09\0\0\0abc")  # says 9 bytes, has 3
    refused = _infer(served, request)
    assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "s" in refused.details() and refused.details().startswith("inputs[0]")


def test_a_message_that_is_not_a_request_is_invalid_argument(served):
    with grpc.insecure_channel(served.address) as channel:
        call = channel.unary_unary(f"/{pb.SERVICE}/ModelInfer")
        with pytest.raises(grpc.RpcError) as refused:
            call(b"\xff\xff\xff", timeout=30)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert refused.value.details().startswith("not a ModelInferRequest")


def test_typed_contents_are_served_as_raw_output_contents(served):
    request = pb.ModelInferRequest(model_name="echo", id="t-1")
    tensor = request.inputs.add(name="i", datatype="INT16", shape=[3])
    tensor.contents.int_contents.extend([1, -2, 32767])
    words = request.inputs.add(name="s", datatype="BYTES", shape=[2])
    words.contents.bytes_contents.extend([b"ab", b""])
    answer = _infer(served, request)
    assert answer.id == "t-1"
    assert [(o.name, o.datatype, list(o.shape)) for o in answer.outputs] == [
        ("i", "INT16", [3]),
        ("s", "BYTES", [2]),
    ]
    assert list(answer.raw_output_contents) == [
        np.array([1, -2, 32767], "<i2").tobytes(),
        b"\x02\0\0\0ab\0\0\0\0",
    ]


def test_typed_contents_out_of_their_datatype_are_invalid_argument(served):
    request = pb.ModelInferRequest(model_name="echo")
    tensor = request.inputs.add(name="i", datatype="INT8", shape=[2])
    tensor.contents.int_contents.extend([1, 300])
    refused = _infer(served, request)
    assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert refused.details() == "inputs[0].contents.int_contents: a value does not fit INT8"


def test_an_oip_error_the_model_answers_is_internal_with_its_message(served):
    from oip_grpc_handlers import REFUSAL

    request = pb.ModelInferRequest(model_name="refusing")
    request.inputs.add(name="x", datatype="INT8", shape=[1]).contents.int_contents.append(1)
    refused = _infer(served, request)
    assert refused.code() == grpc.StatusCode.INTERNAL
    assert refused.details() == REFUSAL


def test_other_methods_of_the_service_are_unimplemented(served):
    with grpc.insecure_channel(served.address) as channel:
        for method in ("RepositoryIndex", "ModelStreamInfer", "ModelConfig"):
            call = channel.unary_unary(f"/{pb.SERVICE}/{method}")
            with pytest.raises(grpc.RpcError) as refused:
                call(b"", timeout=30)
            assert refused.value.code() == grpc.StatusCode.UNIMPLEMENTED


# --------------------------------------------------------------------------- the messages


@pytest.mark.skipif(
    importlib.util.find_spec("grpc_tools") is None, reason="grpcio-tools is not installed"
)
def test_oip_proto_is_the_descriptors_wirekit_builds(tmp_path):
    from google.protobuf import descriptor_pb2
    from grpc_tools import protoc

    folder = Path(pb.__file__).parent
    out = tmp_path / "oip.pb"
    assert protoc.main(["protoc", f"-I{folder}", f"--descriptor_set_out={out}", "oip.proto"]) == 0
    (compiled,) = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file

    def comparable(fd: Any) -> Any:
        fd = descriptor_pb2.FileDescriptorProto.FromString(fd.SerializeToString())
        fd.name = "oip.proto"

        def drop_json_names(msg: Any) -> None:  # protoc fills them in; they are derived
            for field in msg.field:
                field.ClearField("json_name")
            for nested in msg.nested_type:
                drop_json_names(nested)

        for msg in fd.message_type:
            drop_json_names(msg)
        return fd

    assert comparable(compiled) == comparable(pb.file_descriptor())


def test_the_messages_live_in_a_pool_of_their_own():
    from google.protobuf import descriptor_pool

    assert pb.ModelInferRequest.DESCRIPTOR.full_name == "inference.ModelInferRequest"
    assert pb.ModelInferRequest.DESCRIPTOR.file.pool is pb.POOL
    with pytest.raises(KeyError):  # nothing of wirekit's in the default pool
        descriptor_pool.Default().FindFileByName(pb.FILE_NAME)


@pytest.mark.parametrize("datatype", [d for d in ALL_DATATYPES if d in TYPED_CONTENTS])
def test_typed_contents_give_the_raw_bytes_of_their_datatype(datatype):
    field, _ = TYPED_CONTENTS[datatype]
    numpy_type = DATATYPES[datatype].numpy
    values: list[Any]
    if datatype == "BYTES":
        values, raw = [b"a", b"", b"xyz"], b"\1\0\0\0a\0\0\0\0\3\0\0\0xyz"
    elif datatype == "BOOL":
        values, raw = [True, False, True], b"\1\0\1"
    elif datatype.startswith("FP"):
        values = [1.5, -0.0, float("inf")]
        raw = np.array(values, numpy_type).tobytes()
    else:
        info = np.iinfo(np.dtype(numpy_type))
        values = [int(info.min), 0, int(info.max)]
        raw = np.array(values, numpy_type).tobytes()
    request = pb.ModelInferRequest()
    tensor = request.inputs.add(name="t", datatype=datatype, shape=[3])
    getattr(tensor.contents, field).extend(values)
    (made,) = request_from_grpc(request).inputs
    assert (made.name, made.datatype, made.shape, bytes(made.data)) == ("t", datatype, (3,), raw)


def test_fp16_has_no_typed_contents():
    request = pb.ModelInferRequest()
    tensor = request.inputs.add(name="h", datatype="FP16", shape=[1])
    for fill in (lambda: None, lambda: tensor.contents.fp32_contents.append(1.0)):
        fill()
        with pytest.raises(DecodeError) as refused:
            request_from_grpc(request)
        assert (refused.value.field, refused.value.reason) == (
            "inputs[0].contents",
            "FP16 has no typed contents: send it in raw_input_contents",
        )


def test_typed_contents_of_the_wrong_count_or_field_are_refused():
    request = pb.ModelInferRequest()
    tensor = request.inputs.add(name="i", datatype="INT32", shape=[2, 2])
    tensor.contents.int_contents.extend([1, 2, 3])
    with pytest.raises(DecodeError) as refused:
        request_from_grpc(request)
    assert refused.value.reason == "3 values for shape [2, 2] (4 elements)"
    tensor.contents.int_contents.append(4)
    tensor.contents.fp32_contents.append(1.0)
    with pytest.raises(DecodeError) as refused:
        request_from_grpc(request)
    assert refused.value.field == "inputs[0].contents.fp32_contents"


def test_raw_and_typed_contents_together_are_refused():
    request = pb.ModelInferRequest()
    tensor = request.inputs.add(name="i", datatype="INT32", shape=[1])
    tensor.contents.int_contents.append(1)
    request.raw_input_contents.append(b"\1\0\0\0")
    with pytest.raises(DecodeError) as refused:
        request_from_grpc(request)
    assert refused.value.reason == "contents and raw_input_contents given: give one"


def test_parameters_of_every_kind_round_trip():
    doc = {"b": True, "i": -3, "u": 2**64 - 1, "f": 0.25, "s": "x", "n": None}
    request = pb.ModelInferRequest()
    parameters_to_grpc(doc, request.parameters)
    again = pb.ModelInferRequest.FromString(request.SerializeToString())
    assert parameters_from_grpc(again.parameters) == doc
    assert again.parameters["u"].WhichOneof("parameter_choice") == "uint64_param"
    parameters_to_grpc({"j": [1, {"a": 2}]}, request.parameters)  # JSON from another door
    assert request.parameters["j"].string_param == '[1,{"a":2}]'


# --------------------------------------------------------------------------- the config


def test_the_grpc_door_is_off_unless_configured():
    doc = deployment(Path("r.db"), 9100)
    del doc["listen"]["grpc_port"], doc["grpc"]
    dep = parse_config(doc)
    assert dep.grpc_port is None and Deployment().grpc_port is None
    assert dep.grpc == GrpcLimits() == GrpcLimits(64 * MIB, 512)


def test_the_grpc_port_cannot_be_another_listener_s():
    doc = deployment(Path("r.db"), 9100)
    doc["listen"] = {"http_port": 9200, "grpc_port": 9200}
    with pytest.raises(ConfigError) as refused:
        parse_config(doc)
    assert str(refused.value) == "listen.grpc_port: port 9200 is also listen.http_port"
    doc["listen"] = {"http_port": 9200, "grpc_port": 9100}  # the backend's port: no clash
    assert parse_config(doc).grpc_port == 9100


def test_the_grpc_table_is_checked():
    doc = deployment(Path("r.db"), 9100)
    doc["grpc"] = {"max_in_flight": 0}
    with pytest.raises(ConfigError) as refused:
        parse_config(doc)
    assert refused.value.where == "grpc.max_in_flight"


def test_grpc_requests_are_recorded_on_the_oip_grpc_door(served, triton):
    # the dispatcher records and counts what the door submits, under door="oip-grpc"
    url = f"http://127.0.0.1:{served.ready['http']}/metrics"
    with urllib.request.urlopen(url, timeout=30) as answer:
        text = answer.read().decode()
    finished = [
        line
        for line in text.splitlines()
        if line.startswith("wirekit_serve_requests_total{")
        and 'door="oip-grpc"' in line
        and 'model="echo"' in line
        and 'state="ok"' in line
    ]
    assert finished, text
    assert float(finished[0].rsplit(" ", 1)[1]) >= 3  # the datatypes, selection, typed...


def test_the_response_written_by_hand_is_the_message_protobuf_writes():
    outputs = [
        Tensor("a", "FP32", (2,), memoryview(b"\0\0\x80?\0\0\0@")),
        Tensor("e", "UINT8", (0,), b""),
        Tensor("big", "UINT8", (300_000,), bytes(range(256)) * 1171 + b"\1" * 224, {"k": 1}),
    ]
    args = ("m", "3", "id-1", outputs, {"p": "q"})
    wire = encode_response(pb.ModelInferResponse, *args)
    assert wire == response_to_grpc(pb.ModelInferResponse, *args).SerializeToString()
    parsed = pb.ModelInferResponse.FromString(wire)
    assert list(parsed.raw_output_contents) == [bytes(t.data) for t in outputs]


def _request_with_raw_contents() -> Any:
    request = pb.ModelInferRequest(model_name="m", model_version="2", id="r")
    parameters_to_grpc({"p": 1.5, "s": "x"}, request.parameters)
    for name, size in (("a", 0), ("b", 5), ("c", 200), ("d", 70_000)):
        request.inputs.add(name=name, datatype="UINT8", shape=[size])
        request.raw_input_contents.append(bytes([len(name)]) * size)
    request.outputs.add(name="b")
    return request


def test_raw_inputs_are_split_from_the_message_without_a_copy():
    request = _request_with_raw_contents()
    body = request.SerializeToString()
    head, raw = split_raw_inputs(body)
    assert [bytes(r) for r in raw] == list(request.raw_input_contents)
    assert all(r.obj is body for r in raw)  # views into the body
    parsed = pb.ModelInferRequest.FromString(head)
    assert not parsed.raw_input_contents
    parsed.raw_input_contents.extend(bytes(r) for r in raw)
    assert parsed == request


def test_a_cut_message_is_refused_with_its_offset_or_parsed_the_same():
    body = _request_with_raw_contents().SerializeToString()
    for end in [*range(0, 200), *range(len(body) - 100, len(body))]:
        cut = body[:end]
        try:
            head, raw = split_raw_inputs(cut)
        except DecodeError as exc:
            assert 0 <= exc.offset <= end
            continue
        try:
            parsed = pb.ModelInferRequest.FromString(head)
        except ProtobufDecodeError:
            continue
        try:
            whole = pb.ModelInferRequest.FromString(cut)
        except ProtobufDecodeError:  # the split found every field whole: so must protobuf
            raise AssertionError(end) from None
        parsed.raw_input_contents.extend(bytes(r) for r in raw)
        assert parsed == whole


def test_a_grpc_port_in_use_stops_the_service_saying_so(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        doc = deployment(tmp_path / "r.db", free_port(), free_port())
        doc["listen"]["grpc_port"] = port
        config = tmp_path / "d.json"
        config.write_text(json.dumps(doc))
        done = subprocess.run(
            [sys.executable, "-m", "wirekit", "serve", "--config", str(config)],
            capture_output=True,
            text=True,
            timeout=CLIENT_TIMEOUT,
            env=env_with(),
            cwd=tmp_path,
        )
    assert done.returncode == EXIT_BAD_INPUT, done.stderr
    assert f"wirekit serve: cannot listen: gRPC door on 127.0.0.1:{port}" in done.stderr
    assert done.stdout == ""  # never said ready


@pytest.mark.parametrize("version", ["²", "-1", "1.0", "0", "3"])
def test_a_version_not_among_the_model_s_is_not_found(served, version):
    with grpc.insecure_channel(served.address) as channel:
        call = channel.unary_unary(
            f"/{pb.SERVICE}/ModelReady",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=pb.ModelReadyResponse.FromString,
        )
        with pytest.raises(grpc.RpcError) as refused:
            call(pb.ModelReadyRequest(name="typed", version=version), timeout=30)
        assert refused.value.code() == grpc.StatusCode.NOT_FOUND
        assert refused.value.details() == (
            f"unknown version {version!r} of model 'typed' (its versions: 1, 2)"
        )
        assert call(pb.ModelReadyRequest(name="typed", version="2"), timeout=30).ready
