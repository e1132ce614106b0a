"""Run as a script: tritonclient.http's own request and response codec against wirekit.oip's,
for every OIP datatype, JSON and binary (no network; tritonclient's
``generate_request_body``/``parse_response_body``).  A separate process, so that gevent,
which tritonclient.http imports, never enters the pytest process.  Prints one JSON line: the
cases checked, or the first mismatch."""

from __future__ import annotations

import json
import sys

import ml_dtypes
import numpy as np
import tritonclient.http as httpclient
from tritonclient.utils import serialize_byte_tensor

from wirekit import oip

ARRAYS = {
    "BOOL": np.array([[True, False, True]], dtype=bool),
    "UINT8": np.array([[0, 7, 255]], dtype=np.uint8),
    "UINT16": np.array([[0, 7, 65535]], dtype=np.uint16),
    "UINT32": np.array([[0, 7, 2**32 - 1]], dtype=np.uint32),
    "UINT64": np.array([[0, 7, 2**64 - 1]], dtype=np.uint64),
    "INT8": np.array([[-128, 0, 127]], dtype=np.int8),
    "INT16": np.array([[-32768, 0, 32767]], dtype=np.int16),
    "INT32": np.array([[-(2**31), 0, 2**31 - 1]], dtype=np.int32),
    "INT64": np.array([[-(2**63), 0, 2**63 - 1]], dtype=np.int64),
    "FP16": np.array([[-1.5, 0.0, 65504.0]], dtype=np.float16),
    "FP32": np.array([[-1.5, 0.1, 3.4e38]], dtype=np.float32),
    "FP64": np.array([[-1.5, 0.1, 1e300]], dtype=np.float64),
    "BF16": np.array([[-1.5, 0.1, 3.0e38]], dtype=ml_dtypes.bfloat16),
    "BYTES": np.array([[b"", b"abc", "zwölf".encode()]], dtype=np.object_),
}


def raw(datatype: str, array: np.ndarray) -> bytes:
    if datatype == "BYTES":
        return serialize_byte_tensor(array).item()
    return array.tobytes()


def main() -> int:
    checked = []
    for datatype, array in ARRAYS.items():
        for binary in (False, True):
            if datatype == "BF16" and not binary:
                continue  # tritonclient refuses BF16 as JSON
            inp = httpclient.InferInput("in", list(array.shape), datatype)
            inp.set_data_from_numpy(array, binary_data=binary)
            out = httpclient.InferRequestedOutput("out", binary_data=binary)
            body, length = httpclient.InferenceServerClient.generate_request_body(
                [inp], outputs=[out], request_id="r1", parameters={"k": "v"}
            )
            req = oip.decode_rest_request(body, length)
            (tensor,) = req.inputs
            got = (tensor.name, tensor.datatype, tensor.shape, bytes(tensor.data))
            want = ("in", datatype, array.shape, raw(datatype, array))
            if got != want or req.id != "r1" or req.parameters.get("k") != "v":
                print(
                    json.dumps(
                        {"mismatch": f"request {datatype} binary={binary}", "got": repr(got)}
                    )
                )
                return 1
            if oip.binary_outputs(req)("out") != binary:
                print(json.dumps({"mismatch": f"binary_outputs {datatype} {binary}"}))
                return 1
            for answer_binary in (False, True):
                if datatype == "BF16" and not answer_binary:
                    continue  # tritonclient cannot read BF16 as JSON either
                output = oip.Tensor("out", datatype, tensor.shape, tensor.data)
                resp = oip.InferResponse("echo", [output], "1", "r1")
                encoded, header = oip.encode_rest_response(resp, binary=answer_binary)
                joined = encoded if isinstance(encoded, bytes) else b"".join(encoded)
                result = httpclient.InferenceServerClient.parse_response_body(
                    joined, header_length=header
                )
                back = result.as_numpy("out")
                if datatype == "BYTES":
                    same = [bytes(x) if isinstance(x, bytes) else x.encode() for x in back.ravel()]
                    ok = same == list(array.ravel()) and back.shape == array.shape
                else:
                    ok = back.dtype == array.dtype and back.tobytes() == array.tobytes()
                    ok = ok and back.shape == array.shape
                if not ok:
                    print(
                        json.dumps(
                            {"mismatch": f"response {datatype} {answer_binary}", "got": repr(back)}
                        )
                    )
                    return 1
                checked.append(f"{datatype}/{binary}/{answer_binary}")
    print(json.dumps({"checked": checked}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
