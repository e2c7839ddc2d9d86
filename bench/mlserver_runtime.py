"""A small MLServer runtime for Paddle models: a custom `MLModel` calling paddle.inference (MLServer's docs recipe).

Loaded by MLServer 1.7.1 inside its own virtualenv (never the project's); imports only mlserver, numpy, paddle and
bench/predictor.py, which the benchmark copies next to this file in the model repository.
"""

from __future__ import annotations

from pathlib import Path

from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse
from predictor import Predictor  # copied next to this module by the benchmark


class PaddleRuntime(MLModel):
    async def load(self) -> bool:
        extra = self.settings.parameters.extra or {} if self.settings.parameters else {}
        self._predictor = Predictor(
            Path(self.settings.parameters.uri),
            str(extra.get("device", "cpu")),
            bool(extra.get("keep_intermediates", False)),
        )
        self._predictor.warm_up()
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        batch = NumpyCodec.decode_input(payload.inputs[0])
        output = self._predictor.run(batch)
        return InferenceResponse(
            model_name=self.name,
            model_version=self.version,
            outputs=[NumpyCodec.encode_output(self._predictor.output_name, output)],
        )
