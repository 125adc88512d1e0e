"""The annex's non-causal linear attention for the CPU, without autograd: the plain form in fewer passes.

Speed only: :func:`attnbook.linear_attention` computes the same numbers (to rounding) as

    S = phi(K)^T V,   z = phi(K)^T 1,   out = (phi(Q) S) / (phi(Q) z + eps)

At a few tens of MiB per tensor most of the plain form's time goes to memory: every new tensor of that size
costs a page fault per 4 KiB the first time it is written, and every elementwise step is a pass over memory.
Here phi(k) is made in one new tensor and phi(q) is written over it once S and z are summed up, the +1 of elu
and the division happen in place, and phi(Q) z is a row vector times a matrix (a column product with one
column is a slow path of CPU BLAS). A dozen operations in all, none of them small, so that a machine shared
with other work slows it no more than it slows the plain form (``benchmarks/bench_annex.py``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["linear_attention_inference"]


def _features_(kind: str, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """The built-in feature map ``kind`` ("elu": elu(x) + 1, "relu") of x, into ``out`` when given."""
    if kind == "elu":
        f = F.elu(x) if out is None else torch.ops.aten.elu.out(x, out=out)
        return f.add_(1.0)
    return torch.clamp(x, min=0.0) if out is None else torch.clamp(x, min=0.0, out=out)


def linear_attention_inference(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kind: str, keep: torch.Tensor | None, eps: float
) -> torch.Tensor:
    """Non-causal linear attention without autograd on q (B, H, N, D), k (B, H, M, D), v (B, H, M, Dv) of one
    (accumulation) dtype, validated, padded keys' k and v already zero (``keep`` (B, 1, M, 1), True = a real
    key); phi = the built-in ``kind``. Returns (B, H, N, Dv)."""
    f = _features_(kind, k)  # (B, H, M, R)
    if keep is not None:
        f.masked_fill_(keep.logical_not(), 0.0)  # phi(0) need not be 0
    S = f.transpose(-2, -1) @ v  # (B, H, R, Dv)
    z = f.sum(-2, keepdim=True)  # (B, H, 1, R)
    fq = _features_(kind, q, out=f if q.shape == k.shape else None)  # (B, H, N, R), over phi(k) when it fits
    out = fq @ S  # (B, H, N, Dv)
    den = (z @ fq.transpose(-2, -1)).transpose(-2, -1).add_(eps)  # (B, H, N, 1)
    return out.div_(den.masked_fill_(den == 0, 1.0))  # 0 / 1 where nothing has weight (eps = 0)
