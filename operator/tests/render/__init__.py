"""Tests of skiff_operator.render."""
