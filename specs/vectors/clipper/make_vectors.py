"""Write the Clipper golden vectors from the hex in clipper-wire.md.

Run from the repository root: ``python specs/vectors/clipper/make_vectors.py``.  The frames
are written out literally (not produced by wirekit); the decoded description and error text
come from the pure codec and are checked against both twins by the tests.
"""

import json
import struct
import sys
from pathlib import Path

sys.path.insert(0, ".")
from wirekit.clipper import _pure, messages
from wirekit.errors import DecodeError

D = Path("specs/vectors/clipper")


def f8(*v: float) -> str:
    return struct.pack(f"<{len(v)}d", *v).hex()


def u32(v: int) -> str:
    return struct.pack("<I", v).hex()


def u64(v: int) -> str:
    return struct.pack("<Q", v).hex()


G0_DBL = ["00000000", "030000000200000002000000", f8(1.0, 2.0, 3.0)]
G0_STR = ["00000000", "040000000200000001000000", "6162006300"]
G1_DBL = [
    "00000000",
    "0c00000000000000",
    "030000000200000002000000",
    "1800000000000000",
    f8(1.0, 2.0, 3.0),
]
G1_STR = [
    "00000000",
    "0c00000000000000",
    "040000000200000001000000",
    "0500000000000000",
    "6162006300",
]
G3_DBL = ["00000000", "2000000000000000", u64(3) + u64(2) + u64(16) + u64(8), f8(1.0, 2.0), f8(3.0)]
G3_STR = ["00000000", "2000000000000000", u64(4) + u64(2) + u64(2) + u64(1), "6162", "63"]

V = {}


def vec(name, gen, direction, frames, desc, source, canonical=True, error=None):
    V[name] = dict(
        description=desc,
        source=source,
        generation=gen,
        direction=direction,
        frames_hex=frames,
        canonical=canonical,
        error=error,
    )


S = "clipper-wire.md"
vec(
    "2016-request-doubles",
    "2016",
    "to_container",
    ["", u32(7), *G0_DBL],
    "2016 request, doubles [1.0, 2.0], [3.0]: u32 header with cumulative element offsets",
    f"{S} §1.2 (request frames verified by compiling datatypes.cpp f5f76d05; msg_id 7 chosen)",
)
vec(
    "2016-request-strings",
    "2016",
    "to_container",
    ["", u32(7), *G0_STR],
    "2016 request, strings 'ab', 'c': each NUL-terminated, offsets count strings",
    f"{S} §1.2 (verified)",
)
vec(
    "2016-registration",
    "2016",
    "to_clipper",
    ["", "6d6f64656c", "31", "33"],
    "2016 registration: name 'model', version '1', input type '3' (decimal ASCII)",
    f"{S} §1.1",
)
vec(
    "2016-response",
    "2016",
    "to_clipper",
    ["", u32(7), struct.pack("<2f", 0.5, 1.0).hex()],
    "2016 response: msg_id echoed, one float32 per input",
    f"{S} §1.1",
)
vec(
    "2017-request-doubles",
    "2017",
    "to_container",
    ["", u32(1), u32(7), *G1_DBL],
    "2017 request, doubles [1.0, 2.0], [3.0]: 8-byte size frames (std::vector<long>)",
    f"{S} §2.2 (request frames verified by compiling datatypes.cpp 9f396e0e)",
)
vec(
    "2017-request-strings",
    "2017",
    "to_container",
    ["", u32(1), u32(7), *G1_STR],
    "2017 request, strings 'ab', 'c'",
    f"{S} §2.2 (verified)",
)
md = list(G1_DBL)
md[1] = "0c000000"
md[3] = "18000000"
vec(
    "2017-request-4-byte-sizes",
    "2017",
    "to_container",
    ["", u32(1), u32(7), *md],
    "2017 request with 32-bit size frames as the markdown describes them: accepted; "
    "wirekit encodes 8-byte sizes",
    f"{S} §4 G1 discrepancy 1",
    canonical=False,
)
vec(
    "2017-response",
    "2017",
    "to_clipper",
    ["", u32(1), u32(7), "0200000003000000010000007965736e"],
    "2017 response: u32 N, u32 lengths, UTF-8 outputs 'yes', 'n'",
    f"{S} §2.1 and §5 (parser exercised)",
)
vec(
    "2017-response-jvm-8-byte-id",
    "2017",
    "to_clipper",
    ["", u32(1), u64(7), "0200000003000000010000007965736e"],
    "2017 response from the JVM container: 8-byte msg_id (Clipper reads the low 4 bytes)",
    f"{S} §2.1",
    canonical=False,
)
vec("2017-heartbeat", "2017", "to_clipper", ["", u32(2)], "container heartbeat", f"{S} §2.1")
vec(
    "2017-heartbeat-reply-metadata",
    "2017",
    "to_container",
    ["", u32(2), u32(1)],
    "Clipper's answer to an unknown container: send metadata",
    f"{S} §2.2",
)
vec(
    "2017-registration",
    "2017",
    "to_clipper",
    ["", u32(0), "6d6f64656c", "7631", "33"],
    "2017 registration: version is an opaque string ('v1')",
    f"{S} §2.1",
)
vec(
    "2017-registration-cpp-input-type-junk",
    "2017",
    "to_clipper",
    ["", u32(0), "6d6f64656c", "3132", "3300"],
    "2017 C++ container: the input-type frame carries len(version) bytes ('3\\0'); "
    "std::stoi reads 3",
    f"{S} §2.4 bugs",
    canonical=False,
)
vec(
    "v3-request-doubles",
    "v3",
    "to_container",
    ["", u32(3), u32(1), u32(7), *G3_DBL],
    "v3 request, doubles [1.0, 2.0], [3.0]: u64 header of byte sizes, one frame per input",
    f"{S} §3.2 (request frames verified by compiling datatypes.cpp 9f25e3fc)",
)
vec(
    "v3-request-strings",
    "v3",
    "to_container",
    ["", u32(3), u32(1), u32(7), *G3_STR],
    "v3 request, strings 'ab', 'c': no NUL terminators",
    f"{S} §3.2 (verified)",
)
vec(
    "v3-heartbeat-reply-metadata",
    "v3",
    "to_container",
    ["", u32(3), u32(2), u32(1)],
    "v3 heartbeat reply to a new container",
    f"{S} §3.2",
)
vec(
    "v3-registration",
    "v3",
    "to_clipper",
    ["", u32(0), "6d6f64656c", "31", "33", u32(3)],
    "v3 registration ends with the u32 RPC version",
    f"{S} §3.1 and §4 G3 discrepancy 1",
)
vec(
    "v3-response",
    "v3",
    "to_clipper",
    ["", u32(1), u32(7), u64(24), u64(2) + u64(3) + u64(1), "796573", "6e"],
    "v3 response: u64 header [N, len...] without a type element, one frame per output",
    f"{S} §3.1 and §4 G3 discrepancy 2",
)
vec(
    "v3-heartbeat",
    "v3",
    "to_clipper",
    ["", u32(2)],
    "container heartbeat (same bytes as 2017)",
    f"{S} §3.1",
)
# errors
vec(
    "bad-2017-feedback-request",
    "2017",
    "to_container",
    ["", u32(1), u32(7), u32(1), *G1_DBL[1:]],
    "request type 1 (feedback): named by the spec, never defined or sent",
    f"{S} §2.3",
    error=dict(field="request_type", frame=3, offset=0),
)
vec(
    "bad-v3-registration-without-version",
    "v3",
    "to_clipper",
    ["", u32(0), "6d6f64656c", "31", "33"],
    "v3 registration as the markdown shows it (no version frame): Clipper does not register it",
    f"{S} §3.3, §4 G3 discrepancy 1",
    error=dict(field="frames", frame=5, offset=0),
)
vec(
    "bad-v3-wrong-version",
    "v3",
    "to_container",
    ["", u32(2), u32(2), u32(1)],
    "a message to a v3 container with version 2",
    f"{S} §3.4",
    error=dict(field="rpc_version", frame=1, offset=0),
)
bad = list(G1_DBL)
bad[3] = "1000000000000000"
vec(
    "bad-2017-content-size",
    "2017",
    "to_container",
    ["", u32(1), u32(7), *bad],
    "content size frame announces 16 bytes, the content has 24",
    f"{S} §2.2",
    error=dict(field="content_size", frame=6, offset=0),
)
vec(
    "bad-2016-offsets-past-content",
    "2016",
    "to_container",
    ["", u32(7), "00000000", "030000000200000009000000", f8(1.0, 2.0, 3.0)],
    "offset 9 past the 3 elements of the content",
    f"{S} §1.2",
    error=dict(field="offsets[0]", frame=3, offset=8),
)
vec(
    "bad-v3-size-mismatch",
    "v3",
    "to_container",
    [
        "",
        u32(3),
        u32(1),
        u32(7),
        "00000000",
        "2000000000000000",
        u64(3) + u64(2) + u64(16) + u64(16),
        f8(1.0, 2.0),
        f8(3.0),
    ],
    "the header announces 16 bytes for input 1, its frame has 8",
    f"{S} §3.2",
    error=dict(field="sizes[1]", frame=6, offset=24),
)
vec(
    "bad-2017-response-utf8",
    "2017",
    "to_clipper",
    ["", u32(1), u32(7), "0100000002000000c328"],
    "invalid UTF-8 in an output",
    f"{S} §2.1",
    error=dict(field="outputs[0]", frame=3, offset=8),
)

for name, v in V.items():
    frames = [bytes.fromhex(h) for h in v["frames_hex"]]
    out = {k: val for k, val in v.items() if val is not None}
    if v["error"] is None:
        out.pop("error", None)
        msg = _pure.decode(frames, v["generation"], v["direction"])
        out["message"] = messages.to_jsonable(msg)
        if v["canonical"]:
            assert _pure.encode(msg, v["generation"]) == frames, name
    else:
        out.pop("canonical")
        try:
            _pure.decode(frames, v["generation"], v["direction"])
            raise SystemExit(f"{name} decoded")
        except DecodeError as exc:
            e = v["error"]
            assert (exc.field, exc.frame, exc.offset) == (e["field"], e["frame"], e["offset"]), (
                name,
                exc,
            )
            out["error"]["message"] = str(exc)
    (D / f"{name}.json").write_text(json.dumps(out, indent=2, ensure_ascii=False) + "\n")
    print(name, out.get("message") or out["error"]["message"])
