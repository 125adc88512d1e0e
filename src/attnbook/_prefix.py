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

Causal linear attention does not use this product for its first derivatives: :mod:`attnbook._causal`
makes features, numerator, normaliser and gradients tile by tile. Its double backward differentiates
:func:`normalised_attention`, made of these products.

Nothing here writes into a non-contiguous ``out=`` view, so every call traces as one ``torch.compile``
graph (``tests/test_compile.py``).

Causal Flow-Attention does not use this product: its blocks (:func:`attnbook.flow.flow_attention`) carry more
prefix sums than k v^T, and compute the in-block masked product themselves.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F

from ._checks import check_chunk_size, check_qkv
from ._runtime import accumulation_dtype, autocast_disabled, chunk_count, tracing

__all__ = ["causal_dot_product", "prefix_product", "normalised_attention", "chunked_product"]

# Temporaries of one block of products, in numbers (16 MiB in float32). Few, large blocks matter on a busy
# CPU: every product is a parallel region whose threads may have to wait for a core (B=4, H=8, N=8192,
# 2 threads on a loaded 2-core machine: blocks of 4 MiB were 2.8x slower than blocks of 32 MiB).
_BLOCK_NUMBERS = 1 << 22


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


def _blocks(rows: int, N: int, C: int, per_chunk: int, reverse: bool) -> Iterator[tuple[slice, int, slice, int, bool]]:
    """The blocks of the chunked algorithm, in the order they are computed: (rows, r, span, c, first).

    ``rows`` a slice of r rows of (B H), ``span`` a slice of positions holding whole chunks of ``c``
    positions, ``first`` true for the first block of a group of rows (the carried state starts again from
    zero). Chunks are aligned to the start of the sequence (to its end when ``reverse``); within a group of
    rows the blocks run forwards (backwards) in time and the partial chunk that remains comes last.
    """
    C = min(C, N)
    full, part = divmod(N, C)
    base = part if reverse else 0  # first position of the whole chunks
    r, G = _plan(rows, N, C, per_chunk, _BLOCK_NUMBERS)
    starts = range(0, full, G)
    for r0 in range(0, rows, r):
        group, n = slice(r0, r0 + r), min(r, rows - r0)
        first = True
        for g0 in reversed(starts) if reverse else starts:
            yield group, n, slice(base + g0 * C, base + min(g0 + G, full) * C), C, first
            first = False
        if part:
            yield group, n, slice(0, part) if reverse else slice(full * C, N), part, first


def _states(x: torch.Tensor, carry: torch.Tensor | None, reverse: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-chunk states of a block and the state after it, from x (r, g, ...), each chunk's own sum.

    states[:, c] = carry + the sum of x over the chunks before c (after c when ``reverse``): a cumulative sum
    shifted by one, rather than the inclusive sum minus x, which would lose small sums next to a large x.
    Returns (states (r, g, ...), the new carry (r, 1, ...)); ``carry`` (r, 1, ...) or None (zero). The states
    are x's shifted copy, summed in place.
    """
    g = x.shape[1]
    states = torch.empty_like(x)
    edge, last = (g - 1, 0) if reverse else (0, g - 1)  # the chunk whose state is the carry alone; the last done
    inner, before = (slice(0, g - 1), slice(1, g)) if reverse else (slice(1, g), slice(0, g - 1))
    if carry is None:
        states[:, edge].zero_()
    else:
        states[:, edge].copy_(carry[:, 0])
    states[:, inner].copy_(x[:, before])
    states = _scan(states, reverse)
    return states, states[:, last : last + 1] + x[:, last : last + 1]


def _add_state_products(
    o: torch.Tensor, a: torch.Tensor, x: torch.Tensor, carry: torch.Tensor | None, reverse: bool
) -> torch.Tensor:
    """o[c] += a[c] @ state(c) for every chunk c of a block, o (r g, c, E) and a (r g, c, F) batches of chunks;
    state(c) as in :func:`_states` from x (r, g, F, E), each chunk's own sum (overwritten), and ``carry``
    (r, 1, F, E) or None. Returns the new carry (r, 1, F, E), a new tensor.

    The state of chunk c is the inclusive sum up to chunk c - 1 (c + 1 when ``reverse``), a view of x summed
    in place, so no shifted copy of the block's sums is made (about 17 MiB at R = 64, Dv = 64 and 256 chunks),
    at the price of one product per row of B H. With several rows and fewer than :data:`_IN_PLACE_CHUNKS`
    chunks each, those products would be too small: then the shifted copy of :func:`_states` and one product.
    The sums are the same either way, added in the same order.
    """
    r, g = x.shape[:2]
    if r > 1 and g < _IN_PLACE_CHUNKS:
        states, carry = _states(x, carry, reverse)  # (r, g, F, E), (r, 1, F, E)
        o.baddbmm_(a, states.view(-1, *x.shape[2:]))
        return carry
    edge, last = (g - 1, 0) if reverse else (0, g - 1)
    inner, before = (slice(0, g - 1), slice(1, g)) if reverse else (slice(1, g), slice(0, g - 1))
    if carry is not None:
        x[:, edge] += carry[:, 0]
    x = _scan(x, reverse)  # (r, g, F, E), inclusive sums
    o4, a4 = o.view(r, g, *o.shape[1:]), a.view(r, g, *a.shape[1:])  # (r, g, c, E), (r, g, c, F)
    for i in range(r):
        if g > 1:
            o4[i, inner].baddbmm_(a4[i, inner], x[i, before])
        if carry is not None:
            o4[i, edge].addmm_(a4[i, edge], carry[i, 0])
    return x[:, last : last + 1].clone()


# Fewest chunks per row for which a block of several rows reads its states in place (one product per row).
_IN_PLACE_CHUNKS = 8


def _scan(x: torch.Tensor, reverse: bool, loop: bool | None = None) -> torch.Tensor:
    """Inclusive sums of x (r, g, ...) over dim 1 (from the end when ``reverse``), in place. ``loop`` (by
    default: on the CPU) makes it one in-place addition per chunk, on views made once by ``unbind``; else it
    is one ``cumsum``. On the CPU torch's cumsum over a middle dimension walks each position down the chunks
    with the chunks' stride, and at R = Dv = 64 that stride is 16 KiB, so every step lands in the same cache
    set (one row, g = 256 chunks: 13 ms against 1.0 ms for the additions; 1.5 ms at Dv = 65); backwards it
    also needs two flipped copies."""
    if loop is None:
        loop = by_additions(x.device)
    if loop:
        xs = x.unbind(1)  # g views (r, ...)
        pairs = zip(xs[-2::-1], xs[:0:-1], strict=True) if reverse else zip(xs[1:], xs[:-1], strict=True)
        for this, before in pairs:  # each chunk adds the sum up to the one done before it
            this.add_(before)
        return x
    return x.flip(1).cumsum_(1).flip(1) if reverse else x.cumsum_(1)


def by_additions(device: torch.device) -> bool:
    """Whether running sums over chunk states are loops of in-place additions (on the CPU, where torch's
    cumsum walks with the states' stride: :func:`_scan`) rather than one cumsum (elsewhere: one launch
    instead of one per chunk)."""
    return device.type == "cpu"


def prefix_product(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    C: int,
    reverse: bool = False,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """sum_{j <= i} (q_i . k_j) v_j (``reverse``: over j >= i) for q, k (..., N, D), v (..., N, Dv).

    The unchecked kernel: q, k, v of one dtype and device, already validated; no autograd (it is called from
    the autograd.Function, or under no_grad) and no autocast (the caller switches it off). Written into
    ``out`` (contiguous, (..., N, Dv), q's dtype) when given. Blocks of chunks as in :func:`_blocks`.
    """
    *lead, N, D = q.shape
    Dv = v.shape[-1]
    # views where they can be (q, k and v may be column slices)
    q, k, v = (x.reshape(-1, N, x.shape[-1]) for x in (q, k, v))  # (BH, N, D), ..., (BH, N, Dv)
    result = q.new_empty(q.shape[0], N, Dv) if out is None else out
    out = result.view(-1, N, Dv)  # (BH, N, Dv)
    carry = None  # (r, 1, D, Dv): sum of k_j v_j^T over the blocks done
    for rows, r, span, c, first in _blocks(q.shape[0], N, C, _chunk_numbers(C, D, Dv), reverse):
        q3, k3 = q[rows, span].reshape(-1, c, D), k[rows, span].reshape(-1, c, D)  # (r g, c, D), views
        v3 = v[rows, span].reshape(-1, c, Dv)  # (r g, c, Dv)
        o3 = out[rows, span].view(-1, c, Dv)  # (r g, c, Dv), written in place
        scores = torch.bmm(q3, k3.transpose(1, 2))  # (r g, c, c)
        scores = scores.triu_() if reverse else scores.tril_()
        torch.bmm(scores, v3, out=o3)  # inside each chunk
        del scores
        kv = torch.bmm(k3.transpose(1, 2), v3).view(r, -1, D, Dv)  # (r, g, D, Dv): each chunk's k^T v
        carry = _add_state_products(o3, q3, kv, None if first else carry, reverse)  # + earlier chunks
    return result.view(*lead, N, Dv)


def _chunk_numbers(C: int, D: int, Dv: int) -> int:
    """Numbers of temporaries per chunk of a block: the C x C scores, or (not at the same time) the D x Dv
    sums and their shifted copy, plus a few vectors."""
    return max(C * C, 2 * D * Dv) + 2 * (C + D)


def _product(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, C: int, reverse: bool) -> torch.Tensor:
    """The prefix product, recorded for autograd when grad mode is on (inside a backward with create_graph)."""
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        # torch's Function.apply is untyped (no-untyped-call)
        out: torch.Tensor = _CausalDotProduct.apply(q, k, v, C, reverse)  # type: ignore[no-untyped-call]
        return out
    return prefix_product(q, k, v, C, reverse)


class _CausalDotProduct(torch.autograd.Function):
    """sum_{j<=i} (q_i . k_j) v_j (``reverse``: j >= i); backward recomputes chunks, saving only q, k, v.

    The backward is three prefix products of the opposite directions, themselves this Function when a graph
    is being built (``create_graph=True``), so every derivative order is exact.
    """

    # ctx: torch's FunctionCtx, which also carries this Function's own attributes (chunk_size, reverse); torch
    # declares neither those nor the context's type in forward and backward, hence Any.
    @staticmethod
    def forward(
        ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, chunk_size: int, reverse: bool
    ) -> torch.Tensor:
        ctx.save_for_backward(q, k, v)
        ctx.chunk_size, ctx.reverse = chunk_size, reverse
        with autocast_disabled(q.device):
            return prefix_product(q, k, v, chunk_size, reverse)

    @staticmethod
    def backward(
        ctx: Any, grad: torch.Tensor
    ) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None, None, None]:
        q, k, v = ctx.saved_tensors
        C, rev = ctx.chunk_size, ctx.reverse
        grad = grad.contiguous()
        with autocast_disabled(q.device):
            dq = _product(grad, v, k, C, rev) if ctx.needs_input_grad[0] else None
            dk = _product(v, grad, q, C, not rev) if ctx.needs_input_grad[1] else None
            dv = _product(k, q, grad, C, not rev) if ctx.needs_input_grad[2] else None
        return dq, dk, dv, None, None


def normalised_attention(
    fq: torch.Tensor, fk: torch.Tensor, v: torch.Tensor, chunk_size: int, eps: float
) -> torch.Tensor:
    """Causal linear attention on features, sum_{j <= i} (fq_i . fk_j) v_j / (sum_{j <= i} fq_i . fk_j + eps),
    for fq, fk (..., N, R), v (..., N, Dv) of one (accumulation) dtype, validated, as differentiable
    operations: one prefix product of the values with a column of ones appended gives numerator and
    normaliser. Differentiable any number of times; :mod:`attnbook._causal` differentiates it for a double
    backward (its own first derivatives are faster)."""
    with autocast_disabled(fq.device):
        nd = _product(fq, fk, torch.cat((v, torch.ones_like(v[..., :1])), -1), chunk_size, False)  # (..., N, Dv + 1)
        return nd[..., :-1] * (nd[..., -1:] + eps).reciprocal()


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


def chunked_product(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, C: int, state: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """sum_{j <= i} (q_i . k_j) v_j + q_i^T S_0 for q, k (..., N, R), v (..., N, Dv) and a carried state S_0
    (..., R, Dv) (zero when None); returns (out (..., N, Dv), S_0 + sum_j k_j v_j^T (..., R, Dv)).

    The graph form of the chunked algorithm: every chunk at once, in plain differentiable operations, no loop
    over positions, no ``out=`` write and no branch on a size, so that ``torch.compile`` and ``torch.export``
    trace one graph for every length (:func:`attnbook._runtime.chunk_count`). The sequence is padded with zeros
    to whole chunks of C; inside a chunk the masked C x C product, between chunks an exclusive running sum of
    the chunks' k^T v. Time O(N (C + R) Dv), memory O(N (C + R Dv / C)) beside the inputs.
    """
    *lead, N, R = q.shape
    Dv = v.shape[-1]
    # Traced, one more chunk than needed: with at least two chunks no graph depends on whether there is one
    # (a lone chunk reshapes differently, and a dynamic graph would be compiled again for it).
    n = chunk_count(N, C) + (1 if tracing() else 0)
    pad = n * C - N
    qc, kc = (F.pad(x, (0, 0, 0, pad)).reshape(*lead, n, C, R) for x in (q, k))  # (..., n, C, R)
    vc = F.pad(v, (0, 0, 0, pad)).reshape(*lead, n, C, Dv)  # (..., n, C, Dv)
    kv = kc.transpose(-2, -1) @ vc  # (..., n, R, Dv): each chunk's own sum
    # the exclusive running sum, as a zero chunk in front, a cumsum and the first n (no size n - 1: a graph would
    # depend on whether it is 1)
    before = F.pad(kv, (0, 0, 0, 0, 1, 0)).cumsum(-3)[..., :n, :, :]  # (..., n, R, Dv): the state before each chunk
    final = kv.sum(-3)  # (..., R, Dv)
    if state is not None:
        before = before + state.unsqueeze(-3)  # (..., n, R, Dv): the state before each chunk
        final = final + state
    tril = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
    scores = (qc @ kc.transpose(-2, -1)).masked_fill(~tril, 0.0)  # (..., n, C, C)
    out = scores @ vc + qc @ before  # (..., n, C, Dv)
    return out.reshape(*lead, n * C, Dv)[..., :N, :], final
