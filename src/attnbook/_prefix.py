"""Causal (prefix) products without an N x N matrix: the numerator of causal linear attention.

    out_i = sum_{j <= i} (q_i . k_j) v_j

computed chunk by chunk (Katharopoulos et al., 2020, Sec. 3.3; the chunked form of e.g. Hua et al., 2022):
inside a chunk of C positions the products are exact and masked (a C x C matrix), between chunks a state
S = sum_j k_j v_j^T of shape (D, Dv) is carried. The result does not depend on C (up to rounding).

To keep the number of operations low, a block of G consecutive chunks (of r rows of B H at once) is processed
with batched products: the per-chunk sums k^T v of a block are prefix-summed over the chunks, and only the
state at the block's end is carried on. A block's temporaries are bounded by a fixed budget, so the extra
memory beside the output is O(D Dv + budget), independent of N.

The backward pass (a custom ``autograd.Function``) saves only q, k and v and recomputes chunks instead of
storing per-chunk states: with g the output gradient,

    dq_i = sum_{j <= i} (g_i . v_j) k_j,   dk_j = sum_{i >= j} (v_j . g_i) q_i,   dv_j = sum_{i >= j} (k_j . q_i) g_i

are three more prefix products (the last two running backwards in time), as in fast-transformers' CUDA
kernel. Time O(B H N (C + D) Dv) forward, three times that backward; nothing of size N x N or N x D x Dv.
Because the backward is made of the same (differentiable) products, derivatives of every order are exact:
``torch.autograd.gradgradcheck`` passes.

Causal Flow-Attention does not use this product: its blocks (:func:`attnbook.flow.flow_attention`) carry more
prefix sums than k v^T, and compute the in-block masked product themselves.
"""

from __future__ import annotations

import torch

from ._checks import check_chunk_size, check_qkv
from ._runtime import accumulation_dtype, autocast_disabled

__all__ = ["causal_dot_product", "prefix_product"]

_BLOCK_NUMBERS = 1 << 22  # temporaries of one block of products, in numbers (16 MiB in float32)


def _plan(rows: int, N: int, C: int, D: int, Dv: int) -> tuple[int, int]:
    """(r, G): rows of (B H) and chunks per block, so that a block's temporaries stay within a fixed budget.

    A chunk costs C^2 numbers of scores and 2 D Dv of per-chunk states, so r G <= budget / (C^2 + 2 D Dv):
    the extra memory beside the output does not grow with N. Several rows at once only when a block spans
    whole rows (then the rows are contiguous in memory and the batched products need no copies).
    """
    per_block = max(1, _BLOCK_NUMBERS // (C * C + 2 * D * Dv))  # r G at most
    full = N // C
    if per_block >= full and full * C == N:
        return max(1, min(rows, per_block // full)), full
    return 1, min(full, per_block)


def prefix_product(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, C: int, reverse: bool = False, out: torch.Tensor | None = None
) -> torch.Tensor:
    """sum_{j <= i} (q_i . k_j) v_j (``reverse``: over j >= i) for q, k (..., N, D), v (..., N, Dv).

    The unchecked kernel: q, k, v of one dtype and device, already validated; no autograd (it is called from
    the autograd.Function, or under no_grad) and no autocast (the caller switches it off). Written into
    ``out`` (contiguous, (..., N, Dv), q's dtype) when given. Chunks are aligned to the start of the sequence
    (to its end when ``reverse``); the partial chunk that remains is done last.
    """
    *lead, N, D = q.shape
    Dv = v.shape[-1]
    q = q.contiguous().view(-1, N, D)  # (BH, N, D)
    k = k.contiguous().view(-1, N, D)  # (BH, N, D)
    v = v.contiguous().view(-1, N, Dv)  # (BH, N, Dv)
    rows = q.shape[0]
    result = q.new_empty(rows, N, Dv) if out is None else out  # (BH, N, Dv)
    out = result.view(rows, N, Dv)
    C = min(C, N)
    full = N // C  # whole chunks
    part = N - full * C  # positions in the partial chunk
    base = part if reverse else 0  # first position of the whole chunks
    r_max, G = _plan(rows, N, C, D, Dv)
    for r0 in range(0, rows, r_max):
        r1 = min(r0 + r_max, rows)
        r = r1 - r0
        carry = None  # (r, 1, D, Dv): sum of k_j v_j^T over the blocks already done
        blocks = range(0, full, G)
        for g0 in reversed(blocks) if reverse else blocks:
            g = min(G, full - g0)
            span = slice(base + g0 * C, base + (g0 + g) * C)
            q3 = q[r0:r1, span].reshape(r * g, C, D)  # (r g, C, D), a view when rows are whole
            k3 = k[r0:r1, span].reshape(r * g, C, D)  # (r g, C, D)
            v3 = v[r0:r1, span].reshape(r * g, C, Dv)  # (r g, C, Dv)
            o3 = out[r0:r1, span].view(r * g, C, Dv)  # (r g, C, Dv), written in place
            scores = torch.bmm(q3, k3.transpose(1, 2))  # (r g, C, C)
            scores = scores.triu_() if reverse else scores.tril_()
            torch.bmm(scores, v3, out=o3)  # inside each chunk
            del scores
            kv = torch.bmm(k3.transpose(1, 2), v3).view(r, g, D, Dv)  # each chunk's sum k_j v_j^T
            # states: the sum over the chunks before (after) each chunk, shifted by one rather than
            # inclusive - kv, which would lose small sums next to a large kv
            states = torch.empty_like(kv)  # (r, g, D, Dv)
            if reverse:
                torch.cumsum(kv[:, 1:].flip(1), 1, out=states[:, :-1])  # backwards, reversed
                states[:, :-1] = states[:, :-1].flip(1)  # chunks > this one
                states[:, -1:] = 0.0 if carry is None else carry
                if carry is not None:
                    states[:, :-1] += carry
                carry = states[:, :1] + kv[:, :1]  # (r, 1, D, Dv)
            else:
                torch.cumsum(kv[:, :-1], 1, out=states[:, 1:])  # chunks < this one
                states[:, :1] = 0.0 if carry is None else carry
                if carry is not None:
                    states[:, 1:] += carry
                carry = states[:, -1:] + kv[:, -1:]  # (r, 1, D, Dv)
            del kv
            o3.baddbmm_(q3, states.view(r * g, D, Dv))  # plus all earlier (later) chunks
        if part:
            span = slice(0, part) if reverse else slice(full * C, N)
            qp, kp, vp, op = q[r0:r1, span], k[r0:r1, span], v[r0:r1, span], out[r0:r1, span]
            scores = torch.bmm(qp, kp.transpose(1, 2))  # (r, part, part)
            scores = scores.triu_() if reverse else scores.tril_()
            op.copy_(torch.bmm(scores, vp).baddbmm_(qp, carry.view(r, D, Dv)))  # (r, part, Dv)
    return result.view(*lead, N, Dv)


def _product(q, k, v, C: int, reverse: bool) -> torch.Tensor:
    """The prefix product, recorded for autograd when grad mode is on (inside a backward with create_graph)."""
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        return _CausalDotProduct.apply(q, k, v, C, reverse)
    return prefix_product(q, k, v, C, reverse)


class _CausalDotProduct(torch.autograd.Function):
    """sum_{j<=i} (q_i . k_j) v_j (``reverse``: j >= i); backward recomputes chunks, saving only q, k, v.

    The backward is three prefix products of the opposite directions, themselves this Function when a graph
    is being built (``create_graph=True``), so every derivative order is exact.
    """

    @staticmethod
    def forward(ctx, q, k, v, chunk_size, reverse):
        ctx.save_for_backward(q, k, v)
        ctx.chunk_size, ctx.reverse = chunk_size, reverse
        with autocast_disabled(q.device):
            return prefix_product(q, k, v, chunk_size, reverse)

    @staticmethod
    def backward(ctx, grad):
        q, k, v = ctx.saved_tensors
        C, rev = ctx.chunk_size, ctx.reverse
        grad = grad.contiguous()
        with autocast_disabled(q.device):
            dq = _product(grad, v, k, C, rev) if ctx.needs_input_grad[0] else None
            dk = _product(v, grad, q, C, not rev) if ctx.needs_input_grad[1] else None
            dv = _product(k, q, grad, C, not rev) if ctx.needs_input_grad[2] else None
        return dq, dk, dv, None, None


def causal_dot_product(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, chunk_size: int = 64) -> torch.Tensor:
    """out_i = sum_{j<=i} (q_i . k_j) v_j for q, k (B, H, N, D), v (B, H, N, Dv) -> (B, H, N, Dv).

    Accumulates in at least float32 and returns that accumulation dtype (callers cast back); autocast is off
    inside. Differentiable any number of times (the backward is made of the same products).
    """
    name = "causal_dot_product"
    check_qkv(q, k, v, name=name, same_length=True)
    chunk_size = check_chunk_size(chunk_size, name=name)
    acc = accumulation_dtype(q.dtype)
    with autocast_disabled(q.device):
        return _product(q.to(acc), k.to(acc), v.to(acc), chunk_size, False)
