"""Tests of the operator package, mirroring skiff_operator (a package so pytest does not shadow stdlib operator)."""
