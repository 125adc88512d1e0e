"""The one tolerance table and the one comparison against a float64 oracle, shared by tests, chapters and
the exercise checkers. :data:`TOLERANCES` gives ``rtol`` and ``atol`` per dtype: float32 allows for
summation-order differences over a few thousand terms, the half types for their own resolution.

Example:
    >>> import torch
    >>> from attnbook import testing
    >>> a = torch.randn(4, 4)
    >>> torch.testing.assert_close(a + 1e-6, a, **testing.tol(torch.float32))  # within float32's tolerance
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypedDict

import torch

from ._checks import check_callable, check_choice, check_count, check_dtype, check_number, check_tensor

__all__ = ["TOLERANCES", "tol", "assert_matches_reference"]


class Tolerance(TypedDict):
    """The keywords of ``torch.testing.assert_close`` for one dtype: ``assert_close(a, b, **tol(dtype))``."""

    rtol: float
    atol: float


#: The tolerance of a comparison with a float64 reference, per dtype of the implementation under test.
TOLERANCES: dict[torch.dtype, Tolerance] = {
    torch.float64: Tolerance(rtol=1e-9, atol=1e-11),
    torch.float32: Tolerance(rtol=2e-4, atol=2e-5),
    torch.bfloat16: Tolerance(rtol=3e-2, atol=3e-2),
    torch.float16: Tolerance(rtol=5e-3, atol=5e-3),
}


def tol(dtype: torch.dtype) -> Tolerance:
    """``{"rtol": ..., "atol": ...}`` for ``dtype``; a ValueError naming the known dtypes otherwise.

    Example:
        >>> import torch
        >>> from attnbook.testing import tol
        >>> tol(torch.float32)
        {'rtol': 0.0002, 'atol': 2e-05}
    """
    return TOLERANCES[check_choice(dtype, "dtype", tuple(TOLERANCES), name="tol")].copy()


def assert_matches_reference(
    fast_fn: Callable[..., torch.Tensor],
    ref_fn: Callable[..., torch.Tensor],
    inputs: list[torch.Tensor],
    *,
    dtype: torch.dtype,
    baseline: Callable[..., torch.Tensor] | None = None,
    factor: float = 2.0,
) -> None:
    """Outputs and every input gradient (for a random upstream gradient) of ``fast_fn`` run in ``dtype`` against
    ``ref_fn`` in float64; an ``AssertionError`` says what differs.

    ``baseline``, for ill-conditioned problems: the definition computed literally in its inputs' dtype. A tensor
    that misses the tolerance still passes when its largest error is at most ``factor`` times the baseline's, as
    FlashAttention's tests compare against a low-precision reference.

    Example:
        >>> import torch, attnbook
        >>> from attnbook import reference, testing
        >>> q, k, v = (torch.randn(1, 2, 9, 4) for _ in range(3))
        >>> testing.assert_matches_reference(  # raises AssertionError naming the output or gradient that differs
        ...     lambda q, k, v: attnbook.flow_attention(q, k, v, is_causal=True),
        ...     lambda q, k, v: reference.flow_attention(q, k, v, is_causal=True),
        ...     [q, k, v],
        ...     dtype=torch.float32,
        ... )
    """
    name = "assert_matches_reference"
    check_callable(fast_fn, "fast_fn", name=name)
    check_callable(ref_fn, "ref_fn", name=name)
    check_count(inputs, "inputs", name=name, item="tensor")
    for i, x in enumerate(inputs):
        check_tensor(x, f"inputs[{i}]", name=name, floating=False)  # a bool mask may be one
    dtype = check_dtype(dtype, "dtype", name=name)
    factor = check_number(factor, "factor", name=name, minimum=0.0, strict_minimum=True)
    fast_in = [x.detach().to(dtype).requires_grad_(x.is_floating_point()) for x in inputs]
    ref_in = [x.detach().to(torch.float64).requires_grad_(x.is_floating_point()) for x in inputs]
    out = check_tensor(fast_fn(*fast_in), "fast_fn's result", name=name)
    ref = check_tensor(ref_fn(*ref_in), "ref_fn's result", name=name)
    assert out.dtype == dtype, f"output dtype {out.dtype}, expected the input dtype {dtype}"
    upstream = torch.randn_like(ref)
    lows: list[torch.Tensor | None] = [None] * (1 + len(fast_in))  # the baseline's output and gradients
    if baseline is not None:  # the definition itself in dtype: its error is what dtype can do here
        low_in = [x.detach().to(dtype).requires_grad_(x.is_floating_point()) for x in inputs]
        low = baseline(*low_in)
        assert low.dtype == dtype, f"the baseline computed in {low.dtype}, not in {dtype}"
        lows = [low, *torch.autograd.grad(low, [x for x in low_in if x.requires_grad], upstream.to(dtype))]
    _close(out, ref, lows[0], factor, "output")
    grads = torch.autograd.grad(out, [x for x in fast_in if x.requires_grad], upstream.to(dtype))
    ref_grads = torch.autograd.grad(ref, [x for x in ref_in if x.requires_grad], upstream)
    for i, (g, r) in enumerate(zip(grads, ref_grads, strict=True)):
        _close(g, r, lows[1 + i], factor, f"grad of input {i}")


def _close(got: torch.Tensor, ref: torch.Tensor, low: torch.Tensor | None, factor: float, what: str) -> None:
    """assert_close(got, ref) with the table's tolerance, or ``got``'s largest error within ``factor`` times
    that of ``low`` (the reference run in ``got``'s dtype)."""
    try:
        torch.testing.assert_close(got.double(), ref, **tol(got.dtype), msg=lambda m: f"{what}: {m}")
    except AssertionError:
        if low is None:
            raise
        err, base = (got.double() - ref).abs().max().item(), (low.double() - ref).abs().max().item()
        if not err <= factor * base:
            raise AssertionError(
                f"{what}: misses the {got.dtype} tolerance, and its largest error {err:.3g} is more than "
                f"{factor} x {base:.3g}, that of the definition computed in {got.dtype}"
            ) from None
