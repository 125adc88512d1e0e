"""Literal float64 definitions: the oracles that tests and the book check the fast code against.

Each function computes its mechanism exactly as the equations read: the N x M matrix written out,
sequences walked one step at a time. They are slow on purpose and never imported by the fast code.
Inputs are converted to float64; results are float64.
"""

from __future__ import annotations

import math

import torch

__all__ = ["softmax_attention"]


def _f64(*xs: torch.Tensor) -> list[torch.Tensor]:
    return [x.to(torch.float64) for x in xs]


def softmax_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    mask: torch.Tensor | None = None,
    scale: float | None = None,
    return_weights: bool = False,
):
    """out_i = sum_j A_ij v_j with A_ij = exp(s_ij) / sum_j' exp(s_ij') over allowed j, s_ij = scale q_i . k_j.

    q (B,H,N,D), k (B,H,M,D), v (B,H,M,Dv) -> (B,H,N,Dv) float64 (and A (B,H,N,M) with
    ``return_weights``). A row with no allowed key has all-zero weights.
    """
    q, k, v = _f64(q, k, v)
    N, M, D = q.shape[-2], k.shape[-2], q.shape[-1]
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    scores = torch.einsum("bhnd,bhmd->bhnm", q, k) * scale  # (B, H, N, M)
    allowed = torch.ones(N, M, dtype=torch.bool, device=q.device)
    if causal:
        allowed = allowed.tril()
    if mask is not None:
        allowed = allowed & mask
    allowed = allowed.expand_as(scores)
    row_max = scores.masked_fill(~allowed, -math.inf).amax(dim=-1, keepdim=True)
    row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
    numer = torch.exp(scores - row_max) * allowed  # (B, H, N, M), zero where not allowed
    denom = numer.sum(dim=-1, keepdim=True)
    weights = numer / torch.where(denom > 0, denom, torch.ones_like(denom))
    out = torch.einsum("bhnm,bhmv->bhnv", weights, v)  # (B, H, N, Dv)
    return (out, weights) if return_weights else out
