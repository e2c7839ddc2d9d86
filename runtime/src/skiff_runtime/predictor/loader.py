"""Builds the Paddle engine for a worker; Paddle is imported here, lazily, on the worker that runs it."""

from __future__ import annotations

from skiff_runtime.predictor.engine import Engine
from skiff_runtime.settings import RuntimeSettings


def load_engine(settings: RuntimeSettings) -> Engine:
    from skiff_runtime.predictor.paddle import PaddleEngine

    return PaddleEngine(settings)
