"""Skiff runtime: serves a Paddle model over the Open Inference Protocol (KServe V2 gRPC) with health checking."""

__version__ = "0.1.0"
