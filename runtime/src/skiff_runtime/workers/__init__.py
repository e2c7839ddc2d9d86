"""Inference workers: where engines run. One engine per worker, one batch per worker at a time."""
