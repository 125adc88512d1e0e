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

Causal linear attention uses :func:`normalised_prefix_product`: the same blocks with a column of ones
appended to the values, so one product gives the numerator and the normaliser; with autograd through
:func:`normalised_attention`, whose backward is three prefix products again.

Nothing here writes into a non-contiguous ``out=`` view, so every call traces as one ``torch.compile``
graph (``tests/test_compile.py``).

Causal Flow-Attention does not use this product: its blocks (:func:`attnbook.flow.flow_attention`) carry more
prefix sums than k v^T, and compute the in-block masked product themselves.
"""

from __future__ import annotations

import torch

from ._checks import check_chunk_size, check_qkv
from ._runtime import accumulation_dtype, autocast_disabled

__all__ = ["causal_dot_product", "prefix_product", "normalised_prefix_product", "normalised_attention"]

# Temporaries of one block of products, in numbers: _BLOCK_NUMBERS (16 MiB in float32) with autograd;
# without it a third of the whole output, within _INFERENCE_BLOCK_NUMBERS (floor, cap), so that the extra
# memory stays under the output's size. Few, large blocks matter on a busy CPU: every product is a parallel
# region whose threads may have to wait for a core (B=4, H=8, N=8192, 2 threads on a loaded 2-core machine:
# blocks of 4 MiB were 2.8x slower than blocks of 32 MiB).
_BLOCK_NUMBERS = 1 << 22
_INFERENCE_BLOCK_NUMBERS = (1 << 20, 1 << 23)


def _plan(rows: int, N: int, C: int, per_chunk: int, budget: int) -> tuple[int, int]:
    """(r, G): rows of (B H) and chunks per block, so that a block's temporaries stay within a fixed budget.

    A chunk costs ``per_chunk`` numbers of temporaries (C^2 scores and a few D x Dv states), so
    r G <= budget / per_chunk: the extra memory beside the output does not grow with N. Several rows at once
    only when a block spans whole rows (then the rows are contiguous in memory and the batched products need
    no copies).
    """
    per_block = max(1, budget // per_chunk)  # r G at most
    full = N // C
    if per_block >= full and full * C == N:
        return max(1, min(rows, per_block // full)), full
    return 1, max(1, min(full, per_block))


def _blocks(rows: int, N: int, C: int, per_chunk: int, reverse: bool, budget: int | None = None):
    """The blocks of the chunked algorithm, in the order they are computed: (rows, r, span, c, first).

    ``rows`` a slice of r rows of (B H), ``span`` a slice of positions holding whole chunks of ``c``
    positions, ``first`` true for the first block of a group of rows (the carried state starts again from
    zero). Chunks are aligned to the start of the sequence (to its end when ``reverse``); within a group of
    rows the blocks run forwards (backwards) in time and the partial chunk that remains comes last.
    """
    C = min(C, N)
    full, part = divmod(N, C)
    base = part if reverse else 0  # first position of the whole chunks
    r, G = _plan(rows, N, C, per_chunk, _BLOCK_NUMBERS if budget is None else budget)
    starts = range(0, full, G)
    for r0 in range(0, rows, r):
        group, n = slice(r0, r0 + r), min(r, rows - r0)
        first = True
        for g0 in reversed(starts) if reverse else starts:
            yield group, n, slice(base + g0 * C, base + min(g0 + G, full) * C), C, first
            first = False
        if part:
            yield group, n, slice(0, part) if reverse else slice(full * C, N), part, first


def _states(x: torch.Tensor, carry: torch.Tensor | None, reverse: bool):
    """Per-chunk states of a block and the state after it, from x (r, g, ...), each chunk's own sum.

    states[:, c] = carry + the sum of x over the chunks before c (after c when ``reverse``): a cumulative sum
    shifted by one, rather than the inclusive sum minus x, which would lose small sums next to a large x.
    Returns (states (r, g, ...), the new carry (r, 1, ...)); the states are x's shifted copy, summed in
    place, so a block holds two such tensors at most (x and its states).
    """
    head = torch.zeros_like(x[:, :1]) if carry is None else carry  # (r, 1, ...)
    if reverse:
        last = x[:, :1].clone()  # (r, 1, ...), the chunk done last
        states = torch.cat((x[:, 1:], head), 1)  # (r, g, ...), shifted by one chunk
    else:
        last = x[:, -1:].clone()
        states = torch.cat((head, x[:, :-1]), 1)
    states = _scan(states, reverse)
    return states, (states[:, :1] if reverse else states[:, -1:]) + last


def _add_states(o3, q3, x, carry, reverse: bool) -> torch.Tensor:
    """o3 += q3 times the state before each chunk (after it when ``reverse``), for a block of one row: o3
    (g, c, E), q3 (g, c, D), x (1, g, D, E) each chunk's own sum, summed up in place; ``carry`` (1, 1, D, E) or
    None. Returns the new carry.

    The state of chunk c is the inclusive sum up to chunk c - 1 (c + 1 when ``reverse``), a view of x, so
    the shifted copy of :func:`_states` is never made (a copy of the whole block, about 17 MiB at R = 64,
    Dv = 64 and 256 chunks); the sums are the same, added in the same order.
    """
    g = x.shape[1]
    if carry is not None:
        x[:, -1 if reverse else 0] += carry[:, 0]
    x = _scan(x, reverse)[0]  # (g, D, E), inclusive sums
    edge = g - 1 if reverse else 0  # the chunk whose state is the carry alone
    if g > 1:
        inner = slice(0, g - 1) if reverse else slice(1, g)
        o3[inner].baddbmm_(q3[inner], x[1:] if reverse else x[:-1])
    if carry is not None:
        o3[edge : edge + 1].baddbmm_(q3[edge : edge + 1], carry[0])
    return x[None, :1].clone() if reverse else x[None, -1:].clone()


def _scan(x: torch.Tensor, reverse: bool, loop: bool | None = None) -> torch.Tensor:
    """Inclusive sums of x (r, g, ...) over dim 1 (from the end when ``reverse``), in place. ``loop`` (by
    default decided here, from x's device, r and ``reverse``): one in-place addition per chunk, for the CPU
    with several rows r, where torch's cumsum over a middle dim of
    several MiB is slower than g - 1 additions (one thread, r = 4, g = 64: 1.8 ms against 1.3 ms), and for
    the CPU's reverse scans of the backward pass, where a cumsum needs two flipped copies; else one cumsum
    (one row, g = 256: 1.7 ms against 3.1 ms for the additions)."""
    if loop is None:
        loop = x.device.type == "cpu" and (reverse or x.shape[0] > 1)
    if loop:
        g = x.shape[1]
        for c in range(g - 2, -1, -1) if reverse else range(1, g):
            x[:, c] += x[:, c + 1 if reverse else c - 1]
        return x
    return x.flip(1).cumsum_(1).flip(1) if reverse else x.cumsum_(1)


def prefix_product(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, C: int, reverse: bool = False, out: torch.Tensor | None = None
) -> torch.Tensor:
    """sum_{j <= i} (q_i . k_j) v_j (``reverse``: over j >= i) for q, k (..., N, D), v (..., N, Dv).

    The unchecked kernel: q, k, v of one dtype and device, already validated; no autograd (it is called from
    the autograd.Function, or under no_grad) and no autocast (the caller switches it off). Written into
    ``out`` (contiguous, (..., N, Dv), q's dtype) when given. Blocks of chunks as in :func:`_blocks`.
    """
    *lead, N, D = q.shape
    Dv = v.shape[-1]
    q, k, v = (x.contiguous().view(-1, N, x.shape[-1]) for x in (q, k, v))  # (BH, N, D), ..., (BH, N, Dv)
    result = q.new_empty(q.shape[0], N, Dv) if out is None else out
    out = result.view(-1, N, Dv)  # (BH, N, Dv)
    carry = None  # (r, 1, D, Dv): sum of k_j v_j^T over the blocks already done
    for rows, r, span, c, first in _blocks(q.shape[0], N, C, _chunk_numbers(C, D, Dv), reverse):
        q3, k3 = q[rows, span].reshape(-1, c, D), k[rows, span].reshape(-1, c, D)  # (r g, c, D), views
        v3 = v[rows, span].reshape(-1, c, Dv)  # (r g, c, Dv)
        o3 = out[rows, span].view(-1, c, Dv)  # (r g, c, Dv), written in place
        scores = torch.bmm(q3, k3.transpose(1, 2))  # (r g, c, c)
        scores = scores.triu_() if reverse else scores.tril_()
        torch.bmm(scores, v3, out=o3)  # inside each chunk
        del scores
        kv = torch.bmm(k3.transpose(1, 2), v3).view(r, -1, D, Dv)  # (r, g, D, Dv): each chunk's k^T v
        if r == 1:  # plus all earlier (later) chunks, their sums read in place
            carry = _add_states(o3, q3, kv, None if first else carry, reverse)
            continue
        states, carry = _states(kv, None if first else carry, reverse)  # earlier (later) chunks' sums
        del kv
        o3.baddbmm_(q3, states.view(-1, D, Dv))  # plus all earlier (later) chunks
    return result.view(*lead, N, Dv)


def _chunk_numbers(C: int, D: int, Dv: int) -> int:
    """Numbers of temporaries per chunk of a block: the C x C scores, or (not at the same time) the D x Dv
    sums and their shifted copy, plus a few vectors."""
    return max(C * C, 2 * D * Dv) + 2 * (C + D)


def inference_budget(output_numbers: int) -> int:
    """Numbers of temporaries per block without autograd, for a call whose whole output has
    ``output_numbers`` numbers: a third of it, within :data:`_INFERENCE_BLOCK_NUMBERS`."""
    floor, cap = _INFERENCE_BLOCK_NUMBERS
    return min(cap, max(floor, output_numbers // 3))


def normalised_prefix_product(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    C: int,
    eps: float,
    out: torch.Tensor,
    total: int = 0,
    recip: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal linear attention on features, written into ``out``: no autograd here (see
    :func:`normalised_attention` for the differentiable form).

        out_i = sum_{j <= i} (q_i . k_j) v_j / (sum_{j <= i} q_i . k_j + eps)

    The normaliser comes from the same products as the numerator: each block's values get a column of ones,
    [v, 1], so the masked scores times [v, 1] give the numerator and the normaliser inside each chunk, and the
    carried state k^T [v, 1] = [S, z] the rest. No (..., N, R) prefix sum of the keys is ever formed; the
    extra memory is one block's temporaries (:func:`inference_budget` of ``total``, the numbers of the whole
    output when ``out`` is part of it). q, k (..., N, R), v (..., N, Dv) of one dtype, ``out`` contiguous
    (..., N, Dv); ``recip``, when given (contiguous (..., N, 1)), receives 1 / (normaliser + eps).
    """
    *lead, N, D = q.shape
    Dv = v.shape[-1]
    q, k, v = (x.contiguous().view(-1, N, x.shape[-1]) for x in (q, k, v))  # (BH, N, R), ..., (BH, N, Dv)
    o = out.view(-1, N, Dv)  # (BH, N, Dv)
    carry = None  # (r, 1, R, Dv + 1): [sum k_j v_j^T, sum k_j] over the blocks already done
    per_chunk = _chunk_numbers(C, D, Dv + 1) + 2 * C * (Dv + 1)  # and [v, 1], the block's output
    for rows, r, span, c, first in _blocks(q.shape[0], N, C, per_chunk, False, inference_budget(total or o.numel())):
        q3, k3 = q[rows, span].reshape(-1, c, D), k[rows, span].reshape(-1, c, D)  # (r g, c, R), views
        v3 = v[rows, span].reshape(-1, c, Dv)  # (r g, c, Dv)
        v1 = torch.cat((v3, v3.new_ones(v3.shape[0], c, 1)), -1)  # (r g, c, Dv + 1): [v, 1]
        scores = torch.bmm(q3, k3.transpose(1, 2)).tril_()  # (r g, c, c)
        o1 = torch.bmm(scores, v1)  # (r g, c, Dv + 1): numerator and normaliser inside each chunk
        del scores
        kv = torch.bmm(k3.transpose(1, 2), v1).view(r, -1, D, Dv + 1)  # (r, g, R, Dv + 1): [k^T v, k^T 1]
        if r == 1:  # plus all earlier chunks, their sums read in place
            carry = _add_states(o1, q3, kv, None if first else carry, False)
        else:
            states, carry = _states(kv, None if first else carry, False)  # (r, g, R, Dv + 1): earlier chunks
            o1.baddbmm_(q3, states.view(-1, D, Dv + 1))  # plus all earlier chunks
            del states
        del kv
        r1 = o1[..., Dv:].add_(eps).reciprocal_()  # (r g, c, 1)
        if recip is not None:
            recip.view(-1, N, 1)[rows, span].view(-1, c, 1).copy_(r1)
        # times the reciprocal, as in fast-transformers
        torch.mul(o1[..., :Dv], r1, out=o[rows, span].view(-1, c, Dv))
    return out


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


class _NormalisedAttention(torch.autograd.Function):
    """Causal linear attention on features, out_i = num_i r_i with r_i = 1 / (den_i + eps), where
    [num, den] is the prefix product of (phi(q), phi(k), [v, 1]). Returns (out, r).

    Backward, with g the gradient of out and g_r that of r (non-zero in a double backward only):

        dL/dnum = g r,   dL/dden = -(g . out) r - g_r r^2,   G = [dL/dnum, dL/dden]
        dphi(q)_i = sum_{j <= i} (G_i . [v_j, 1]) phi(k)_j,   dphi(k)_j = sum_{i >= j} ([v_j, 1] . G_i) phi(q)_i,
        dv_j = sum_{i >= j} (phi(k)_j . phi(q)_i) (dL/dnum)_i

    three prefix products made of differentiable operations on the inputs and on this Function's own
    outputs (out and r), so every derivative order is exact.
    """

    @staticmethod
    def forward(ctx, fq, fk, v, chunk_size, eps):
        with autocast_disabled(fq.device):
            fq, fk, v = fq.contiguous(), fk.contiguous(), v.contiguous()
            out, r = v.new_empty(v.shape), v.new_empty(*v.shape[:-1], 1)  # (..., N, Dv), (..., N, 1)
            normalised_prefix_product(fq, fk, v, chunk_size, eps, out, recip=r)
        ctx.save_for_backward(fq, fk, v, out, r)
        ctx.chunk_size = chunk_size
        ctx.set_materialize_grads(False)
        return out, r

    @staticmethod
    def backward(ctx, g, g_r):
        fq, fk, v, out, r = ctx.saved_tensors
        C = ctx.chunk_size
        need_q, need_k, need_v = ctx.needs_input_grad[:3]
        if g is None and g_r is None:
            return None, None, None, None, None
        with autocast_disabled(fq.device):
            g_num = torch.zeros_like(out) if g is None else g.contiguous() * r  # (..., N, Dv): dL/dnum
            g_den = torch.zeros_like(r) if g is None else -torch.linalg.vecdot(g, out).unsqueeze(-1) * r  # (.., N, 1)
            if g_r is not None:
                g_den = g_den - g_r * r * r
            dfq = dfk = dv = None
            if need_q or need_k:
                G = torch.cat((g_num, g_den), -1)  # (..., N, Dv + 1)
                v1 = torch.cat((v, torch.ones_like(r)), -1)  # (..., N, Dv + 1): [v, 1]
                dfq = _product(G, v1, fk, C, False) if need_q else None
                dfk = _product(v1, G, fq, C, True) if need_k else None
            if need_v:
                dv = _product(fk, fq, g_num, C, True)
        return dfq, dfk, dv, None, None


def normalised_attention(fq: torch.Tensor, fk: torch.Tensor, v: torch.Tensor, chunk_size: int, eps: float):
    """Causal linear attention on features, sum_{j <= i} (fq_i . fk_j) v_j / (sum_{j <= i} fq_i . fk_j + eps),
    for fq, fk (..., N, R), v (..., N, Dv) of one (accumulation) dtype, validated; differentiable any number
    of times. One chunked product gives numerator and normaliser (the values with a column of ones)."""
    if torch.is_grad_enabled() and (fq.requires_grad or fk.requires_grad or v.requires_grad):
        return _NormalisedAttention.apply(fq, fk, v, chunk_size, eps)[0]
    with autocast_disabled(fq.device):
        return normalised_prefix_product(fq, fk, v, chunk_size, eps, v.new_empty(v.shape))


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
