"""The one place that validates input and words the errors.

Every public function, module and widget helper of the package checks its arguments here, before any torch
internals run, and every message has one shape::

    <where>: <argument> must be <what was expected>, got <what was received>

A wrong *type* raises ``TypeError``, a right type with a wrong value ``ValueError``. Shapes are quoted as
``(B, H, N, D)`` tuples; values with ``repr``.
"""

from __future__ import annotations

import math
import numbers

import torch

__all__ = [
    "shape_str",
    "describe",
    "check_int",
    "check_number",
    "check_bool",
    "check_probability",
    "check_eps",
    "check_chunk_size",
    "check_tensor",
    "check_step_inputs",
    "check_moh_heads",
    "check_qkv",
    "check_bool_mask",
    "check_key_padding_mask",
    "accumulation_dtype",
]


def shape_str(x: torch.Tensor) -> str:
    """``(2, 3, 4)``: a tensor's shape as it is quoted in messages."""
    return "(" + ", ".join(str(s) for s in x.shape) + ")"


def describe(value) -> str:
    """How a received value is quoted: tensors by dtype and shape, everything else by ``repr`` (shortened)."""
    if isinstance(value, torch.Tensor):
        return f"a {str(value.dtype).removeprefix('torch.')} tensor of shape {shape_str(value)}"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def check_int(value, arg: str, *, name: str, minimum: int | None = None, maximum: int | None = None) -> int:
    """``value`` as an int in [minimum, maximum]; bools, floats (even 3.0), strings and tensors are refused."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name}: {arg} must be an int, got {describe(value)}")
    value = int(value)
    if minimum is not None and value < minimum or maximum is not None and value > maximum:
        if maximum is None:
            expected = f"an int >= {minimum}"
        elif minimum is None:
            expected = f"an int <= {maximum}"
        else:
            expected = f"an int in {minimum}..{maximum}"
        raise ValueError(f"{name}: {arg} must be {expected}, got {value!r}")
    return value


def check_number(
    value,
    arg: str,
    *,
    name: str,
    minimum: float | None = None,
    maximum: float | None = None,
    strict_minimum: bool = False,
    strict_maximum: bool = False,
) -> float:
    """``value`` as a finite float within the bounds; bools, strings, tensors, NaN and infinities are refused."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name}: {arg} must be a number, got {describe(value)}")
    value = float(value)
    low_bad = minimum is not None and (value <= minimum if strict_minimum else value < minimum)
    high_bad = maximum is not None and (value >= maximum if strict_maximum else value > maximum)
    if not math.isfinite(value) or low_bad or high_bad:
        parts = []
        if minimum is not None:
            parts.append(f"{'>' if strict_minimum else '>='} {minimum:g}")
        if maximum is not None:
            parts.append(f"{'<' if strict_maximum else '<='} {maximum:g}")
        expected = "a finite number" + (" " + " and ".join(parts) if parts else "")
        raise ValueError(f"{name}: {arg} must be {expected}, got {value!r}")
    return value


def check_bool(value, arg: str, *, name: str) -> bool:
    """``value`` if it is a bool (``True``/``False``); the string ``"False"`` or the int 1 are refused."""
    if not isinstance(value, bool):
        raise TypeError(f"{name}: {arg} must be True or False, got {describe(value)}")
    return value


def check_probability(value, arg: str, *, name: str) -> float:
    """A dropout-like probability in [0, 1)."""
    return check_number(value, arg, name=name, minimum=0.0, maximum=1.0, strict_maximum=True)


def check_eps(eps, *, name: str) -> float:
    """The eps of a normaliser: a finite number >= 0."""
    return check_number(eps, "eps", name=name, minimum=0.0)


def check_chunk_size(chunk_size, *, name: str) -> int:
    """The chunk (block) length of a causal algorithm: an int >= 1."""
    return check_int(chunk_size, "chunk_size", name=name, minimum=1)


def check_tensor(x, arg: str, *, name: str, dims: int | None = None, layout: str = "") -> torch.Tensor:
    """``x`` if it is a floating-point tensor (with ``dims`` dimensions, named by ``layout`` in messages)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: {arg} must be a torch.Tensor, got {describe(x)}")
    if dims is not None and x.dim() != dims:
        raise ValueError(f"{name}: {arg} must have {dims} dimensions {layout}".rstrip() + f", got {describe(x)}")
    if not x.is_floating_point():
        raise TypeError(f"{name}: {arg} must be a floating-point tensor, got {describe(x)}")
    return x


def check_step_inputs(
    q_t: torch.Tensor, k_t: torch.Tensor, v_t: torch.Tensor, *, name: str
) -> tuple[int, int, int, int]:
    """One token of a recurrent step: q_t, k_t (B, H, D) and v_t (B, H, Dv) alike; returns (B, H, D, Dv)."""
    for label, x in (("q_t", q_t), ("k_t", k_t), ("v_t", v_t)):
        check_tensor(x, label, name=name, dims=3, layout="(B, H, D)")
    shapes = f"q_t {shape_str(q_t)}, k_t {shape_str(k_t)}, v_t {shape_str(v_t)}"
    if q_t.shape != k_t.shape or v_t.shape[:2] != q_t.shape[:2]:
        raise ValueError(f"{name}: q_t, k_t must be (B, H, D) of one shape and v_t (B, H, Dv), got {shapes}")
    if not (q_t.dtype == k_t.dtype == v_t.dtype):
        raise ValueError(f"{name}: q_t, k_t, v_t must share a dtype, got {q_t.dtype}, {k_t.dtype}, {v_t.dtype}")
    if not (q_t.device == k_t.device == v_t.device):
        raise ValueError(f"{name}: q_t, k_t, v_t must be on one device, got {q_t.device}, {k_t.device}, {v_t.device}")
    B, H, D = q_t.shape
    Dv = v_t.shape[-1]
    if D == 0 or Dv == 0:
        raise ValueError(f"{name}: D and Dv must be at least 1, got {shapes}")
    return B, H, D, Dv


def check_moh_heads(num_heads, shared_head, routed_head, *, name: str) -> tuple[int, int, int]:
    """Mixture-of-head head counts (Jin et al. 2024): H heads, h_s shared, each token routes to k of the rest.

    Valid: ``routed_head = 0`` with every head shared (``shared_head = num_heads``), or ``routed_head >= 1`` with
    ``shared_head + routed_head <= num_heads``. Anything else leaves heads no token can use, or asks for more
    heads than there are; the message says which. Returns (H, h_s, k).
    """
    H = check_int(num_heads, "num_heads", name=name, minimum=1)
    s = check_int(shared_head, "shared_head", name=name, minimum=0)
    k = check_int(routed_head, "routed_head", name=name, minimum=0)
    heads = f"num_heads={H}, shared_head={s}, routed_head={k}"
    if s > H:
        raise ValueError(f"{name}: shared_head must be at most num_heads, got more shared heads than heads ({heads})")
    if k == 0 and s == 0:
        raise ValueError(
            f"{name}: no head would ever be used: with routed_head=0 every head must be shared "
            f"(shared_head=num_heads) ({heads})"
        )
    if k == 0 and s < H:
        raise ValueError(
            f"{name}: with routed_head=0 no token can choose the {H - s} non-shared heads, so they would never be "
            f"used; set shared_head=num_heads or routed_head >= 1 ({heads})"
        )
    if s + k > H:
        raise ValueError(
            f"{name}: each token would use shared_head + routed_head = {s + k} heads but there are only {H}; "
            f"routed_head must be at most num_heads - shared_head = {H - s} ({heads})"
        )
    return H, s, k


def check_qkv(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, name: str, same_length: bool = False
) -> tuple[int, int, int, int, int, int]:
    """Validate q (B,H,N,D), k (B,H,M,D), v (B,H,M,Dv); return (B, H, N, M, D, Dv).

    Raises ``ValueError`` naming the offending shapes. ``same_length`` demands N == M.
    """
    for label, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor):
            raise ValueError(f"{name}: {label} must be a torch.Tensor, got {type(x).__name__}")
        if x.dim() != 4:
            raise ValueError(f"{name}: {label} must have 4 dimensions (B, H, N, D), got shape {shape_str(x)}")
        if not x.is_floating_point():
            raise ValueError(f"{name}: {label} must be floating point, got dtype {x.dtype}")
    shapes = f"q {shape_str(q)}, k {shape_str(k)}, v {shape_str(v)}"
    B, H, N, D = q.shape
    _, _, M, _ = k.shape
    Dv = v.shape[-1]
    if k.shape[0] != B or v.shape[0] != B:
        raise ValueError(f"{name}: batch sizes B differ: {shapes}")
    if k.shape[1] != H or v.shape[1] != H:
        raise ValueError(f"{name}: head counts H differ: {shapes}")
    if k.shape[3] != D:
        raise ValueError(f"{name}: q and k must share the feature size D: {shapes}")
    if v.shape[2] != M:
        raise ValueError(f"{name}: k and v must share the key length M: {shapes}")
    for label, x in (("N", N), ("M", M), ("D", D), ("Dv", Dv)):
        if x == 0:
            raise ValueError(f"{name}: {label} must be at least 1: {shapes}")
    if same_length and N != M:
        raise ValueError(f"{name}: needs as many queries as keys (N == M): {shapes}")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"{name}: q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"{name}: q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    return B, H, N, M, D, Dv


def check_bool_mask(mask: torch.Tensor, target: tuple[int, int, int, int], *, name: str) -> torch.Tensor:
    """Validate a bool mask broadcastable to ``target`` (B, H, N, M); return it expanded to 4-D view."""
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
        got = mask.dtype if isinstance(mask, torch.Tensor) else type(mask).__name__
        raise ValueError(f"{name}: mask must be a bool tensor (True = may attend), got {got}")
    problem = f"{name}: mask of shape {shape_str(mask)} does not broadcast to (B, H, N, M) = {tuple(target)}"
    if mask.dim() > 4:
        raise ValueError(problem)
    try:
        return mask.expand(target)
    except RuntimeError:
        raise ValueError(problem) from None


def check_key_padding_mask(mask: torch.Tensor, B: int, M: int, *, name: str) -> torch.Tensor:
    """Validate a (B, M) bool key padding mask, True = real token."""
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
        got = mask.dtype if isinstance(mask, torch.Tensor) else type(mask).__name__
        raise ValueError(f"{name}: key_padding_mask must be a bool tensor (True = real token), got {got}")
    if tuple(mask.shape) != (B, M):
        raise ValueError(f"{name}: key_padding_mask must have shape (B, M) = ({B}, {M}), got {shape_str(mask)}")
    return mask


def accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    """At least float32 for sums, softmaxes and states; float64 stays float64 (gradcheck)."""
    return torch.promote_types(dtype, torch.float32)
