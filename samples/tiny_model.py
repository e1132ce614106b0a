"""A tiny model for the sample deployment (``samples/serve-deployment.json``).

Run the whole sample -- the dispatcher and its five backends -- with one command, from the
checkout's root (Ctrl-C stops everything)::

    wirekit serve --config samples/serve-deployment.json --with-backends

Each backend is a ``wirekit mip serve`` process on its port from the config, serving the
``handler`` the config gives its model: ``m1`` is :func:`words` (counts the words of a text)
and ``m2`` is :func:`sentiment` (a word-list sentiment score).  Every answer says which
backend gave it (``row``, the ``node/device/model`` of the config), so you can watch the
dispatcher spread requests by quota.  Then, in another terminal::

    curl -d '{"inputs": [["a fine day"], ["so bad"]]}' localhost:8080/v1/models/m1:predict
    curl -d '{"inputs": [["what a great day"]]}' localhost:8080/v1/models/m2:predict
    curl -d '{"input": "I love it"}' localhost:8080/sentiment/predict   # Clipper's query form
    wirekit mip ping tcp://127.0.0.1:9001 --count 3                     # m1's MIP front door
    wirekit mip infer tcp://127.0.0.1:9002 --text "a bad day" --json
    curl localhost:8080/stats                                           # metrics as JSON
    wirekit serve stats --config samples/serve-deployment.json          # the requests store

A handler takes a batch (a list of samples, each a list of MIP items) and returns one list
of outputs per sample; a ``dict`` output travels as a JSON item.
"""

from __future__ import annotations

import os
from typing import Any

#: which backend this process is: ``node/device/model``, set by ``--with-backends`` and by
#: the Kubernetes manifests (``wirekit serve k8s``)
ROW = os.environ.get("WIREKIT_ROW", "?")

_GOOD = frozenset(["good", "great", "fine", "love", "like", "nice", "happy", "excellent"])
_BAD = frozenset(["bad", "awful", "poor", "hate", "sad", "terrible", "worse", "not"])


def _text(sample: list[Any]) -> str:
    return sample[0].as_text() if sample else ""


def words(batch: list[list[Any]]) -> list[list[Any]]:
    """m1: the number of words of each text."""
    return [[{"words": len(_text(s).split()), "row": ROW}] for s in batch]


def sentiment(batch: list[list[Any]]) -> list[list[Any]]:
    """m2: ``positive``/``negative``/``neutral`` by counting words of two short lists."""
    outputs = []
    for sample in batch:
        tokens = [t.strip(".,!?").lower() for t in _text(sample).split()]
        score = sum(t in _GOOD for t in tokens) - sum(t in _BAD for t in tokens)
        label = "positive" if score > 0 else "negative" if score < 0 else "neutral"
        outputs.append([{"label": label, "score": score, "row": ROW}])
    return outputs
