"""How the mechanisms run: in which dtypes, under autocast or not, traced or not.

Every mechanism follows the same rules, written once here:

* **Accumulation.** Feature maps, softmaxes, sums, normalisers and recurrent states are computed in
  :func:`accumulation_dtype` of the inputs: at least float32 (float64 stays float64, for gradcheck).
* **Autocast.** Under ``torch.autocast`` a mechanism behaves like torch's own attention,
  ``scaled_dot_product_attention``: inputs of any floating dtype but float64 count as the autocast dtype, and
  the result comes back in :func:`result_dtype` (the autocast dtype; float64 inputs give float64). Inside, the
  package switches autocast off (:func:`autocast_disabled`) so that its float32 accumulation really happens in
  float32. Modules therefore behave like torch layers: under autocast their output is in the autocast dtype.
* **Matrix units.** The products of a chunked causal form take their inputs in :func:`product_dtype` (bfloat16
  for a bfloat16 result, as flash-linear-attention's kernels do), their results and states in float32.
* **Range.** :func:`linear_in_range` applies an output projection to an accumulation-dtype input without first
  rounding it to float16 (where it may exceed 65504).
* **Graphs.** Under ``torch.compile`` and ``torch.export`` (:func:`tracing`) the code is the same but for a chunk
  count that an exported program can reason about (:func:`chunk_count`).
"""

from __future__ import annotations

import contextlib
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "accumulation_dtype",
    "autocast_dtype",
    "result_dtype",
    "product_dtype",
    "autocast_disabled",
    "linear_in_range",
    "tracing",
    "exporting",
    "chunk_count",
    "chunk_length",
]


def accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    """At least float32 for sums, softmaxes and states; float64 stays float64 (gradcheck)."""
    return torch.promote_types(dtype, torch.float32)


def autocast_dtype(device: torch.device) -> torch.dtype | None:
    """The dtype ``torch.autocast`` casts to on ``device``, or None when autocast is off there."""
    try:
        if torch.is_autocast_enabled(device.type):
            return torch.get_autocast_dtype(device.type)
    except (RuntimeError, TypeError, ValueError):  # a device type autocast does not know (e.g. meta)
        pass
    return None


def result_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype a mechanism returns for inputs like ``x``: the autocast dtype under autocast (float64 excepted,
    as autocast never casts it), else x's own dtype."""
    cast_to = autocast_dtype(x.device)
    if cast_to is not None and x.is_floating_point() and x.dtype != torch.float64:
        return cast_to
    return x.dtype


def product_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype of the inputs of a chunked form's products for inputs like ``x``: bfloat16 when the result is
    bfloat16 (float32's range, so no product can overflow), else the accumulation dtype. Never float16: a
    normaliser-free numerator or a carried state outgrows 65504 at a few thousand tokens."""
    if result_dtype(x) == torch.bfloat16:
        return torch.bfloat16
    return accumulation_dtype(x.dtype)


def autocast_disabled(device: torch.device) -> contextlib.AbstractContextManager[object]:
    """A context in which autocast is off on ``device`` (a no-op context when it is off already)."""
    if autocast_dtype(device) is None:
        return contextlib.nullcontext()
    return torch.autocast(device.type, enabled=False)


def tracing() -> bool:
    """True while ``torch.compile`` or ``torch.export`` traces the code."""
    return bool(torch.compiler.is_compiling())


def exporting() -> bool:
    """True while ``torch.export`` traces the code, and not while ``torch.compile`` does.

    Reads the flag that ``torch.export`` sets (``torch.compiler._is_exporting_flag``) rather than calling
    ``torch.compiler.is_exporting()``: inside a dynamo trace some torch releases fold that call to True for
    ``torch.compile`` as well (torch 2.11 on an H200 did).
    """
    flag = getattr(torch.compiler, "_is_exporting_flag", None)
    if isinstance(flag, bool):
        return flag
    is_exporting = getattr(torch.compiler, "is_exporting", None)  # a torch without the flag
    return bool(is_exporting is not None and is_exporting())


def chunk_length(N: int, chunk_size: int) -> int:
    """The chunk length ell of a chunked form: ``chunk_size``, cut to N untraced (a longer chunk is the sequence,
    padded: its ell x ell scores of padding were computed and dropped). Traced it stays as given, so that one graph
    serves lengths on both sides of it."""
    return chunk_size if tracing() else min(chunk_size, N)


def chunk_count(N: int, C: int) -> int:
    """ceil(N / C), the chunks of C positions that a chunked form splits N positions into, and one more while traced.

    The extra (empty) chunk keeps a compiled graph, which specialises a size of one, from compiling again for one
    chunk. Under ``torch.export`` the count is a data-dependent size about which ``torch._check`` states what holds
    for every N >= 1, so the exported program is valid at every length.
    """
    if not tracing():
        return (N + C - 1) // C
    if not exporting():
        return (N + C - 1) // C + 1
    # an int64 tensor's item() is an int (an unbacked symbolic one here: int() would make the tracer guard on it)
    n = cast(int, torch.scalar_tensor(N, dtype=torch.int64).add(2 * C - 1).div(C, rounding_mode="floor").item())
    torch._check(n >= 2)
    torch._check(n * C >= N + 1)
    torch._check(n * C < N + 2 * C)
    return n


def linear_in_range(layer: nn.Linear, x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``layer(x)`` returned in ``dtype``, for an input ``x`` in a wider (accumulation) dtype.

    For a float16 result, each row of x is first divided by a power of two s >= 1 that brings it within
    [-1, 1] (exact: only the exponent changes), the product runs in float16, and ``s * (W x / s) + b`` is
    formed in float32 before the final rounding. A row whose entries exceed 65504 but whose projection does
    not thus gives a finite result, where rounding x to float16 first would give inf. The gradients are formed
    in x's dtype (:class:`_HalfLinear`), so that they too are finite wherever they fit float16. Other dtypes
    (bfloat16 has float32's range) are a plain cast and ``layer(x)``.
    """
    if dtype != torch.float16 or x.dtype == torch.float16 or layer.weight.dtype != torch.float16:
        y: torch.Tensor = layer(x.to(dtype))  # nn.Module.__call__ is untyped in torch
        return y
    out: torch.Tensor = _HalfLinear.apply(x, layer.weight, layer.bias)  # type: ignore[no-untyped-call]
    return out


class _HalfLinear(torch.autograd.Function):
    """x W^T + b in float16 for x in a wider dtype and a float16 W, b: the rows scaled into float16's range
    forwards (:func:`linear_in_range`); backwards the gradients x^T-wise in x's dtype. Through autograd the
    gradient of the float16 product would be g s, which overflows for a row of x beyond 65504 even where the
    gradients of x and W (g W and g^T x) fit float16."""

    # ctx: torch's FunctionCtx, whose type torch's forward and backward do not declare, hence Any.
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        wide = x.dtype
        peak = x.abs().amax(dim=-1, keepdim=True)  # (..., 1)
        peak = torch.nan_to_num(peak, nan=1.0, posinf=1.0).clamp_min(1.0)  # non-finite rows stay non-finite below
        scale = torch.exp2(torch.ceil(torch.log2(peak)))  # (..., 1), a power of two >= the row's largest entry
        y = F.linear((x / scale).to(weight.dtype), weight).to(wide) * scale  # (..., out), rows within [-1, 1]
        if bias is not None:
            y = y + bias.to(wide)
        ctx.save_for_backward(x, weight, bias)
        return y.to(weight.dtype)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, weight, bias = ctx.saved_tensors
        g = g.to(x.dtype)  # (..., out)
        gx = g @ weight.to(x.dtype) if ctx.needs_input_grad[0] else None  # (..., in)
        rows = g.reshape(-1, g.shape[-1])  # (rows, out)
        gw = (rows.T @ x.reshape(-1, x.shape[-1])).to(weight.dtype) if ctx.needs_input_grad[1] else None
        gb = rows.sum(0).to(bias.dtype) if bias is not None and ctx.needs_input_grad[2] else None
        return gx, gw, gb
