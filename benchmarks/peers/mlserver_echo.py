"""MLServer's smallest custom runtime, as its documentation writes one: an echo.

MLServer loads it from a model folder whose ``model-settings.json`` names
``mlserver_echo.EchoRuntime`` as its implementation (the OIP benchmark writes that folder and
copies this file into it), run with the MLServer virtualenv's ``mlserver start FOLDER``.
"""

from __future__ import annotations

from mlserver import MLModel
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
