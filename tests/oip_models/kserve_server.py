"""KServe 0.21.0's ``ModelServer`` with the OIP tests' models (run by KServe's virtualenv).

    WIREKIT_KSERVE_MODELS=DIR WIREKIT_KSERVE_START=echo,iris \\
        python kserve_server.py --http_port 8080 --grpc_port 8081

``DIR`` holds one folder per model, each with a ``model.json`` saying its kind:

* ``echo``: outputs = inputs (name, datatype, shape and data);
* ``iris``: the scikit-learn classifier in the folder's ``model.joblib``
  (``samples/mlserver/train_iris.py``): OIP input ``[N, 4]`` FP32/FP64 -> output
  ``predict`` ``[N]`` INT64;
  TF Serving REST ``{"instances": [[4 numbers], ...]}`` -> ``{"predictions": [class, ...]}``;
* ``slow``: the echo, whose load takes ``load_seconds`` and each answer ``predict_seconds``
  (of its ``model.json``);
* ``broken``: its load raises ``RuntimeError`` with the ``message`` of its ``model.json``.

The models named in ``WIREKIT_KSERVE_START`` are loaded at start; the others when asked
through the repository extension (``POST /v2/repository/models/NAME/load``), which KServe
answers through the ``ModelRepository`` given to its ``ModelServer``: :class:`FolderRepository`
really loads the folder then (and ``unload`` drops it).  KServe binds 0.0.0.0 whatever it is
told: the tests start it inside a network namespace with only loopback up.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

from kserve import InferOutput, InferRequest, InferResponse, Model, ModelRepository, ModelServer
from kserve.utils.utils import generate_uuid


class EchoModel(Model):
    """Outputs = inputs (name, datatype, shape and data)."""

    def load(self) -> bool:
        self.ready = True
        return self.ready

    async def predict(
        self,
        payload: InferRequest | dict[str, Any],
        headers: dict[str, str] | None = None,
        response_headers: dict[str, str] | None = None,
    ) -> InferResponse | dict[str, Any]:
        if isinstance(payload, dict):  # TF Serving REST (KServe's v1 protocol)
            return {"predictions": payload.get("instances", payload.get("inputs"))}
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


class SlowEchoModel(EchoModel):
    """The echo, slow: its load takes ``load_seconds``, each answer ``predict_seconds``."""

    def __init__(self, name: str, load_seconds: float, predict_seconds: float) -> None:
        super().__init__(name)
        self.load_seconds, self.predict_seconds = load_seconds, predict_seconds

    def load(self) -> bool:
        time.sleep(self.load_seconds)  # KServe calls a repository's load synchronously
        return super().load()

    async def predict(
        self,
        payload: InferRequest | dict[str, Any],
        headers: dict[str, str] | None = None,
        response_headers: dict[str, str] | None = None,
    ) -> InferResponse | dict[str, Any]:
        await asyncio.sleep(self.predict_seconds)
        return await super().predict(payload, headers, response_headers)


class IrisModel(Model):
    """The scikit-learn iris classifier saved in ``folder/model.joblib``."""

    def __init__(self, name: str, folder: Path) -> None:
        super().__init__(name)
        self.folder = folder
        self.classifier: Any = None

    def load(self) -> bool:
        import joblib

        self.classifier = joblib.load(self.folder / "model.joblib")
        self.ready = True
        return self.ready

    async def predict(
        self,
        payload: InferRequest | dict[str, Any],
        headers: dict[str, str] | None = None,
        response_headers: dict[str, str] | None = None,
    ) -> InferResponse | dict[str, Any]:
        import numpy as np

        if isinstance(payload, dict):  # TF Serving REST (KServe's v1 protocol)
            rows = np.asarray(payload["instances"], dtype=np.float64)
            return {"predictions": self.classifier.predict(rows).tolist()}
        classes = self.classifier.predict(payload.inputs[0].as_numpy()).astype(np.int64)
        output = InferOutput(name="predict", shape=list(classes.shape), datatype="INT64")
        output.set_data_from_numpy(classes, binary_data=payload.use_binary_outputs)
        return InferResponse(
            response_id=payload.id or generate_uuid(),
            model_name=self.name,
            infer_outputs=[output],
            use_binary_outputs=payload.use_binary_outputs,
        )


class FolderRepository(ModelRepository):
    """KServe's model repository over a folder of model folders: ``load(name)`` builds and
    loads the model of ``DIR/name`` (KServe answers the repository extension with it)."""

    def build(self, name: str) -> Model:
        """The model of folder ``name``, loaded; raises if it cannot be."""
        folder = Path(self.models_dir) / name
        try:
            spec = json.loads((folder / "model.json").read_text())
        except FileNotFoundError:
            raise RuntimeError(f"no model {name!r} in {self.models_dir}") from None
        kind = spec["kind"]
        if kind == "broken":
            raise RuntimeError(spec.get("message", "broken model: its load fails on purpose"))
        model: Model
        if kind == "echo":
            model = EchoModel(name)
        elif kind == "slow":
            model = SlowEchoModel(name, spec["load_seconds"], spec["predict_seconds"])
        else:
            model = IrisModel(name, folder)
        model.load()
        return model

    def load(self, name: str) -> bool:
        model = self.build(name)
        self.update(model)
        return model.ready

    def load_model(self, name: str) -> bool:
        return self.load(name)


def main() -> None:
    repository = FolderRepository(os.environ["WIREKIT_KSERVE_MODELS"])
    start = [n for n in os.environ.get("WIREKIT_KSERVE_START", "").split(",") if n]
    ModelServer(registered_models=repository).start([repository.build(n) for n in start])


if __name__ == "__main__":
    main()
