"""Causal (prefix) products without an N x N matrix: the machinery shared by causal linear and flow attention.

    out_i = sum_{j <= i} (q_i . k_j) v_j

computed chunk by chunk (Katharopoulos et al., 2020, Sec. 3.3; the chunked form of e.g. Hua et al., 2022):
inside a chunk of C positions the products are exact and masked (a C x C matrix), between chunks a state
S = sum_j k_j v_j^T of shape (D, Dv) is carried. The result does not depend on C (up to rounding).

To keep the number of (small) operations low, G consecutive chunks form a block that is processed with
batched products: the per-chunk sums k^T v of a block are prefix-summed over the chunks, and only the state
at the block's end is carried on. Memory beside the output is O(B H (L C + G D Dv)) for a block of L = G C
positions, independent of N.

The backward pass (a custom ``autograd.Function``) saves only q, k and v and recomputes chunks instead of
storing per-chunk states: with g the output gradient,

    dq_i = sum_{j <= i} (g_i . v_j) k_j,   dk_j = sum_{i >= j} (v_j . g_i) q_i,   dv_j = sum_{i >= j} (k_j . q_i) g_i

are three more prefix products (the last two running backwards in time), as in fast-transformers' CUDA
kernel. Time O(B H N (C + D) Dv) forward, three times that backward; nothing of size N x N or N x D x Dv.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from ._checks import accumulation_dtype

__all__ = ["causal_dot_product"]

_BLOCK_TOKENS = 1024  # L: positions handled by one batch of products


def _chunks_per_block(C: int, D: int, Dv: int) -> int:
    """G such that a block has about _BLOCK_TOKENS positions and its G (D, Dv) states are no bigger than
    its q, k, v (G D Dv <= L (D + Dv)): memory per block stays O(L (C + D + Dv))."""
    by_tokens = max(1, _BLOCK_TOKENS // C)
    by_states = max(1, (_BLOCK_TOKENS * (D + Dv)) // (D * Dv))
    return min(by_tokens, by_states)


def _prefix_product_into(out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, C: int,
                         reverse: bool = False) -> torch.Tensor:
    """Write sum_{j <= i} (q_i . k_j) v_j (``reverse``: sum over j >= i) into ``out`` (B, H, N, Dv).

    q, k (B, H, N, D), v (B, H, N, Dv), all of out's dtype. No autograd (called under no_grad).
    """
    B, H, N, D = q.shape
    Dv = v.shape[-1]
    C = min(C, N)
    G = _chunks_per_block(C, D, Dv)
    L = G * C
    keep = torch.ones(C, C, dtype=torch.bool, device=q.device)
    keep = keep.triu() if reverse else keep.tril()  # (C, C): which key j of a chunk query i may see
    carry = q.new_zeros(B, H, 1, D, Dv)  # sum of k_j v_j^T over the blocks already done
    starts = range(0, N, L)
    for s in reversed(starts) if reverse else starts:
        e = min(s + L, N)
        n = e - s
        g = -(-n // C)  # chunks in this block; the last may be partial: pad it with zeros
        qb, kb, vb = q[..., s:e, :], k[..., s:e, :], v[..., s:e, :]
        if g * C != n:
            # zero keys and values add nothing; padded queries give rows that are dropped below
            qb, kb, vb = (torch.nn.functional.pad(x, (0, 0, 0, g * C - n)) for x in (qb, kb, vb))
        qc = qb.reshape(B, H, g, C, D)  # (B, H, g, C, D)
        kc = kb.reshape(B, H, g, C, D)  # (B, H, g, C, D)
        vc = vb.reshape(B, H, g, C, Dv)  # (B, H, g, C, Dv)
        scores = qc @ kc.transpose(-2, -1)  # (B, H, g, C, C)
        scores.masked_fill_(~keep, 0.0)
        o = scores @ vc  # (B, H, g, C, Dv): inside each chunk
        del scores
        kv = kc.transpose(-2, -1) @ vc  # (B, H, g, D, Dv): each chunk's sum k_j v_j^T
        if reverse:
            inclusive = kv.flip(2).cumsum(2).flip(2)  # (B, H, g, D, Dv): sum over chunks >= this one
            states = torch.cat([inclusive[:, :, 1:], torch.zeros_like(carry)], dim=2) + carry
            carry = carry + inclusive[:, :, :1]  # (B, H, 1, D, Dv)
        else:
            inclusive = kv.cumsum(2)  # (B, H, g, D, Dv): sum over chunks <= this one
            states = torch.cat([torch.zeros_like(carry), inclusive[:, :, :-1]], dim=2) + carry
            carry = carry + inclusive[:, :, -1:]  # (B, H, 1, D, Dv)
        del kv, inclusive
        o += qc @ states  # (B, H, g, C, Dv): plus everything in earlier (later) chunks
        out[..., s:e, :] = o.reshape(B, H, g * C, Dv)[..., :n, :]
    return out


def _prefix_product(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, C: int, reverse: bool = False):
    out = q.new_empty(*q.shape[:-1], v.shape[-1])  # (B, H, N, Dv)
    return _prefix_product_into(out, q, k, v, C, reverse)


class _CausalDotProduct(torch.autograd.Function):
    """sum_{j<=i} (q_i . k_j) v_j; backward recomputes chunks (three prefix products), saving only q, k, v."""

    @staticmethod
    def forward(ctx, q, k, v, chunk_size):
        ctx.save_for_backward(q, k, v)
        ctx.chunk_size = chunk_size
        return _prefix_product(q, k, v, chunk_size)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        q, k, v = ctx.saved_tensors
        C = ctx.chunk_size
        grad = grad.contiguous()
        dq = _prefix_product(grad, v, k, C) if ctx.needs_input_grad[0] else None
        dk = _prefix_product(v, grad, q, C, reverse=True) if ctx.needs_input_grad[1] else None
        dv = _prefix_product(k, q, grad, C, reverse=True) if ctx.needs_input_grad[2] else None
        return dq, dk, dv, None


def causal_dot_product(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, chunk_size: int = 64) -> torch.Tensor:
    """out_i = sum_{j<=i} (q_i . k_j) v_j for q, k (B, H, N, D), v (B, H, N, Dv) -> (B, H, N, Dv).

    Accumulates in at least float32 and returns that accumulation dtype (callers cast back).
    Differentiable once (the backward pass is itself not differentiable).
    """
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive int, got {chunk_size}")
    acc = accumulation_dtype(q.dtype)
    return _CausalDotProduct.apply(q.to(acc), k.to(acc), v.to(acc), chunk_size)
