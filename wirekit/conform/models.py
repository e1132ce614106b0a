"""The models a target serves while ``wirekit conform`` tests it.

A conformance kit can only check answers it can predict, so the target runs a known model
(as an Autobahn target runs an echo server).  For MIP it is :func:`mip_model`; an
implementation in another language writes the same few lines:

* every sample is answered with its own inputs, item for item (same types, same bytes);
* a sample whose first input is the TEXT ``conform:first`` is answered with that one item
  (so a response has fewer outputs than the request has inputs);
* a batch with a sample whose first input is the TEXT ``conform:fail`` makes the model fail
  (the server answers INTERNAL).

Serve it with ``wirekit mip serve --handler wirekit.conform.models:mip_model``.

For a Clipper model container it is :func:`clipper_model`: each input answered with its
length (elements; characters of a string) as text (2017, v3) or a float32
(:func:`clipper_model_2016`).  Run it with
``wirekit clipper container --model wirekit.conform.models:clipper_model``.
"""

from __future__ import annotations

from collections.abc import Sequence, Sized

from wirekit.mip.messages import Item, ItemType

#: the first input that makes :func:`mip_model` answer the sample's first item only
FIRST_ONLY = b"conform:first"
#: the first input that makes :func:`mip_model` fail
FAIL = b"conform:fail"


class ConformModelFailure(RuntimeError):
    """The failure :func:`mip_model` was asked for."""


def mip_model(batch: Sequence[Sequence[Item]]) -> list[Sequence[Item]]:
    """The MIP conformance model (see the module docstring)."""
    outputs: list[Sequence[Item]] = []
    for sample in batch:
        first = sample[0] if sample else None
        marker = bytes(first.data) if first is not None and first.type == ItemType.TEXT else b""
        if marker == FAIL:
            raise ConformModelFailure("the conformance case asked the model to fail")
        outputs.append(sample[:1] if marker == FIRST_ONLY else sample)
    return outputs


def clipper_model(inputs: Sequence[Sized]) -> list[str]:
    """The Clipper container conformance model (2017, v3): each input answered with its
    length (the number of elements; of characters for a string) as decimal text."""
    return [str(len(x)) for x in inputs]


def clipper_model_2016(inputs: Sequence[Sized]) -> list[float]:
    """:func:`clipper_model` for a 2016 container, whose outputs are float32 numbers."""
    return [float(len(x)) for x in inputs]
