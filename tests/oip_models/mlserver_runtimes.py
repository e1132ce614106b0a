"""MLServer runtimes of the OIP tests' models (run by MLServer 1.7.1 from its virtualenv).

A model folder's ``model-settings.json`` names one as its ``implementation``
(``tests/oip_servers.py`` writes the folders and puts this directory on the server's
``PYTHONPATH``).  The iris model needs no runtime of ours: it is served by MLServer's own
scikit-learn runtime (``mlserver_sklearn.SKLearnModel``).
"""

from __future__ import annotations

import asyncio

from mlserver import MLModel
from mlserver.errors import MLServerError
from mlserver.types import InferenceRequest, InferenceResponse, ResponseOutput


class EchoRuntime(MLModel):
    """Outputs = inputs (name, datatype, shape and data)."""

    async def load(self) -> bool:
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        outputs = [
            ResponseOutput(name=i.name, shape=i.shape, datatype=i.datatype, data=i.data)
            for i in payload.inputs
        ]
        return InferenceResponse(model_name=self.name, id=payload.id, outputs=outputs)


class SlowEchoRuntime(EchoRuntime):
    """The echo, slow: its load takes ``parameters.extra.load_seconds``, each answer
    ``parameters.extra.predict_seconds`` (a model caught mid-load, requests in flight)."""

    def _extra(self, key: str) -> float:
        extra = (self.settings.parameters.extra if self.settings.parameters else None) or {}
        return float(extra.get(key, 0.0))

    async def load(self) -> bool:
        await asyncio.sleep(self._extra("load_seconds"))
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        await asyncio.sleep(self._extra("predict_seconds"))
        return await super().predict(payload)


class BrokenRuntime(MLModel):
    """A model whose load always fails, with the message its settings give
    (``parameters.extra.message``).  Raised as MLServer's own ``MLServerError`` (status 400,
    as MLServer's errors default to), the one kind MLServer answers with its message: any
    other exception is a bare ``500 Internal Server Error``."""

    async def load(self) -> bool:
        extra = (self.settings.parameters.extra if self.settings.parameters else None) or {}
        raise MLServerError(extra.get("message", "broken model: its load fails on purpose"))
