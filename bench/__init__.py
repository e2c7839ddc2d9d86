"""Skiff's side-by-side benchmark: in-process predictor, Skiff, repeated-float gRPC, HTTP+JSON and MLServer."""
