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

Padding (``key_padding_mask``, ``query_padding_mask``: True = padding): a padded source sends no flow and a
padded sink receives none; every sum runs over the real positions and n, m (causal: t_i) count them, so the real
positions get exactly the numbers of a run on the unpadded sequence. The ablations of the paper's Table 6 are
flags: ``competition=False`` sets c_j = 1, ``allocation=False`` sets a_i = 1.

Causal attention carries a :class:`FlowState` of prefix sums (``initial_state=``, ``output_final_state=True``),
so a prompt is prefilled in one call and generation continues with :func:`flow_attention_step`. Every prefix sum
is a cumulative sum, and the output is chapter 2's chunked causal product
(:func:`attnbook.linear.chunked_causal_product`): no N x N and no N x D x Dv tensor is built (the published
causal code builds (B, H, N, D, Dv)).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, NamedTuple, TypeAlias, TypedDict, cast, overload

import torch
from torch import Tensor

from ._checks import (
    check_bool,
    check_choice,
    check_dtype,
    check_eps,
    check_int,
    check_is_causal,
    check_key_padding_mask,
    check_no_attn_mask,
    check_qkv,
    check_state,
    check_state_call,
    check_step_inputs,
)
from ._module import ProjectedAttention
from ._runtime import accumulation_dtype, autocast_disabled, result_dtype
from .linear import chunked_causal_product

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["FlowStats", "FlowState", "flow_attention", "flow_attention_step", "FlowAttention"]

_CAUSAL_PAIRS = " (causal attention pairs query i with key i)"
_NO_ATTN_MASK = (
    " (Flow-Attention never forms the N x M weights, so an arbitrary mask cannot be applied to them: pass "
    "key_padding_mask for padding and is_causal=True for the causal mask)"
)


class FlowStats(NamedTuple):
    """The flow quantities of Flow-Attention (Wu et al., 2022), named after the paper.

    The flows themselves (``incoming`` is I_i, not the published code's 1 / I_i), in the accumulation dtype, with
    their autograd history; 0 at a padded position. :func:`attnbook.mobile_attention` returns them too.

    Attributes:
        incoming, outgoing: I_i (B, H, N) and O_j (B, H, M).
        conserved_incoming, conserved_outgoing: I^_i (B, H, N) and O^_j clamped to [-1, 1] (B, H, M).
        competition, allocation: c_j (B, H, M) and a_i (B, H, N); 1 when switched off.
        conserved_outgoing_raw: O^_j before the clamp, (B, H, M).

    Example:
        >>> import torch, attnbook
        >>> q, k, v = (torch.randn(1, 2, 10, 4) for _ in range(3))
        >>> _, flows = attnbook.flow_attention(q, k, v, return_flows=True)
        >>> round(float(flows.competition.sum(-1).mean()), 3)  # the sources share M = 10 units of competition
        10.0
    """

    incoming: torch.Tensor
    outgoing: torch.Tensor
    conserved_incoming: torch.Tensor
    conserved_outgoing: torch.Tensor
    competition: torch.Tensor
    allocation: torch.Tensor
    conserved_outgoing_raw: torch.Tensor


class FlowState(NamedTuple):
    """Prefix quantities of causal Flow-Attention after ``t`` tokens, in the accumulation dtype (``t`` in int64).

    Attributes:
        t: (B,), the number of real (unpadded) tokens seen in each sequence.
        key_sum, query_sum: sum_{j<=t} k~_j and sum_{i<=t} q~_i, (B, H, D).
        key_over_outgoing, query_over_incoming: sum_{j<=t} k~_j / O_j and sum_{i<=t} q~_i / I_i, (B, H, D).
        exp_mean: (1/t) sum_{j<=t} exp(O^_j), (B, H): c_t = exp(O^_t) / exp_mean. O^ is clamped to [-1, 1], so every
            term lies in [1/e, e]: no running maximum is needed, unlike an online softmax.
        kv: sum_{j<=t} k~_j (c_j v_j)^T, (B, H, D, Dv).

    Example:
        >>> import torch, attnbook
        >>> q, k, v = (torch.randn(2, 2, 7, 4) for _ in range(3))
        >>> _, state = attnbook.flow_attention(q, k, v, is_causal=True, output_final_state=True)
        >>> state.t.tolist(), tuple(state.kv.shape)  # 7 tokens seen in each sequence; kv (B, H, D, Dv)
        ([7, 7], (2, 2, 4, 4))
    """

    t: torch.Tensor
    key_sum: torch.Tensor
    query_sum: torch.Tensor
    key_over_outgoing: torch.Tensor
    query_over_incoming: torch.Tensor
    exp_mean: torch.Tensor
    kv: torch.Tensor


def _dot(x: torch.Tensor, y: torch.Tensor, eps: float) -> torch.Tensor:
    """(x + eps) . (y + eps) over the last dimension, eps added to every component as published: -> (..., N)."""
    return ((x + eps) * (y + eps)).sum(-1)


def _reciprocal(x: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
    """1 / x of a flow, and 0 at a padded position (``keep`` False) or where the flow is 0 (eps = 0, a sink whose
    sources are all padding), with no inf in the result or the gradient; a NaN stays NaN."""
    some = x != 0 if keep is None else (x != 0) & keep
    r: torch.Tensor = torch.where(some, torch.where(some, x, 1.0).reciprocal(), 0.0)  # torch.where(c, x, 0.0): Any
    return r


def _zero_padded(stats: FlowStats, qkeep: torch.Tensor | None, kkeep: torch.Tensor | None) -> FlowStats:
    """The statistics with 0 at every padded sink (``qkeep`` False) and source (``kkeep`` False)."""
    if qkeep is None and kkeep is None:
        return stats
    sinks = {"incoming", "conserved_incoming", "allocation"}
    fields: dict[str, torch.Tensor] = {}
    for field, x in stats._asdict().items():
        keep = qkeep if field in sinks else kkeep
        fields[field] = x if keep is None else torch.where(keep, x, 0.0)
    return FlowStats(**fields)


def _sigmoid_features(x: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
    """sigmoid(x), 0 at a padded position (``keep`` (B, 1, N) False), which no NaN there reaches."""
    if keep is None:
        return torch.sigmoid(x)
    real = keep.unsqueeze(-1)  # (B, 1, N, 1)
    return torch.where(real, torch.sigmoid(torch.where(real, x, 0.0)), 0.0)


def _flow_full(
    qs: torch.Tensor,
    ks: torch.Tensor,
    v: torch.Tensor,
    eps: float,
    qkeep: torch.Tensor | None,
    kkeep: torch.Tensor | None,
    competition: bool,
    allocation: bool,
) -> tuple[torch.Tensor, FlowStats]:
    """Non-causal Flow-Attention on q~ (B, H, N, D), k~ (B, H, M, D), v (B, H, M, Dv), 0 at padding (``qkeep``
    (B, 1, N), ``kkeep`` (B, 1, M), True = real), as the module docstring writes it."""
    N, M = qs.shape[-2], ks.shape[-2]
    n = N if qkeep is None else qkeep.sum(-1, keepdim=True).to(qs.dtype)  # real sinks, (B, 1, 1)
    m = M if kkeep is None else kkeep.sum(-1, keepdim=True).to(qs.dtype)  # real sources, (B, 1, 1)
    incoming = _dot(qs, ks.sum(-2, keepdim=True), eps)  # (B, H, N): I_i
    outgoing = _dot(ks, qs.sum(-2, keepdim=True), eps)  # (B, H, M): O_j
    r_in, r_out = _reciprocal(incoming, qkeep), _reciprocal(outgoing, kkeep)
    conserved_incoming = _dot(qs, (ks * r_out.unsqueeze(-1)).sum(-2, keepdim=True), eps)  # (B, H, N): I^_i
    conserved_outgoing_raw = _dot(ks, (qs * r_in.unsqueeze(-1)).sum(-2, keepdim=True), eps)  # (B, H, M): O^_j
    conserved_outgoing = conserved_outgoing_raw.clamp(-1.0, 1.0)  # for stability, as published
    if not competition:
        c = torch.ones_like(conserved_outgoing)
    else:  # softmax over the (real) sources, times their number; a row without any is 0
        scores = conserved_outgoing if kkeep is None else conserved_outgoing.masked_fill(~kkeep, float("-inf"))
        c = torch.softmax(scores, dim=-1) * m  # (B, H, M): c_j
    if not allocation:
        a = torch.ones_like(conserved_incoming)
    else:
        sources = m.clamp(min=1) if isinstance(m, torch.Tensor) else m  # no division by 0 sources
        a = torch.sigmoid(conserved_incoming * (n / sources))  # (B, H, N): a_i
    if kkeep is not None:
        c = torch.where(kkeep, c, 0.0)
    kv = ks.transpose(-2, -1) @ (v * c.unsqueeze(-1))  # (B, H, D, Dv): sum_j k~_j (c_j v_j)^T
    out = (qs @ kv) * (a * r_in).unsqueeze(-1)  # (B, H, N, Dv): a_i q~_i / I_i . kv
    stats = FlowStats(incoming, outgoing, conserved_incoming, conserved_outgoing, c, a, conserved_outgoing_raw)
    return out, _zero_padded(stats, qkeep, kkeep)


def _initial_state(x: torch.Tensor, B: int, H: int, D: int, Dv: int, acc: torch.dtype) -> FlowState:
    zeros = x.new_zeros(B, H, D, dtype=acc)
    kv = x.new_zeros(B, H, D, Dv, dtype=acc)
    t = x.new_zeros(B, dtype=torch.int64)
    return FlowState(t, zeros, zeros, zeros, zeros, x.new_zeros(B, H, dtype=acc), kv)


def _flow_causal(
    state: FlowState,
    qs: torch.Tensor,
    ks: torch.Tensor,
    v: torch.Tensor,
    eps: float,
    keep: torch.Tensor | None,
    competition: bool,
    allocation: bool,
    chunk_size: int,
) -> tuple[torch.Tensor, FlowStats, FlowState]:
    """Causal Flow-Attention of the next N tokens after ``state``: q~, k~ (B, H, N, D), v (B, H, N, Dv), 0 at
    padding (``keep`` (B, 1, N), True = real). Every quantity is a cumulative sum on top of the state's totals,
    divided by t_i; the output is chapter 2's chunked product from the state's kv. N = 1 is the recurrent step.
    Returns (out (B, H, N, Dv), FlowStats, the state after the last token)."""
    acc = state.kv.dtype
    steps = torch.ones_like(qs[:, :1, :, 0]) if keep is None else keep.to(acc)  # (B, 1, N): 1 for a real token
    t = (state.t.to(acc)[:, None, None] + steps.cumsum(-1)).clamp(min=1.0)  # (B, 1, N): t_i (>= 1: left padding)
    key_sum = state.key_sum.unsqueeze(-2) + ks.cumsum(-2)  # (B, H, N, D): sum_{j<=i} k~_j
    query_sum = state.query_sum.unsqueeze(-2) + qs.cumsum(-2)  # (B, H, N, D): sum_{i'<=i} q~_i'
    incoming = _dot(qs, key_sum, eps) / t  # (B, H, N): I_i
    outgoing = _dot(ks, query_sum, eps) / t  # (B, H, N): O_j
    r_in, r_out = _reciprocal(incoming, keep), _reciprocal(outgoing, keep)
    key_over_outgoing = state.key_over_outgoing.unsqueeze(-2) + (ks * r_out.unsqueeze(-1)).cumsum(-2)
    query_over_incoming = state.query_over_incoming.unsqueeze(-2) + (qs * r_in.unsqueeze(-1)).cumsum(-2)
    conserved_incoming = _dot(qs, key_over_outgoing, eps) / t  # (B, H, N): I^_i
    conserved_outgoing_raw = _dot(ks, query_over_incoming, eps) / t  # (B, H, N): O^_j
    conserved_outgoing = conserved_outgoing_raw.clamp(-1.0, 1.0)  # for stability, as published
    # Competition exp(O^_j) / sum_{j'<=j} exp(O^_j') t_j = exp(O^_j) / (the mean of exp(O^) over the prefix),
    # the mean carried in the state as m and updated as m_i = m + sum_{s<j<=i} (exp(O^_j) - m) / t_i: every
    # term lies in [1/e, e] because O^ is clamped, so nothing grows with the sequence length.
    expo = conserved_outgoing.exp()  # (B, H, N), in [1/e, e]
    delta = (expo - state.exp_mean.unsqueeze(-1)) * steps  # (B, H, N): 0 at padding
    exp_mean = state.exp_mean.unsqueeze(-1) + delta.cumsum(-1) / t  # (B, H, N); 0 only before any real token
    c = expo / torch.where(exp_mean > 0, exp_mean, 1.0) if competition else torch.ones_like(expo)  # c_j
    a = torch.sigmoid(conserved_incoming) if allocation else torch.ones_like(conserved_incoming)  # a_i
    if keep is not None:
        c, a = torch.where(keep, c, 0.0), torch.where(keep, a, 0.0)
    out, kv = chunked_causal_product(qs, ks, v * c.unsqueeze(-1), chunk_size, state.kv)  # (B, H, N, Dv)
    out = out * (a * r_in / t).unsqueeze(-1)  # a_i / (I_i t_i)
    stats = FlowStats(incoming, outgoing, conserved_incoming, conserved_outgoing, c, a, conserved_outgoing_raw)
    new_state = FlowState(  # contiguous copies: no view keeps the sums of every position alive
        state.t + steps[:, 0].sum(-1).long(),
        key_sum[..., -1, :].contiguous(),
        query_sum[..., -1, :].contiguous(),
        key_over_outgoing[..., -1, :].contiguous(),
        query_over_incoming[..., -1, :].contiguous(),
        exp_mean[..., -1].contiguous(),
        kv,
    )
    return out, _zero_padded(stats, keep, keep), new_state


def _check_flow_state(
    state: object, B: int, H: int, D: int, Dv: int, acc: torch.dtype, device: torch.device, *, name: str, arg: str
) -> FlowState:
    vectors = {f: (B, H, D) for f in ("key_sum", "query_sum", "key_over_outgoing", "query_over_incoming")}
    fields: dict[str, tuple[int, ...]] = {**vectors, "exp_mean": (B, H), "kv": (B, H, D, Dv)}
    return check_state(state, FlowState, fields, name=name, dtype=acc, device=device, counts={"t": (B,)}, arg=arg)


#: What :func:`flow_attention` returns: out, and the statistics and the final state when asked for.
_Out: TypeAlias = "Tensor | tuple[Tensor, FlowStats] | tuple[Tensor, FlowState] | tuple[Tensor, FlowStats, FlowState]"


class _Options(TypedDict, total=False):
    """The keywords of :func:`flow_attention` that its overloads do not tell apart."""

    is_causal: bool
    attn_mask: Tensor | None
    key_padding_mask: Tensor | None
    query_padding_mask: Tensor | None
    eps: float
    chunk_size: int
    out_dtype: torch.dtype | None
    competition: bool
    allocation: bool
    initial_state: FlowState | None
    causal: bool | None


@overload
def flow_attention(
    q: Tensor, k: Tensor, v: Tensor, *, return_flows: Literal[False] = ..., output_final_state: Literal[False] = ...,
    **options: Unpack[_Options],
) -> Tensor: ...  # fmt: skip
@overload
def flow_attention(
    q: Tensor, k: Tensor, v: Tensor, *, return_flows: Literal[True], output_final_state: Literal[False] = ...,
    **options: Unpack[_Options],
) -> tuple[Tensor, FlowStats]: ...  # fmt: skip
@overload
def flow_attention(
    q: Tensor, k: Tensor, v: Tensor, *, return_flows: Literal[False] = ..., output_final_state: Literal[True],
    **options: Unpack[_Options],
) -> tuple[Tensor, FlowState]: ...  # fmt: skip
@overload
def flow_attention(
    q: Tensor, k: Tensor, v: Tensor, *, return_flows: Literal[True], output_final_state: Literal[True],
    **options: Unpack[_Options],
) -> tuple[Tensor, FlowStats, FlowState]: ...  # fmt: skip
@overload
def flow_attention(
    q: Tensor, k: Tensor, v: Tensor, *, return_flows: Literal[False] = ..., output_final_state: bool,
    **options: Unpack[_Options],
) -> Tensor | tuple[Tensor, FlowState]: ...  # fmt: skip
@overload
def flow_attention(
    q: Tensor, k: Tensor, v: Tensor, *, return_flows: bool = ..., output_final_state: bool = ...,
    **options: Unpack[_Options],
) -> _Out: ...  # fmt: skip


def flow_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    is_causal: bool = False,
    attn_mask: torch.Tensor | None = None,
    key_padding_mask: torch.Tensor | None = None,
    query_padding_mask: torch.Tensor | None = None,
    eps: float = 1e-6,
    return_flows: bool = False,
    chunk_size: int = 64,
    out_dtype: torch.dtype | None = None,
    competition: bool = True,
    allocation: bool = True,
    initial_state: FlowState | None = None,
    output_final_state: bool = False,
    causal: bool | None = None,
) -> _Out:
    """Flow-Attention (Wu et al., "Flowformer", ICML 2022): linear attention with flow conservation.

    ``out_i = a_i (q~_i / I_i) . sum_j k~_j (c_j v_j)^T``, q~ = sigmoid(q), k~ = sigmoid(k), the flows, allocation a
    and competition c of the module docstring; causal: sums over the prefix, normalised by t_i.

    Cost: O(B H (N + M) D Dv) time and O(B H (N + M) (D + Dv)) memory; causal: O(B H N (ell + D) Dv) time and
    O(B H N (ell + D + D Dv / ell)) memory, ell = ``chunk_size``.

    Args:
        q, k, v: queries (sinks) (B, H, N, D), keys (sources) (B, H, M, D), values (B, H, M, Dv).
        is_causal, attn_mask, chunk_size, out_dtype, causal: as in :func:`attnbook.linear_attention`.
        key_padding_mask: (B, M) bool, True = padding (causal: padded *positions*, left padding works).
        query_padding_mask: (B, N) bool, True = padding: padded sinks output 0; None when causal.
        eps: added to every component of the flow vectors, as published (0 <= eps <= 1). With eps = 0, queries
            and keys below about -45 make flows under float32's smallest normal number and the output inf (at -46)
            or 0 (at -60) where the float64 answer is finite: pass float64 inputs there.
        return_flows: also return the :class:`FlowStats`.
        competition, allocation: False sets c_j = 1 or a_i = 1 (the paper's ablations).
        initial_state, output_final_state: causal only: the :class:`FlowState` before these tokens, or None; and
            whether to return the one after the last.

    Returns:
        out (B, H, N, Dv), or ``(out, FlowStats)``, ``(out, FlowState)`` or ``(out, FlowStats, FlowState)``. A NaN in
        a visible input makes the outputs that depend on it NaN (non-causal: every output; causal: also the earlier
        outputs of its chunk, where a weight of 0 multiplies it).

    Example:
        >>> import torch, attnbook
        >>> q, k, v = (torch.randn(2, 4, 16, 8) for _ in range(3))  # (B, H, N, D)
        >>> pad = torch.zeros(2, 16, dtype=torch.bool)
        >>> pad[0, 12:] = True  # the first sequence has 12 real tokens
        >>> padded = attnbook.flow_attention(q, k, v, key_padding_mask=pad, query_padding_mask=pad)
        >>> alone = attnbook.flow_attention(q[:1, :, :12], k[:1, :, :12], v[:1, :, :12])
        >>> torch.allclose(padded[:1, :, :12], alone, atol=1e-6)
        True
    """
    name = "flow_attention"
    causal = check_is_causal(is_causal, causal, name=name)
    return_flows = check_bool(return_flows, "return_flows", name=name)
    competition = check_bool(competition, "competition", name=name)
    allocation = check_bool(allocation, "allocation", name=name)
    output_final_state = check_bool(output_final_state, "output_final_state", name=name)
    B, H, N, M, D, Dv = check_qkv(q, k, v, name=name, same_length=causal, why=_CAUSAL_PAIRS)
    check_no_attn_mask(attn_mask, name=name, why=_NO_ATTN_MASK)
    eps = check_eps(eps, name=name)
    chunk_size = check_int(chunk_size, "chunk_size", name=name, minimum=1)
    dtype = result_dtype(q) if out_dtype is None else check_dtype(out_dtype, "out_dtype", name=name)
    acc = accumulation_dtype(q.dtype)
    kkeep = qkeep = None  # (B, 1, M), (B, 1, N): True = a real position
    if key_padding_mask is not None:
        kkeep = ~check_key_padding_mask(key_padding_mask, B, M, name=name).to(q.device)[:, None, :]
    if query_padding_mask is not None:
        why = " (query i and key i are one position, which key_padding_mask pads)"
        check_choice(causal, "is_causal", (False,), name=f"{name} with a query_padding_mask", why=why)
        qkeep = ~check_key_padding_mask(query_padding_mask, B, N, name=name).to(q.device)[:, None, :]  # (B, N) too
    check_state_call(causal, initial_state, output_final_state, name=name)
    with autocast_disabled(q.device):
        qs, ks = _sigmoid_features(q.to(acc), qkeep if not causal else kkeep), _sigmoid_features(k.to(acc), kkeep)
        v = v.to(acc) if kkeep is None else torch.where(kkeep.unsqueeze(-1), v.to(acc), 0.0)
        if not causal:
            out, stats = _flow_full(qs, ks, v, eps, qkeep, kkeep, competition, allocation)
            state = None
        else:
            if initial_state is None:
                initial_state = _initial_state(q, B, H, D, Dv, acc)
            else:
                _check_flow_state(initial_state, B, H, D, Dv, acc, q.device, name=name, arg="initial_state")
            out, stats, state = _flow_causal(initial_state, qs, ks, v, eps, kkeep, competition, allocation, chunk_size)
    out = out.to(dtype)
    if return_flows and output_final_state:
        return out, stats, cast(FlowState, state)
    if return_flows:
        return out, stats
    if output_final_state:
        return out, cast(FlowState, state)
    return out


def flow_attention_step(
    q_t: torch.Tensor,
    k_t: torch.Tensor,
    v_t: torch.Tensor,
    state: FlowState | None = None,
    *,
    eps: float = 1e-6,
    competition: bool = True,
    allocation: bool = True,
) -> tuple[torch.Tensor, FlowState]:
    """One token of causal Flow-Attention from the prefix state: the recurrent form for generation.

    q_t, k_t (B, H, D), v_t (B, H, Dv) and the :class:`FlowState` before them (None before the first token) ->
    ``(out_t (B, H, Dv), new state)``, in O(B H D Dv) whatever t; the options as in :func:`flow_attention`.

    Example:
        >>> import torch, attnbook
        >>> q, k, v = (torch.randn(1, 2, 6, 4) for _ in range(3))
        >>> state = None
        >>> for t in range(6):
        ...     out_t, state = attnbook.flow_attention_step(q[:, :, t], k[:, :, t], v[:, :, t], state)
        >>> torch.allclose(out_t, attnbook.flow_attention(q, k, v, is_causal=True)[:, :, -1], atol=1e-6)
        True
    """
    name = "flow_attention_step"
    B, H, D, Dv = check_step_inputs(q_t, k_t, v_t, name=name)
    eps = check_eps(eps, name=name)
    competition = check_bool(competition, "competition", name=name)
    allocation = check_bool(allocation, "allocation", name=name)
    dtype, acc = result_dtype(q_t), accumulation_dtype(q_t.dtype)
    if state is None:
        state = _initial_state(q_t, B, H, D, Dv, acc)
    else:
        _check_flow_state(state, B, H, D, Dv, acc, q_t.device, name=name, arg="state")
    with autocast_disabled(q_t.device):
        qs, ks, v = (x.to(acc).unsqueeze(-2) for x in (torch.sigmoid(q_t), torch.sigmoid(k_t), v_t))  # (B, H, 1, .)
        out, _, new_state = _flow_causal(state, qs, ks, v, eps, None, competition, allocation, 1)
    return out.squeeze(-2).to(dtype), new_state  # (B, H, Dv)


class FlowAttention(ProjectedAttention[FlowState]):
    """Multi-head Flow-Attention with the module family's projections (Wu et al., ICML 2022).

    The parameters of the published ``Flow_Attention`` module (whose ``drop_out=0.05`` is the default), so its
    checkpoints load unchanged; ``eps``, ``competition``, ``allocation`` as in :func:`flow_attention`; ``causal``:
    every forward is causal. Calls as :class:`attnbook.ProjectedAttention`; in self-attention (``layer(x)`` or
    ``layer(x, x, x)``) a padded position neither sends nor receives flow, with separate keys only keys are padded.

    Example:
        >>> import torch, attnbook
        >>> layer = attnbook.FlowAttention(32, 32, 32, n_heads=4, drop_out=0.0)
        >>> x = torch.randn(2, 10, 32)
        >>> pad = torch.tensor([[False] * 7 + [True] * 3, [False] * 10])  # True = padding
        >>> torch.allclose(layer(x, key_padding_mask=pad)[:1, :7], layer(x[:1, :7]), atol=1e-5)
        True
    """

    def __init__(
        self,
        d_input: int,
        d_model: int | None = None,
        d_output: int | None = None,
        n_heads: int | None = None,
        drop_out: float = 0.05,
        eps: float = 1e-6,
        causal: bool = False,
        competition: bool = True,
        allocation: bool = True,
        **kwargs: Any,
    ):
        super().__init__(d_input, d_model, d_output, n_heads, drop_out, **kwargs)
        name = type(self).__name__
        self.eps = check_eps(eps, name=name)
        self.causal = check_bool(causal, "causal", name=name)
        self.competition = check_bool(competition, "competition", name=name)
        self.allocation = check_bool(allocation, "allocation", name=name)
        self.same_length, self.same_length_reason = self.causal, _CAUSAL_PAIRS

    def extra_repr(self) -> str:
        ablated = "".join(f", {n}=False" for n in ("competition", "allocation") if not getattr(self, n))
        return f"n_heads={self.n_heads}, eps={self.eps}, causal={self.causal}{ablated}"

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        *,
        attn_mask: torch.Tensor | None = None,
        key_padding_mask: torch.Tensor | None = None,
        self_attention: bool = True,
        is_causal: bool | None = None,
        initial_state: FlowState | None = None,
        output_final_state: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, FlowState]:
        is_causal = self.causal if is_causal is None else is_causal
        # the accumulation dtype: the out-projection rounds (attnbook.ProjectedAttention)
        query_padding = key_padding_mask if self_attention and not is_causal else None
        return flow_attention(
            q,
            k,
            v,
            is_causal=is_causal,
            attn_mask=attn_mask,
            key_padding_mask=key_padding_mask,
            query_padding_mask=query_padding,
            eps=self.eps,
            out_dtype=accumulation_dtype(q.dtype),
            competition=self.competition,
            allocation=self.allocation,
            initial_state=initial_state,
            output_final_state=output_final_state,
        )

    def attend_step(
        self, q_t: torch.Tensor, k_t: torch.Tensor, v_t: torch.Tensor, state: FlowState | None
    ) -> tuple[torch.Tensor, FlowState]:
        return flow_attention_step(
            q_t, k_t, v_t, state, eps=self.eps, competition=self.competition, allocation=self.allocation
        )
