"""The real OIP gRPC clients from PyPI, unchanged, against a running ``wirekit serve``: run as
``python oip_grpc_clients.py triton|kserve HOST:PORT``, each in a process of its own
(tritonclient's and kserve's generated modules both register ``inference.*`` in protobuf's
default pool: one process cannot import both).  Prints one JSON document of what the client
saw, for tests/test_serve_oip_grpc.py to judge.

The deployment it expects: ``echo`` (no declared tensors, the ``sample`` rule), ``rows``
(the ``rows`` rule) and ``typed`` (input ``x`` FP32 ``[-1, 2]``, output ``y`` FP32
``[-1, 2]``, versions 1 and 2, platform ``wirekit-test``), each served by wirekit's MIP echo
handler; ``grpc.max_message_size`` 4 MiB and a memory budget of 2 MiB.
"""

from __future__ import annotations

import asyncio
import json
import struct
import sys
from typing import Any

import ml_dtypes
import numpy as np

#: one input per OIP datatype: name -> (datatype, values); dim 0 is 2 for every one (the
#: ``rows`` rule splits it)
TENSORS: dict[str, tuple[str, Any]] = {
    "BOOL": ("BOOL", np.array([[True, False, True], [False, False, True]])),
    "UINT8": ("UINT8", np.array([[0, 1, 255], [7, 128, 254]], dtype=np.uint8)),
    "UINT16": ("UINT16", np.array([[0, 1, 65535], [2, 3, 4]], dtype=np.uint16)),
    "UINT32": ("UINT32", np.array([[0, 1, 2**32 - 1], [5, 6, 7]], dtype=np.uint32)),
    "UINT64": ("UINT64", np.array([[0, 1, 2**64 - 1], [8, 9, 2**63]], dtype=np.uint64)),
    "INT8": ("INT8", np.array([[-128, 0, 127], [1, -1, 2]], dtype=np.int8)),
    "INT16": ("INT16", np.array([[-32768, 0, 32767], [1, -1, 2]], dtype=np.int16)),
    "INT32": ("INT32", np.array([[-(2**31), 0, 2**31 - 1], [1, -1, 2]], dtype=np.int32)),
    "INT64": ("INT64", np.array([[-(2**63), 0, 2**63 - 1], [1, -1, 2]], dtype=np.int64)),
    "FP16": ("FP16", np.array([[0.5, -0.0, np.inf], [65504, 1e-7, -2]], dtype=np.float16)),
    "FP32": ("FP32", np.array([[1.5, -0.0, np.nan], [3.4e38, 1e-45, -np.inf]], dtype=np.float32)),
    "FP64": ("FP64", np.array([[1.5, -0.0, np.inf], [1e308, 5e-324, -1]], dtype=np.float64)),
    # BF16: ml_dtypes' bfloat16 (tritonclient's type for it)
    "BF16": ("BF16", np.array([[1.0, -2.5, 3.0], [0.0, -0.0, 256.0]], dtype=ml_dtypes.bfloat16)),
    "BYTES": (
        "BYTES",
        np.array([[b"a", b"", b"\xff\x00bytes"], ["é".encode(), b"x" * 300, b"z"]], dtype=object),
    ),
}


def raw_bytes(datatype: str, values: Any) -> bytes:
    """The bytes OIP carries for ``values`` (little-endian, row-major; BYTES each element's
    u32-LE length then its bytes), computed here, not by the client."""
    flat = values.reshape(-1)
    if datatype == "BYTES":
        return b"".join(struct.pack("<I", len(v)) + bytes(v) for v in flat)
    if datatype == "BF16":
        return flat.view("<u2").tobytes()
    return flat.astype(flat.dtype.newbyteorder("<")).tobytes()


def triton(address: str) -> dict[str, Any]:
    """What tritonclient.grpc sees of the deployment."""
    import tritonclient.grpc as tg
    from tritonclient.utils import InferenceServerException

    client = tg.InferenceServerClient(address)
    seen: dict[str, Any] = {
        "live": client.is_server_live(),
        "ready": client.is_server_ready(),
        "model_ready": client.is_model_ready("typed"),
        "model_ready_v2": client.is_model_ready("typed", "2"),
        "server_metadata": client.get_server_metadata(as_json=True),
        "model_metadata": client.get_model_metadata("typed", as_json=True),
    }

    def refused(call: Any) -> list[str] | None:
        try:
            call()
        except InferenceServerException as exc:
            return [str(exc.status()), exc.message()]
        return None

    seen["model_ready_unknown"] = refused(lambda: client.is_model_ready("nope"))
    seen["model_metadata_unknown_version"] = refused(
        lambda: client.get_model_metadata("typed", "9")
    )

    def inputs(names: list[str]) -> list[Any]:
        made = []
        for name in names:
            datatype, values = TENSORS[name]
            tensor = tg.InferInput(name, list(values.shape), datatype)
            tensor.set_data_from_numpy(values)
            made.append(tensor)
        return made

    for model in ("echo", "rows"):
        result = client.infer(
            model, inputs(list(TENSORS)), request_id=f"{model}-1", parameters={"p": 7, "q": "s"}
        )
        response = result.get_response()
        outputs = {}
        for i, out in enumerate(response.outputs):
            datatype, values = TENSORS[out.name]
            got = result.as_numpy(out.name)
            outputs[out.name] = {
                "datatype": out.datatype,
                "shape": list(out.shape),
                "bytes_equal": response.raw_output_contents[i] == raw_bytes(datatype, values),
                "numpy_equal": bool(
                    got is not None
                    and got.shape == values.shape
                    and (
                        got.tolist() == values.tolist()
                        if datatype == "BYTES"
                        else got.tobytes() == values.tobytes()
                    )
                ),
            }
        seen[f"infer_{model}"] = {
            "id": response.id,
            "model_name": response.model_name,
            "model_version": response.model_version,
            "parameters": {
                key: getattr(value, value.WhichOneof("parameter_choice"))
                for key, value in response.parameters.items()
            },
            "outputs": outputs,
        }

    result = client.infer(
        "echo", inputs(["FP32", "INT8"]), outputs=[tg.InferRequestedOutput("INT8")]
    )
    seen["selected"] = [out.name for out in result.get_response().outputs]
    seen["versioned"] = (
        client.infer("typed", [_typed(tg, "FP32", [1, 2])], model_version="2")
        .get_response()
        .model_version
    )

    big = np.zeros((5 * 1024 * 1024) // 4, dtype=np.float32)  # over grpc.max_message_size
    over_budget = np.zeros((3 * 1024 * 1024) // 4, dtype=np.float32)  # over the budget
    seen["refusals"] = {
        "wrong_datatype": refused(lambda: client.infer("typed", [_typed(tg, "INT32", [1, 2])])),
        "wrong_shape": refused(lambda: client.infer("typed", [_typed(tg, "FP32", [1, 3])])),
        "wrong_name": refused(lambda: client.infer("typed", [_typed(tg, "FP32", [1, 2], "w")])),
        "unknown_model": refused(lambda: client.infer("nope", [_typed(tg, "FP32", [1, 2])])),
        "unknown_version": refused(
            lambda: client.infer("typed", [_typed(tg, "FP32", [1, 2])], model_version="9")
        ),
        "unknown_output": refused(
            lambda: client.infer(
                "echo",
                [_typed(tg, "FP32", [1, 2])],
                outputs=[tg.InferRequestedOutput("nothing")],
            )
        ),
        "too_large": refused(lambda: client.infer("echo", [_array(tg, "FP32", big)])),
        "over_budget": refused(lambda: client.infer("echo", [_array(tg, "FP32", over_budget)])),
    }
    # still serving after all that
    seen["after"] = client.infer("typed", [_typed(tg, "FP32", [1, 2])]).as_numpy("x").tolist()
    client.close()
    return seen


def _array(tg: Any, datatype: str, values: Any, name: str = "x") -> Any:
    tensor = tg.InferInput(name, list(values.shape), datatype)
    tensor.set_data_from_numpy(values)
    return tensor


def _typed(tg: Any, datatype: str, shape: list[int], name: str = "x") -> Any:
    """An input ``name`` of ``datatype`` and ``shape`` (values 1, 2, ...)."""
    values = np.arange(1, int(np.prod(shape)) + 1).reshape(shape)
    return _array(
        tg, datatype, values.astype({"FP32": np.float32, "INT32": np.int32}[datatype]), name
    )


def kserve(address: str) -> dict[str, Any]:
    """What kserve's InferenceGRPCClient (the v2 gRPC client) sees."""
    from kserve import InferenceGRPCClient, InferInput, InferRequest

    async def run() -> dict[str, Any]:
        client = InferenceGRPCClient(address, timeout=30, retries=0)
        seen: dict[str, Any] = {
            "live": await client.is_server_live(),
            "ready": await client.is_server_ready(),
            "model_ready": await client.is_model_ready("typed"),
        }
        x = np.array([[1.5, -2.0], [3.25, 4.0]], dtype=np.float32)
        tensor = InferInput("x", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x, binary_data=True)
        words = InferInput("w", [2], "BYTES")
        words.set_data_from_numpy(np.array([b"ab", b"c"], dtype=object), binary_data=True)
        response = await client.infer(
            InferRequest("typed", [tensor], request_id="k-1", model_version="1")
        )
        out = response.outputs[0]
        seen["typed"] = {
            "id": response.id,
            "name": out.name,
            "datatype": out.datatype,
            "shape": list(out.shape),
            "equal": out.as_numpy().tobytes() == x.tobytes(),
        }
        response = await client.infer(InferRequest("echo", [words], request_id="k-2"))
        seen["bytes"] = [
            v.decode() if isinstance(v, bytes) else v
            for v in response.outputs[0].as_numpy().tolist()
        ]
        await client.close()
        return seen

    return asyncio.run(run())


if __name__ == "__main__":
    which, address = sys.argv[1], sys.argv[2]
    print(json.dumps({"triton": triton, "kserve": kserve}[which](address)))
