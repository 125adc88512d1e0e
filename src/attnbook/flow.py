"""Flow-Attention: attention as a flow network with conservation, competition and allocation (chapter 3).

Wu et al., "Flowformer: Linearizing Transformers with Conservation Flows", ICML 2022. The numbers are those of
the paper's published core code (``Flow_Attention`` / ``Flow_Attention_Causal``), eps placement and clamp
included. Queries are sinks, keys are sources; with q~ = sigmoid(q), k~ = sigmoid(k), eps = 1e-6, n = N,
m = M and ``a . b`` the dot product over D (eps is added to every component of a vector):

    incoming flow       I_i  = (q~_i + eps) . (sum_j k~_j + eps)
    outgoing flow       O_j  = (k~_j + eps) . (sum_i q~_i + eps)
    conserved incoming  I^_i = (q~_i + eps) . (sum_j k~_j / O_j + eps)
    conserved outgoing  O^_j = clamp((k~_j + eps) . (sum_i q~_i / I_i + eps), -1, 1)
    allocation          a_i  = sigmoid(I^_i n / m)
    competition         c_j  = softmax_j(O^_j) m
    output              out_i = a_i (q~_i / I_i) . sum_j k~_j (c_j v_j)^T

Causal (N == M), with t_i = i + 1 and every sum over the prefix (j <= i, i <= j):

    I_i  = (q~_i + eps) . (sum_{j<=i} k~_j + eps) / t_i
    O_j  = (k~_j + eps) . (sum_{i<=j} q~_i + eps) / t_j
    I^_i = (q~_i + eps) . (sum_{j<=i} k~_j / O_j + eps) / t_i
    O^_j = clamp((k~_j + eps) . (sum_{i<=j} q~_i / I_i + eps) / t_j, -1, 1)
    a_i  = sigmoid(I^_i),   c_j = exp(O^_j) / sum_{j'<=j} exp(O^_j') t_j
    out_i = a_i (q~_i / (I_i t_i)) . sum_{j<=i} k~_j (c_j v_j)^T

Conventions. :class:`FlowStats` holds the flows themselves (``incoming`` is I_i), not their reciprocals
1 / I_i that the published code stores under the name ``sink_incoming``. Statistics are returned in the
accumulation dtype (at least float32): I_i grows like N D and would overflow float16.

Cost: non-causal O(B H (N + M) D Dv) time, O(B H (N + M) (D + Dv)) memory, like linear attention --
conservation adds O(N D) work. Causal: one pass over blocks of C = ``chunk_size`` tokens; each block
advances a :class:`FlowState` of prefix sums (cumulative sums inside the block, a masked C x C product for
the output), O(B H N (C + D) Dv) time and O(B H C (C + D + Dv) + B H D Dv) memory beside the output: no
N x N and no N x D x Dv tensor is built (the published causal code builds (B, H, N, D, Dv)). For generation,
:func:`flow_attention_step` is the same block with C = 1: one token in O(B H D Dv).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ._checks import check_bool, check_chunk_size, check_dtype, check_eps, check_qkv, check_state, check_step_inputs
from ._module import ProjectedAttention
from ._runtime import accumulation_dtype, autocast_disabled, needs_autograd, result_dtype, rows_per_group

__all__ = ["FlowStats", "FlowState", "flow_attention", "flow_attention_step", "FlowAttention"]


class FlowStats(NamedTuple):
    """The flow quantities of Flow-Attention (Wu et al., 2022), named after the paper.

    All are the flows themselves (``incoming`` is I_i, not 1 / I_i, which the published code stores as
    ``sink_incoming``), in the accumulation dtype (at least float32), and keep their autograd history.
    :func:`attnbook.mobile_attention` returns the same fields with the flow sums taken over the heads.

    Attributes:
        incoming: I_i, flow into sink (query) i, (B, H, N).
        outgoing: O_j, flow out of source (key) j, (B, H, M).
        conserved_incoming: I^_i, incoming flow when every source emits one unit, (B, H, N).
        conserved_outgoing: O^_j after the clamp to [-1, 1], outgoing flow when every sink takes one unit,
            (B, H, M).
        competition: c_j, softmax of O^ over the sources times M (causal: over the prefix, times t_j),
            (B, H, M).
        allocation: a_i = sigmoid(I^_i N / M) (causal: sigmoid(I^_i)), (B, H, N).
        conserved_outgoing_raw: O^_j before the clamp, (B, H, M); ``(raw > 1).sum()`` counts clipped sources.
    """

    incoming: torch.Tensor
    outgoing: torch.Tensor
    conserved_incoming: torch.Tensor
    conserved_outgoing: torch.Tensor
    competition: torch.Tensor
    allocation: torch.Tensor
    conserved_outgoing_raw: torch.Tensor


class FlowState(NamedTuple):
    """Prefix quantities of causal Flow-Attention after ``t`` tokens, for :func:`flow_attention_step`.

    All tensors are in the accumulation dtype (at least float32).

    Attributes:
        t: number of tokens seen (a Python int >= 0).
        key_sum: sum_{j<=t} k~_j, (B, H, D).
        query_sum: sum_{i<=t} q~_i, (B, H, D).
        key_over_outgoing: sum_{j<=t} k~_j / O_j, (B, H, D).
        query_over_incoming: sum_{i<=t} q~_i / I_i, (B, H, D).
        exp_mean: (1/t) sum_{j<=t} exp(O^_j), the causal competition's normaliser kept as a running mean,
            (B, H): c_t = exp(O^_t) / exp_mean. Because O^ is clamped to [-1, 1], every exp(O^) lies in
            [1/e, e], so no running maximum is needed (unlike an online softmax) and the mean stays in
            [1/e, e] for any sequence length; the parallel form updates it once per block with the same
            formula, m <- m + sum_j (exp(O^_j) - m) / t.
        kv: sum_{j<=t} k~_j (c_j v_j)^T, (B, H, D, Dv).
    """

    t: int
    key_sum: torch.Tensor
    query_sum: torch.Tensor
    key_over_outgoing: torch.Tensor
    query_over_incoming: torch.Tensor
    exp_mean: torch.Tensor
    kv: torch.Tensor


def _rowdot_eps(x: torch.Tensor, y: torch.Tensor, eps: float) -> torch.Tensor:
    """(x_n + eps) . (y_n + eps) row by row for x, y (..., N, D) -> (..., N)."""
    return torch.linalg.vecdot(x + eps, y + eps)  # (..., N)


def _rows_dot(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x_n . w_r for x (..., N, D) and a few vectors w (..., R, D) -> (..., R, N).

    Written as w @ x^T: a row-vector-times-matrix product, which CPU BLAS runs at memory speed, whereas
    x @ w^T with R = 1 or 2 columns falls back to a slow path (about 10x slower at N = 4096, D = 64).
    """
    return w @ x.transpose(-2, -1)  # (..., R, N)


def _weighted_sum(w: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """sum_n w_n x_n for w (..., N), x (..., N, D) -> (..., D), as a row vector times x (see _rows_dot)."""
    return (w.unsqueeze(-2) @ x).squeeze(-2)  # (..., D)


def _flow_full(qs, ks, v, eps, out=None):
    """Non-causal Flow-Attention on sigmoid features in the accumulation dtype; returns (out, FlowStats).

    Ordered to read the (N, D) features as few times as possible: (x + eps) . (y + eps) is x . (y + eps) +
    eps sum(y + eps), so no x + eps is formed, and O and O^ come from one product with ks. Beside the two
    (N, D) x (D, Dv) products of linear attention this is O(N D) work. Leading dimensions are free; with
    ``out`` (no autograd) the result is written there.
    """
    N, M = qs.shape[-2], ks.shape[-2]
    key_total = ks.sum(-2) + eps  # (B, H, D): sum_j k~_j + eps
    query_total = qs.sum(-2) + eps  # (B, H, D): sum_i q~_i + eps
    incoming = _rows_dot(qs, key_total.unsqueeze(-2)).squeeze(-2) + eps * key_total.sum(-1, keepdim=True)
    query_over_incoming = _weighted_sum(incoming.reciprocal(), qs) + eps  # (B, H, D)
    both = _rows_dot(ks, torch.stack([query_total, query_over_incoming], dim=-2))  # (B, H, 2, M)
    outgoing = both[..., 0, :] + eps * query_total.sum(-1, keepdim=True)  # (B, H, M)
    conserved_outgoing_raw = both[..., 1, :] + eps * query_over_incoming.sum(-1, keepdim=True)  # (B, H, M)
    key_over_outgoing = _weighted_sum(outgoing.reciprocal(), ks) + eps  # (B, H, D)
    conserved_outgoing = conserved_outgoing_raw.clamp(-1.0, 1.0)  # for stability, as published
    competition = torch.softmax(conserved_outgoing, dim=-1) * M  # (B, H, M)
    kv = ks.transpose(-2, -1) @ (v * competition.unsqueeze(-1))  # (B, H, D, Dv)
    conserved_incoming = _rows_dot(qs, key_over_outgoing.unsqueeze(-2)).squeeze(-2) + eps * key_over_outgoing.sum(
        -1, keepdim=True
    )  # (B, H, N)
    allocation = torch.sigmoid(conserved_incoming * (N / M))  # (B, H, N)
    scale = (allocation / incoming).unsqueeze(-1)  # (B, H, N, 1)
    if out is None:
        out = (qs @ kv) * scale  # (B, H, N, Dv)
    else:
        torch.matmul(qs, kv, out=out).mul_(scale)  # (B, H, N, Dv), in place: no autograd here
    stats = FlowStats(
        incoming, outgoing, conserved_incoming, conserved_outgoing, competition, allocation, conserved_outgoing_raw
    )
    return out, stats


def _initial_state(x: torch.Tensor, B: int, H: int, D: int, Dv: int, acc: torch.dtype) -> FlowState:
    zeros = x.new_zeros(B, H, D, dtype=acc)
    kv = x.new_zeros(B, H, D, Dv, dtype=acc)
    return FlowState(0, zeros, zeros, zeros, zeros, x.new_zeros(B, H, dtype=acc), kv)


def _causal_block(state: FlowState, q, k, v, eps: float, tril: torch.Tensor):
    """Advance causal Flow-Attention over the next c tokens, q, k (B, H, c, D), v (B, H, c, Dv).

    Every causal quantity of a token is a prefix sum, so a block needs only the state before it: inside the
    block the prefix sums are cumulative sums on top of the carried totals, and the output is the block's
    c x c masked product plus the carried k v^T state. c = 1 is the recurrent step; the parallel form runs
    the blocks one after another. Returns (out (B, H, c, Dv) in the accumulation dtype, FlowStats of the
    block, new state).
    """
    acc = state.kv.dtype
    c = q.shape[-2]
    qs = torch.sigmoid(q.to(acc))  # (B, H, c, D)
    ks = torch.sigmoid(k.to(acc))  # (B, H, c, D)
    va = v.to(acc)  # (B, H, c, Dv)
    t = torch.arange(state.t + 1, state.t + c + 1, device=qs.device, dtype=acc)  # (c,) = i + 1
    key_sum = state.key_sum.unsqueeze(-2) + ks.cumsum(-2)  # (B, H, c, D): sum_{j<=i} k~_j
    query_sum = state.query_sum.unsqueeze(-2) + qs.cumsum(-2)  # (B, H, c, D)
    incoming = _rowdot_eps(qs, key_sum, eps) / t  # (B, H, c)
    outgoing = _rowdot_eps(ks, query_sum, eps) / t  # (B, H, c)
    key_over_outgoing = state.key_over_outgoing.unsqueeze(-2) + (ks / outgoing.unsqueeze(-1)).cumsum(-2)
    query_over_incoming = state.query_over_incoming.unsqueeze(-2) + (qs / incoming.unsqueeze(-1)).cumsum(-2)
    conserved_incoming = _rowdot_eps(qs, key_over_outgoing, eps) / t  # (B, H, c)
    conserved_outgoing_raw = _rowdot_eps(ks, query_over_incoming, eps) / t  # (B, H, c)
    conserved_outgoing = conserved_outgoing_raw.clamp(-1.0, 1.0)  # for stability, as published
    # Competition exp(O^_j) / sum_{j'<=j} exp(O^_j') t_j = exp(O^_j) / mean_{j'<=j} exp(O^_j'). The running
    # mean is updated as m_i = m + sum_{s<j<=i} (exp(O^_j) - m) / t_i from the carried mean m (after s
    # tokens): every term lies in [1/e, e] because O^ is clamped, so nothing grows with the sequence length.
    expo = conserved_outgoing.exp()  # (B, H, c), in [1/e, e]
    prev_mean = state.exp_mean.unsqueeze(-1)  # (B, H, 1)
    exp_mean = prev_mean + (expo - prev_mean).cumsum(-1) / t  # (B, H, c)
    competition = expo / exp_mean  # (B, H, c)
    allocation = torch.sigmoid(conserved_incoming)  # (B, H, c)
    vc = va * competition.unsqueeze(-1)  # (B, H, c, Dv)
    scores = qs @ ks.transpose(-2, -1)  # (B, H, c, c)
    if c > 1:
        scores = scores.masked_fill(~tril[:c, :c], 0.0)
    out = scores @ vc + qs @ state.kv  # (B, H, c, Dv)
    out = out * (allocation / (incoming * t)).unsqueeze(-1)  # (B, H, c, Dv)
    stats = FlowStats(
        incoming, outgoing, conserved_incoming, conserved_outgoing, competition, allocation, conserved_outgoing_raw
    )
    new_state = FlowState(
        state.t + c,
        key_sum[..., -1, :],
        query_sum[..., -1, :],
        key_over_outgoing[..., -1, :],
        query_over_incoming[..., -1, :],
        exp_mean[..., -1],
        state.kv + ks.transpose(-2, -1) @ vc,
    )
    return out, stats, new_state


def _flow_causal(q, k, v, eps, chunk_size, acc, dtype, return_flows):
    """Causal Flow-Attention (N == M) block by block: O(B H C (C + D + Dv)) memory beside the output, which
    is in ``dtype``."""
    B, H, N, D = q.shape
    C = min(chunk_size, N)
    tril = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
    state = _initial_state(q, B, H, D, v.shape[-1], acc)
    record = needs_autograd(q, k, v)
    outs, blocks = [], []
    out = None if record else q.new_empty(B, H, N, v.shape[-1], dtype=dtype)  # without autograd: block by block
    for start in range(0, N, C):
        sl = slice(start, start + C)
        block, stats, state = _causal_block(state, q[..., sl, :], k[..., sl, :], v[..., sl, :], eps, tril)
        if record:
            outs.append(block.to(dtype))  # (B, H, c, Dv)
        else:
            out[..., sl, :] = block  # (B, H, c, Dv), cast to the result dtype
        if return_flows:
            blocks.append(stats)
    if record:
        out = torch.cat(outs, dim=-2)  # (B, H, N, Dv)
    if not return_flows:
        return out, None
    stats = FlowStats(*(torch.cat(parts, dim=-1) for parts in zip(*blocks, strict=True)))  # each (B, H, N)
    return out, stats


def flow_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    eps: float = 1e-6,
    return_flows: bool = False,
    chunk_size: int = 64,
    out_dtype: torch.dtype | None = None,
):
    """Flow-Attention (Wu et al., "Flowformer", ICML 2022): linear attention with flow conservation.

    ``out_i = a_i (q~_i / I_i) . sum_j k~_j (c_j v_j)^T`` with q~ = sigmoid(q), k~ = sigmoid(k), incoming flow
    I, allocation a = sigmoid(I^ N / M) and competition c = softmax(clamp(O^, -1, 1)) M, all defined in the
    module docstring; causal: sums over the prefix, normalised by t_i = i + 1.

    Cost: O(B H (N + M) D Dv) time and O(B H (N + M) (D + Dv)) memory; causal: O(B H N (chunk_size + D) Dv)
    time, O(B H chunk_size (chunk_size + D + Dv)) memory beside the output, never an N x N or N x D x Dv
    tensor. Without autograd (inference) the CPU path works through a few (b, h) rows at a time so that the
    O(N D) bookkeeping stays in cache, and the causal path writes its blocks straight into the output; the
    numbers are the same as with autograd.

    Args:
        q: queries (sinks), (B, H, N, D).
        k: keys (sources), (B, H, M, D).
        v: values, (B, H, M, Dv).
        causal: query i sees keys j <= i only; needs N == M.
        eps: added to every component of the flow vectors, as in the published code (>= 0).
        return_flows: also return the :class:`FlowStats`.
        chunk_size: block length of the causal prefix sums (any positive int; the result does not depend
            on it beyond rounding).
        out_dtype: dtype of ``out``; default the inputs' (under autocast: the autocast dtype).

    Returns:
        out (B, H, N, Dv) in ``out_dtype`` (computed in at least float32, autocast off), or
        ``(out, FlowStats)`` with ``return_flows``; the statistics are in the accumulation dtype. A NaN in any
        input makes the outputs that depend on it NaN (non-causal: every output, since every flow sums over
        all queries and keys); it is never hidden. (An infinite q or k is a finite feature: sigmoid(inf) = 1.)
    """
    name = "flow_attention"
    causal = check_bool(causal, "causal", name=name)
    return_flows = check_bool(return_flows, "return_flows", name=name)
    check_qkv(q, k, v, name=name, same_length=causal, why=" (causal attention pairs query i with key i)")
    eps = check_eps(eps, name=name)
    chunk_size = check_chunk_size(chunk_size, name=name)
    dtype = result_dtype(q) if out_dtype is None else check_dtype(out_dtype, "out_dtype", name=name)
    acc = accumulation_dtype(q.dtype)
    with autocast_disabled(q.device):
        if causal:
            out, stats = _flow_causal(q, k, v, eps, chunk_size, acc, dtype, return_flows)
        elif needs_autograd(q, k, v):
            qs = torch.sigmoid(q.to(acc))  # (B, H, N, D)
            ks = torch.sigmoid(k.to(acc))  # (B, H, M, D)
            out, stats = _flow_full(qs, ks, v.to(acc), eps)
            out = out.to(dtype)
        else:
            out, stats = _flow_full_by_rows(q, k, v, eps, acc, dtype, return_flows)
    return (out, stats) if return_flows else out


def _flow_full_by_rows(q, k, v, eps, acc, dtype, return_flows):
    """Non-causal Flow-Attention without autograd, a few (b, h) rows at a time (the rows are independent).

    Same numbers as :func:`_flow_full` on the whole batch; the features and temporaries of one group are small
    enough to stay in cache and be recycled, so the O(N D) passes run at cache speed.
    """
    B, H, N, D = q.shape
    M, Dv = k.shape[-2], v.shape[-1]
    rows = B * H
    q, k, v = q.reshape(rows, N, D), k.reshape(rows, M, D), v.reshape(rows, M, Dv)
    out = q.new_empty(rows, N, Dv, dtype=acc)  # (B H, N, Dv)
    parts = []
    step = rows_per_group(q, max(N, M), rows)
    for r0 in range(0, rows, step):
        r = slice(r0, r0 + step)
        qs, ks = torch.sigmoid(q[r].to(acc)), torch.sigmoid(k[r].to(acc))  # (rows', N, D), (rows', M, D)
        _, stats = _flow_full(qs, ks, v[r].to(acc), eps, out=out[r])
        if return_flows:
            parts.append(stats)
    out = out.view(B, H, N, Dv).to(dtype)
    if not return_flows:
        return out, None
    return out, FlowStats(*(torch.cat(p).unflatten(0, (B, H)) for p in zip(*parts, strict=True)))


def flow_attention_step(
    q_t: torch.Tensor,
    k_t: torch.Tensor,
    v_t: torch.Tensor,
    state: FlowState | None = None,
    *,
    eps: float = 1e-6,
) -> tuple[torch.Tensor, FlowState]:
    """One token of causal Flow-Attention from the prefix state: the recurrent form for generation.

    Feeding tokens 1..N one at a time gives the rows of ``flow_attention(q, k, v, causal=True)``; every
    causal quantity of token t depends only on prefix sums, which :class:`FlowState` carries. The competition
    normaliser is kept as a running mean of exp(O^) (bounded in [1/e, e], see :class:`FlowState`).

    Cost: O(B H D Dv) time and memory per token, independent of t.

    Args:
        q_t: query of the new token, (B, H, D).
        k_t: key of the new token, (B, H, D).
        v_t: value of the new token, (B, H, Dv).
        state: the :class:`FlowState` returned by the previous step (t >= 0; every tensor in the accumulation
            dtype, on the inputs' device, of the shapes listed there), or None before the first token.
        eps: as in :func:`flow_attention`.

    Returns:
        ``(out_t, new_state)``: out_t (B, H, Dv) in the dtype of the inputs (under autocast: the autocast
        dtype), new_state a :class:`FlowState`.
    """
    name = "flow_attention_step"
    B, H, D, Dv = check_step_inputs(q_t, k_t, v_t, name=name)
    eps = check_eps(eps, name=name)
    dtype, acc = result_dtype(q_t), accumulation_dtype(q_t.dtype)
    if state is None:
        state = _initial_state(q_t, B, H, D, Dv, acc)
    else:
        vectors = (B, H, D)
        fields = dict(
            key_sum=vectors,
            query_sum=vectors,
            key_over_outgoing=vectors,
            query_over_incoming=vectors,
            exp_mean=(B, H),
            kv=(B, H, D, Dv),
        )
        check_state(state, FlowState, fields, name=name, dtype=acc, device=q_t.device, counts=("t",))
    q1, k1, v1 = q_t.unsqueeze(-2), k_t.unsqueeze(-2), v_t.unsqueeze(-2)  # one-token blocks (B, H, 1, .)
    with autocast_disabled(q_t.device):
        out, _, new_state = _causal_block(state, q1, k1, v1, eps, None)
    return out.squeeze(-2).to(dtype), new_state  # (B, H, Dv)


class FlowAttention(ProjectedAttention):
    """Multi-head Flow-Attention with the module family's projections (Wu et al., ICML 2022).

    Parameter names and shapes are those of the published ``Flow_Attention`` module (``query_projection``,
    ``key_projection``, ``value_projection``, ``out_projection``; dropout after the output projection), so
    its checkpoints load unchanged.

    Args:
        d_input, d_model, d_output, n_heads, drop_out: see :class:`attnbook.ProjectedAttention`; the default
            ``drop_out=0.05`` is the published module's.
        eps: see :func:`flow_attention`.
        causal: each position attends to itself and earlier positions (needs L == S).

    Shape:
        queries (B, L, d_input), keys (B, S, d_input), values (B, S, d_input) -> (B, L, d_output).
    """

    def __init__(
        self,
        d_input: int,
        d_model: int,
        d_output: int,
        n_heads: int,
        drop_out: float = 0.05,
        eps: float = 1e-6,
        causal: bool = False,
    ):
        super().__init__(d_input, d_model, d_output, n_heads, drop_out)
        name = type(self).__name__
        self.eps = check_eps(eps, name=name)
        self.causal = check_bool(causal, "causal", name=name)
        self.same_length, self.same_length_reason = self.causal, " (causal attention pairs query i with key i)"

    def extra_repr(self) -> str:
        return f"n_heads={self.n_heads}, eps={self.eps}, causal={self.causal}"

    def attend(self, q, k, v):
        # the accumulation dtype: the out-projection rounds (attnbook.ProjectedAttention)
        return flow_attention(q, k, v, causal=self.causal, eps=self.eps, out_dtype=accumulation_dtype(q.dtype))
