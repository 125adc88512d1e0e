"""How the mechanisms run: in which dtype, under autocast or not, with or without autograd, in how many groups.

Every mechanism follows the same rules, written once here:

* **Accumulation.** Feature maps, softmaxes, sums, normalisers and recurrent states are computed in
  :func:`accumulation_dtype` of the inputs: at least float32 (float64 stays float64, for gradcheck).
* **Autocast.** Under ``torch.autocast`` a mechanism behaves like torch's own attention,
  ``scaled_dot_product_attention``: inputs of any floating dtype but float64 count as the autocast dtype, and
  the result comes back in :func:`result_dtype` (the autocast dtype; float64 inputs give float64). Inside, the
  package switches autocast off (:func:`autocast_disabled`) so that its float32 accumulation really happens in
  float32; the backward pass then runs in the dtypes of the forward. Modules therefore behave like torch
  layers: under autocast their output is in the autocast dtype, whatever the dtype of their parameters.
* **Range.** A result that float16 can hold is never lost to an intermediate that it cannot:
  :func:`linear_in_range` applies an output projection to an accumulation-dtype input without first rounding
  that input to float16 (where it may exceed 65504).
* **Inference.** Without autograd (:func:`needs_autograd` is false) the mechanisms process independent rows of
  the batch in groups (:func:`rows_per_group`), writing into one preallocated output.
* **Graphs.** Under ``torch.compile`` and ``torch.export`` (:func:`tracing`) every mechanism takes its *graph
  path*: the same numbers, written without Python loops over sizes, ``out=`` writes or branches on a size, so
  that one graph serves every batch size and length (:func:`chunk_count` gives a chunked algorithm its number
  of chunks as a size the tracer can reason about).
"""

from __future__ import annotations

import contextlib
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "accumulation_dtype",
    "autocast_dtype",
    "result_dtype",
    "autocast_disabled",
    "needs_autograd",
    "ROW_POSITIONS",
    "WORK_NUMBERS",
    "rows_per_group",
    "linear_in_range",
    "tracing",
    "exporting",
    "chunk_count",
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
    cast = autocast_dtype(x.device)
    if cast is not None and x.is_floating_point() and x.dtype != torch.float64:
        return cast
    return x.dtype


def autocast_disabled(device: torch.device) -> contextlib.AbstractContextManager[object]:
    """A context in which autocast is off on ``device`` (a no-op context when it is off already)."""
    if autocast_dtype(device) is None:
        return contextlib.nullcontext()
    return torch.autocast(device.type, enabled=False)


def tracing() -> bool:
    """True while ``torch.compile`` or ``torch.export`` traces the code (the graph path is taken)."""
    is_compiling = getattr(torch.compiler, "is_compiling", None)
    if is_compiling is not None:
        return bool(is_compiling())
    return bool(torch._dynamo.is_compiling())  # torch < 2.3


def exporting() -> bool:
    """True while ``torch.export`` traces the code, and not while ``torch.compile`` does.

    Reads the flag that ``torch.export`` sets (``torch.compiler._is_exporting_flag``) rather than calling
    ``torch.compiler.is_exporting()``: inside a dynamo trace some torch releases fold that call to True for
    ``torch.compile`` as well (torch 2.11 on an H200 did: compiled causal linear attention took the export path,
    with a graph break at its ``item()``, and inductor failed on it under ``dynamic=True``).
    """
    flag = getattr(torch.compiler, "_is_exporting_flag", None)
    if isinstance(flag, bool):
        return flag
    is_exporting = getattr(torch.compiler, "is_exporting", None)  # a torch without the flag
    return bool(is_exporting is not None and is_exporting())


def chunk_count(N: int, C: int) -> int:
    """ceil(N / C), the chunks of a chunked algorithm over N positions, as a size every tracer handles.

    Eagerly and under ``torch.compile`` a plain int (a symbolic one under dynamic shapes). Under ``torch.export``
    the export's shape reasoning cannot prove facts about a floor division of a dynamic size (that it is not 1,
    that padding to it is not a no-op), so an exported program would hold only for some lengths; there the
    count is made a data-dependent size, about which ``torch._check`` states what is true for every N >= 1, and
    the program is valid at every length.
    """
    if not exporting():
        return (N + C - 1) // C
    # an int64 tensor's item() is an int (an unbacked symbolic one here: int() would make the tracer guard on it)
    n = cast(int, torch.scalar_tensor(N, dtype=torch.int64).add(C - 1).div(C, rounding_mode="floor").item())
    torch._check(n >= 1)
    torch._check(n * C >= N)
    torch._check(n * C < N + C)
    return n


def needs_autograd(*xs: object) -> bool:
    """True when a graph will be recorded through any of ``xs`` (tensors, or modules with parameters)."""
    if not torch.is_grad_enabled():
        return False
    for x in xs:
        if isinstance(x, torch.Tensor) and x.requires_grad:
            return True
        if isinstance(x, nn.Module) and any(p.requires_grad for p in x.parameters()):
            return True
    return False


# Group sizes of independent rows on the no-autograd CPU path. One rule (:func:`rows_per_group`), two budgets
# for the two kinds of work:
#
# * ROW_POSITIONS, in positions, for work made of many O(N D) passes (the flows of Flow- and
#   Mobile-Attention): small enough for a group's features and temporaries to stay in a shared L3 cache,
#   large enough that a busy machine does not pay a thread wake-up for each of the many small operations
#   (measured at N = 4096 with flow attention: 4096 and 16384 run alike on one thread, but with two threads
#   on a loaded 2-core machine 4096 was 3x slower);
# * WORK_NUMBERS, in numbers, for work made of a few large products (non-causal linear attention): the
#   features of one group, written into a buffer allocated once per call. Under 32 MiB, such a buffer is
#   reused from the heap on the next call, where a fresh tensor of 32 MiB or more costs a page fault per
#   4 KiB (malloc maps it anew each time); but every group costs a few multi-threaded operations, which on a
#   busy CPU wait for a core (B=4, H=8, N=4096, D=64, 2 threads: four groups of 8 MiB were 1.4x faster
#   than one group on a quiet machine and 1.3x slower beside another busy process; two of 16 MiB ran at the
#   speed of one there).
ROW_POSITIONS = 16384
WORK_NUMBERS = 1 << 22


def rows_per_group(x: torch.Tensor, per_row: int, rows: int, *, numbers: bool = False) -> int:
    """How many independent rows to process at once without autograd: on the CPU about :data:`ROW_POSITIONS`
    positions (``per_row`` positions per row), or with ``numbers`` about :data:`WORK_NUMBERS` numbers
    (``per_row`` numbers per row); on other devices all of them (one launch)."""
    if x.device.type != "cpu":
        return rows
    budget = WORK_NUMBERS if numbers else ROW_POSITIONS
    return max(1, min(rows, budget // max(1, per_row)))


def linear_in_range(layer: nn.Linear, x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``layer(x)`` returned in ``dtype``, for an input ``x`` in a wider (accumulation) dtype.

    For a float16 result, each row of x is first divided by a power of two s >= 1 that brings it within
    [-1, 1] (exact: only the exponent changes), the product runs in float16, and ``s * (W x / s) + b`` is
    formed in float32 before the final rounding. A row whose entries exceed 65504 but whose projection does
    not thus gives a finite result, where rounding x to float16 first would give inf. Other dtypes (bfloat16
    has float32's range) are a plain cast and ``layer(x)``.
    """
    if dtype != torch.float16 or x.dtype == torch.float16:
        y: torch.Tensor = layer(x.to(dtype))  # nn.Module.__call__ is untyped in torch
        return y
    wide = x.dtype
    peak = x.detach().abs().amax(dim=-1, keepdim=True)  # (..., 1)
    peak = torch.nan_to_num(peak, nan=1.0, posinf=1.0).clamp_min(1.0)  # non-finite rows stay non-finite below
    scale = torch.exp2(torch.ceil(torch.log2(peak)))  # (..., 1), a power of two >= the row's largest entry
    y = F.linear((x / scale).to(dtype), layer.weight.to(dtype))  # (..., out), rows within [-1, 1]
    y = y.to(wide) * scale
    if layer.bias is not None:
        y = y + layer.bias.to(wide)
    return y.to(dtype)
