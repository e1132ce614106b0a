"""Hypothesis strategies for OIP tensors, requests and replies of every datatype."""

from __future__ import annotations

import struct

from hypothesis import strategies as st

from wirekit import oip

datatypes = st.sampled_from(list(oip.DATATYPES))

#: names: ASCII and not, empty included (the mapping carries any UTF-8 name)
names = st.text(max_size=12)

#: parameter values OIP carries (bool, int, str) and JSON numbers, no transport keys
parameter_values = st.one_of(
    st.booleans(),
    st.integers(-(2**53), 2**53),
    st.text(max_size=8),
    st.floats(allow_nan=False, allow_infinity=False),
)
parameters = st.dictionaries(
    st.text(max_size=8).filter(lambda k: k not in oip.items.TRANSPORT),
    parameter_values,
    max_size=3,
)

shapes = st.lists(st.integers(0, 4), max_size=3).map(tuple)


@st.composite
def tensor_data(draw, datatype: str, count: int, *, json_safe: bool = False) -> bytes:
    """``count`` elements of ``datatype`` as raw bytes.  ``json_safe``: values that survive
    JSON ``data`` (BOOL 0/1, floats without NaN payloads, UTF-8 BYTES)."""
    dtype = oip.DATATYPES[datatype]
    if datatype == "BYTES":
        element = st.text(max_size=6).map(str.encode) if json_safe else st.binary(max_size=6)
        elements = draw(st.lists(element, min_size=count, max_size=count))
        return b"".join(struct.pack("<I", len(e)) + e for e in elements)
    if datatype == "BOOL" or (json_safe and datatype.startswith(("FP", "BF"))):
        if datatype == "BOOL":
            return bytes(draw(st.lists(st.integers(0, 1), min_size=count, max_size=count)))
        width = {"FP16": 16, "BF16": 32, "FP32": 32, "FP64": 64}[datatype]
        values = draw(
            st.lists(st.floats(width=width, allow_nan=False), min_size=count, max_size=count)
        )
        if datatype == "BF16":
            return b"".join(struct.pack("<f", v)[2:] for v in values)
        code = {"FP16": "e", "FP32": "f", "FP64": "d"}[datatype]
        return struct.pack(f"<{count}{code}", *values)
    return draw(st.binary(min_size=count * dtype.size, max_size=count * dtype.size))


@st.composite
def tensors(draw, *, shape=None, json_safe: bool = False, datatype=None) -> oip.Tensor:
    """A well-formed tensor (any datatype unless given; ``shape`` fixes its shape)."""
    kind = draw(datatypes) if datatype is None else datatype
    dims = draw(shapes) if shape is None else shape
    count = 1
    for d in dims:
        count *= d
    data = draw(tensor_data(kind, count, json_safe=json_safe))
    return oip.Tensor(draw(names), kind, tuple(dims), data, draw(parameters))


requested_outputs = st.lists(st.builds(oip.RequestedOutput, names, parameters), max_size=2)


@st.composite
def requests(draw, *, rows: bool = False, json_safe: bool = False) -> oip.InferRequest:
    """A request; with ``rows`` every input has the same dim 0 (>= 1)."""
    if rows:
        batch = draw(st.integers(1, 4))
        row_shapes = st.lists(st.integers(0, 3), max_size=2).map(lambda s: (batch, *s))
        count = draw(st.integers(1, 3))
        inputs = [draw(tensors(shape=draw(row_shapes), json_safe=json_safe)) for _ in range(count)]
    else:
        inputs = draw(st.lists(tensors(json_safe=json_safe), max_size=4))
    return oip.InferRequest(
        inputs=inputs,
        id=draw(st.none() | st.text(max_size=6)),
        outputs=draw(requested_outputs),
        parameters=draw(parameters),
    )


@st.composite
def replies(draw, *, rows: bool = False) -> tuple[list[oip.Tensor], dict]:
    """A model's answer: its outputs (with ``rows``, a common dim 0 >= 1) and parameters."""
    if rows:
        batch = draw(st.integers(1, 4))
        count = draw(st.integers(1, 3))
        outputs = [
            draw(tensors(shape=(batch, *draw(st.lists(st.integers(0, 3), max_size=2)))))
            for _ in range(count)
        ]
    else:
        outputs = draw(st.lists(tensors(), max_size=4))
    return outputs, draw(parameters)
