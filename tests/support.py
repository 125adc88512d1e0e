"""Shared test helpers: inputs, devices, dtypes, the bad-shape table; the tolerance table and the oracle check
come from :mod:`attnbook.testing` (the chapters use the same), the ports of the published code from
``published.py``."""

from __future__ import annotations

import contextlib

import pytest
import torch

from attnbook import config
from attnbook.feature_maps import PerformerFeatures
from attnbook.testing import TOLERANCES, assert_matches_reference, tol  # noqa: F401  (the one table)

CUDA = torch.cuda.is_available()
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not CUDA, reason="no CUDA device"))]
FLOAT_DTYPES = [
    pytest.param(torch.float32, id="float32"),
    pytest.param(torch.float64, id="float64"),
]
HALF_DTYPES = [
    pytest.param(torch.float16, id="float16"),
    pytest.param(torch.bfloat16, id="bfloat16"),
]


def qkv(B, H, N, M, D, Dv, *, device="cpu", dtype=torch.float32, scale=1.0, generator=None):
    """Standard normal q (B, H, N, D), k (B, H, M, D) and v (B, H, M, Dv); ``scale`` multiplies q and k."""
    return (
        scale * torch.randn(B, H, N, D, generator=generator).to(device=device, dtype=dtype),
        scale * torch.randn(B, H, M, D, generator=generator).to(device=device, dtype=dtype),
        torch.randn(B, H, M, Dv, generator=generator).to(device=device, dtype=dtype),
    )


# Shapes that every q, k, v function must reject with a ValueError naming them (attnbook._checks.check_qkv):
# id -> ((q shape, k shape, v shape), regex the message must match).
BAD_QKV_SHAPES = {
    "rank": (((2, 3, 4), (2, 3, 4, 5), (2, 3, 4, 5)), r"q must have 4 dimensions .* \(2, 3, 4\)"),
    "batch": (((2, 3, 4, 5), (1, 3, 4, 5), (1, 3, 4, 5)), r"k and v must have the batch size B = 2 of q"),
    "heads": (((2, 3, 4, 5), (2, 2, 4, 5), (2, 2, 4, 5)), r"k and v must have the head count H = 3 of q"),
    "width": (
        ((2, 3, 4, 5), (2, 3, 4, 6), (2, 3, 4, 5)),
        r"k must have the feature size D = 5 of q, got q \(2, 3, 4, 5\)",
    ),
    "key_length": (((2, 3, 4, 5), (2, 3, 4, 5), (2, 3, 6, 5)), r"v must have the key length M = 4 of k"),
    "empty_batch": (((0, 3, 4, 5), (0, 3, 4, 5), (0, 3, 4, 5)), r"B must be at least 1 .*q \(0, 3, 4, 5\)"),
    "no_heads": (((2, 0, 4, 5), (2, 0, 4, 5), (2, 0, 4, 5)), r"H must be at least 1"),
    "no_queries": (((2, 3, 0, 5), (2, 3, 4, 5), (2, 3, 4, 5)), r"N must be at least 1"),
    "no_keys": (((2, 3, 4, 5), (2, 3, 0, 5), (2, 3, 0, 5)), r"M must be at least 1"),
    "no_features": (((2, 3, 4, 0), (2, 3, 4, 0), (2, 3, 4, 5)), r"D must be at least 1"),
    "no_value_features": (((2, 3, 4, 5), (2, 3, 4, 5), (2, 3, 4, 0)), r"Dv must be at least 1"),
}

# The same for the one-token step functions: (q_t, k_t, v_t) shapes -> message.
BAD_STEP_SHAPES = {
    "rank": (
        ((2, 3, 1, 4), (2, 3, 4), (2, 3, 5)),
        r"q_t must have 3 dimensions \(B, H, D\), got a float32 tensor of shape \(2, 3, 1, 4\)",
    ),
    "width": (
        ((2, 3, 4), (2, 3, 6), (2, 3, 5)),
        r"q_t, k_t must be \(B, H, D\) of one shape .*q_t \(2, 3, 4\), k_t \(2, 3, 6\)",
    ),
    "heads": (((2, 3, 4), (2, 3, 4), (2, 2, 5)), r"v_t \(B, H, Dv\)"),
    "empty_batch": (((0, 3, 4), (0, 3, 4), (0, 3, 5)), r"B must be at least 1"),
    "no_heads": (((2, 0, 4), (2, 0, 4), (2, 0, 5)), r"H must be at least 1"),
    "no_features": (((2, 3, 0), (2, 3, 0), (2, 3, 5)), r"D must be at least 1"),
    "no_value_features": (((2, 3, 4), (2, 3, 4), (2, 3, 0)), r"Dv must be at least 1"),
}


def feature_map(name, D):
    """The feature maps under test, by readable id; Performer drawn with a fixed seed for width D."""
    if name == "performer":
        return PerformerFeatures(16, D, seed=1)
    if name == "square_plus":  # a user callable that changes the width: R = 2 D
        return lambda x: torch.cat([x * x, torch.ones_like(x)], dim=-1)
    return name


FEATURE_MAP_IDS = ["elu", "relu", "performer", "square_plus"]


@contextlib.contextmanager
def paths(plain: bool):
    """The plain forms alone (``plain``) or the speed annex too, on one thread (its causal tiles run on one thread
    only); the environment's choice and the thread count come back afterwards."""
    threads = torch.get_num_threads()
    config.set_plain(plain)
    torch.set_num_threads(1)
    try:
        yield
    finally:
        config.set_plain(None)
        torch.set_num_threads(threads)
