"""Causal (prefix) products without an N x N matrix: the machinery shared by causal linear and flow attention.

    out_i = sum_{j <= i} (q_i . k_j) v_j

computed chunk by chunk (Katharopoulos et al., 2020, Sec. 3.3; the chunked form of e.g. Hua et al., 2022):
inside a chunk of C positions the products are exact and masked (a C x C matrix), between chunks a state
S = sum_j k_j v_j^T of shape (D, Dv) is carried. Extra memory O(B H (C^2 + C (D + Dv) + D Dv)) beside the
output; time O(B H N (C + D) Dv). The result does not depend on C (up to rounding).
"""

from __future__ import annotations

import torch

from ._checks import accumulation_dtype

__all__ = ["causal_dot_product"]


def causal_dot_product(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, chunk_size: int = 64) -> torch.Tensor:
    """out_i = sum_{j<=i} (q_i . k_j) v_j for q, k (B, H, N, D), v (B, H, N, Dv) -> (B, H, N, Dv).

    Accumulates in at least float32 and returns that accumulation dtype (callers cast back).
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive int, got {chunk_size}")
    acc = accumulation_dtype(q.dtype)
    B, H, N, D = q.shape
    Dv = v.shape[-1]
    C = min(chunk_size, N)
    tril = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
    state = q.new_zeros(B, H, D, Dv, dtype=acc)  # sum_{j < chunk start} k_j v_j^T
    outs = []
    for start in range(0, N, C):
        qc = q[..., start:start + C, :].to(acc)  # (B, H, c, D)
        kc = k[..., start:start + C, :].to(acc)  # (B, H, c, D)
        vc = v[..., start:start + C, :].to(acc)  # (B, H, c, Dv)
        c = qc.shape[-2]
        scores = (qc @ kc.transpose(-2, -1)).masked_fill(~tril[:c, :c], 0.0)  # (B, H, c, c)
        outs.append(scores @ vc + qc @ state)  # (B, H, c, Dv)
        state = state + kc.transpose(-2, -1) @ vc  # (B, H, D, Dv)
    return torch.cat(outs, dim=-2)  # (B, H, N, Dv)
