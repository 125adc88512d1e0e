"""The one tolerance table and the one comparison against a float64 oracle, shared by tests, chapters and
the exercise checkers.

:data:`TOLERANCES` is keyed by dtype and always gives both ``rtol`` and ``atol`` (for
``torch.testing.assert_close``): float32 allows for summation-order differences in reductions over a few
thousand terms; the half types are compared with their own resolution in mind.
"""

from __future__ import annotations

import torch

from ._checks import check_choice

__all__ = ["TOLERANCES", "tol", "assert_matches_reference"]

TOLERANCES: dict[torch.dtype, dict[str, float]] = {
    torch.float64: dict(rtol=1e-9, atol=1e-11),
    torch.float32: dict(rtol=2e-4, atol=2e-5),
    torch.bfloat16: dict(rtol=3e-2, atol=3e-2),
    torch.float16: dict(rtol=5e-3, atol=5e-3),
}


def tol(dtype: torch.dtype) -> dict[str, float]:
    """``{"rtol": ..., "atol": ...}`` for ``dtype``; a ValueError naming the known dtypes otherwise."""
    return dict(TOLERANCES[check_choice(dtype, "dtype", tuple(TOLERANCES), name="tol")])


def assert_matches_reference(fast_fn, ref_fn, inputs: list[torch.Tensor], *, dtype: torch.dtype) -> None:
    """Outputs and every input gradient of ``fast_fn`` (run in ``dtype``) against ``ref_fn`` in float64.

    The upstream gradient is random, so a gradient that is right only for ``sum()`` would not pass. Raises
    ``AssertionError`` (from ``torch.testing.assert_close``) saying what differs.
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
