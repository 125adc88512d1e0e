"""Input validation shared by every mechanism: clear ``ValueError``s that quote the shapes received."""

from __future__ import annotations

import torch

__all__ = ["check_qkv", "check_bool_mask", "check_key_padding_mask", "accumulation_dtype"]


def _shape(x: torch.Tensor) -> str:
    return "(" + ", ".join(str(s) for s in x.shape) + ")"


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
            raise ValueError(f"{name}: {label} must have 4 dimensions (B, H, N, D), got shape {_shape(x)}")
        if not x.is_floating_point():
            raise ValueError(f"{name}: {label} must be floating point, got dtype {x.dtype}")
    shapes = f"q {_shape(q)}, k {_shape(k)}, v {_shape(v)}"
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
    if same_length and N != M:
        raise ValueError(f"{name}: needs as many queries as keys (N == M): {shapes}")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"{name}: q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"{name}: q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    for label, x in (("N", N), ("M", M), ("D", D), ("Dv", Dv)):
        if x == 0:
            raise ValueError(f"{name}: {label} must be at least 1: {shapes}")
    return B, H, N, M, D, Dv


def check_bool_mask(mask: torch.Tensor, target: tuple[int, int, int, int], *, name: str) -> torch.Tensor:
    """Validate a bool mask broadcastable to ``target`` (B, H, N, M); return it expanded to 4-D view."""
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
        got = mask.dtype if isinstance(mask, torch.Tensor) else type(mask).__name__
        raise ValueError(f"{name}: mask must be a bool tensor (True = may attend), got {got}")
    problem = f"{name}: mask of shape {_shape(mask)} does not broadcast to (B, H, N, M) = {tuple(target)}"
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
        raise ValueError(f"{name}: key_padding_mask must have shape (B, M) = ({B}, {M}), got {_shape(mask)}")
    return mask


def accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    """At least float32 for sums, softmaxes and states; float64 stays float64 (gradcheck)."""
    return torch.promote_types(dtype, torch.float32)
