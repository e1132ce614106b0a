"""KServe's smallest custom model, as its documentation writes one: an echo.

Run with the KServe virtualenv's Python (``peer_venvs.py``)::

    python kserve_echo.py --http_port 8080 --grpc_port 8081

A ``kserve.Model`` subclass whose ``predict`` answers every input tensor back as an output of
the same name, datatype and shape, served by ``kserve.ModelServer`` (REST v1/v2 and gRPC;
ModelServer reads its ports from the command line).  KServe binds 0.0.0.0 whatever it is
told: the OIP benchmark starts it inside a network namespace with only loopback up.
"""

from __future__ import annotations

from kserve import InferOutput, InferRequest, InferResponse, Model, ModelServer
from kserve.utils.utils import generate_uuid

MODEL_NAME = "echo"


class EchoModel(Model):
    """Outputs = inputs (name, datatype, shape and data)."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.load()

    def load(self) -> bool:
        self.ready = True
        return self.ready

    async def predict(
        self,
        payload: InferRequest,
        headers: dict[str, str] | None = None,
        response_headers: dict[str, str] | None = None,
    ) -> InferResponse:
        outputs = []
        for tensor in payload.inputs:  # as kserve.utils.utils.get_predict_response builds them
            output = InferOutput(name=tensor.name, shape=tensor.shape, datatype=tensor.datatype)
            output.set_data_from_numpy(tensor.as_numpy(), binary_data=payload.use_binary_outputs)
            outputs.append(output)
        return InferResponse(
            response_id=payload.id or generate_uuid(),
            model_name=self.name,
            infer_outputs=outputs,
            use_binary_outputs=payload.use_binary_outputs,
        )


if __name__ == "__main__":
    ModelServer().start([EchoModel(MODEL_NAME)])
