"""Shared test helpers: the one tolerance table, devices, and checks against float64 oracles."""

from __future__ import annotations

import pytest
import torch

# One table, keyed by dtype; always both rtol and atol. float32 allows for summation-order differences in
# reductions over a few thousand terms; the half types are compared with their own resolution in mind.
TOLERANCES: dict[torch.dtype, dict[str, float]] = {
    torch.float64: dict(rtol=1e-9, atol=1e-11),
    torch.float32: dict(rtol=2e-4, atol=2e-5),
    torch.bfloat16: dict(rtol=3e-2, atol=3e-2),
    torch.float16: dict(rtol=5e-3, atol=5e-3),
}


def tol(dtype: torch.dtype) -> dict[str, float]:
    return TOLERANCES[dtype]


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


def assert_matches_reference(fast_fn, ref_fn, inputs: list[torch.Tensor], *, dtype: torch.dtype) -> None:
    """Outputs and every input gradient of ``fast_fn`` (run in ``dtype``) against ``ref_fn`` in float64.

    The upstream gradient is random, so a gradient that is right only for sum() would not pass.
    """
    fast_in = [x.detach().to(dtype).requires_grad_(x.is_floating_point()) for x in inputs]
    ref_in = [x.detach().to(torch.float64).requires_grad_(x.is_floating_point()) for x in inputs]
    out = fast_fn(*fast_in)
    ref = ref_fn(*ref_in)
    assert out.dtype == dtype, f"output dtype {out.dtype}, expected the input dtype {dtype}"
    torch.testing.assert_close(out.double(), ref, **tol(dtype))
    upstream = torch.randn_like(ref)
    grads = torch.autograd.grad(out, [x for x in fast_in if x.requires_grad], upstream.to(dtype))
    ref_grads = torch.autograd.grad(ref, [x for x in ref_in if x.requires_grad], upstream)
    for i, (g, r) in enumerate(zip(grads, ref_grads, strict=True)):
        torch.testing.assert_close(g.double(), r, **tol(dtype), msg=lambda m, i=i: f"grad of input {i}: {m}")
