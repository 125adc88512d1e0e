"""Shared test helpers: devices, dtypes, bad shapes; the tolerance table and the oracle check come from
:mod:`attnbook.testing` (the chapters use the same)."""

from __future__ import annotations

import pytest
import torch

from attnbook.testing import TOLERANCES, assert_matches_reference, tol  # noqa: F401  (the one table)

CUDA = torch.cuda.is_available()
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not CUDA, reason="no CUDA device"))]
FLOAT_DTYPES = [
    pytest.param(torch.float32, id="float32"),
    pytest.param(torch.float64, id="float64"),
]


# Shapes that every (q, k, v) mechanism must reject with a ValueError naming them (attnbook._checks.check_qkv):
# id -> ((q shape, k shape, v shape), regex the message must match).
BAD_QKV_SHAPES = {
    "rank": (((2, 3, 4), (2, 3, 4, 5), (2, 3, 4, 5)), r"q must have 4 dimensions .* \(2, 3, 4\)"),
    "batch": (((2, 3, 4, 5), (1, 3, 4, 5), (1, 3, 4, 5)), r"batch sizes B differ"),
    "heads": (((2, 3, 4, 5), (2, 2, 4, 5), (2, 2, 4, 5)), r"head counts H differ"),
    "width": (((2, 3, 4, 5), (2, 3, 4, 6), (2, 3, 4, 5)), r"feature size D: q \(2, 3, 4, 5\), k \(2, 3, 4, 6\)"),
    "key_length": (((2, 3, 4, 5), (2, 3, 4, 5), (2, 3, 6, 5)), r"key length M"),
    "empty": (((2, 3, 0, 5), (2, 3, 4, 5), (2, 3, 4, 5)), r"N must be at least 1"),
}
