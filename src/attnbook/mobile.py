"""Mobile-Attention: Flow-Attention whose flow budget is shared by the heads at each position (chapter 4).

Yao et al., "Mobile Attention" (ICML 2024), the head-competing variant of Flow-Attention (Wu et al.,
ICML 2022); the numbers are those of the published ``Mobile_Attention`` core code. With q~ = sigmoid(q),
k~ = sigmoid(k) per head, eps = 1e-6, and every flow sum taken over the H heads at the *same position*
(hence N == M):

    incoming flow       I_hi  = (q~_hi + eps) . (sum_h' k~_h'i + eps)
    outgoing flow       O_hj  = (k~_hj + eps) . (sum_h' q~_h'j + eps)
    conserved incoming  I^_hi = (q~_hi + eps) . (sum_h' k~_h'i / O_h'i + eps)
    conserved outgoing  O^_hj = clamp((k~_hj + eps) . (sum_h' q~_h'j / I_h'j + eps), -1, 1)
    allocation          a_hi  = sigmoid(I^_hi N / M)   (N / M = 1)
    competition         c_hj  = softmax over the sequence j of O^_hj, times M
    output              out_hi = a_hi (q~_hi / I_hi) . sum_j k~_hj (c_hj v_hj)^T

The heads at one token now compete for that token's flow: with eps = 0, sum_h O^_hj = H and sum_h I^_hi = H
(before the clamp), whereas in Flow-Attention the budget is spread over the sequence. The head sums pair query i
with key i, so N == M (the published code silently broadcasts when one length is 1), and ``key_padding_mask``
(B, N) pads *positions*: a padded position sends and receives no flow, takes no part in the competition, and
outputs 0. There is no causal form (the competition is a softmax over the whole sequence).

Range: the weights (q~_hi . k~_hj) / I_hi of one query sum to about N / H, so the output can grow like N |v|,
beyond float16's 65504 for long sequences; :class:`MobileAttention` feeds the float32 result to its output
projection without rounding it to float16 first.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, NoReturn, TypedDict, overload

import torch
from torch import Tensor

from ._checks import (
    check_bool,
    check_choice,
    check_dtype,
    check_eps,
    check_is_causal,
    check_key_padding_mask,
    check_no_attn_mask,
    check_qkv,
    check_supported,
)
from ._module import ProjectedAttention
from ._runtime import accumulation_dtype, autocast_disabled, result_dtype
from .flow import FlowStats, _reciprocal, _zero_padded

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["mobile_attention", "MobileAttention"]

_PAIRS = " (the heads compete for each position: query i pairs with key i)"
_NO_ATTN_MASK = (
    " (Mobile-Attention never forms the N x M weights, so an arbitrary mask cannot be applied to them: pass "
    "key_padding_mask for padding)"
)
_NO_CAUSAL = (
    " (Mobile-Attention has no causal form: its competition is a softmax over the whole sequence and its flows "
    "are sums over the heads of every position, with no prefix version published)"
)

#: The four flows (I, O, I^, O^ before the clamp), each (B, H, N).
Flows = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def head_flows(qs: torch.Tensor, ks: torch.Tensor, eps: float, keep: torch.Tensor | None) -> Flows:
    """The flows of the module docstring, every sum over the heads of one position: q~, k~ (B, H, N, D) (0 at padding)
    -> I, O, I^, O^ (B, H, N)."""

    def flow(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:  # (x + eps) . (y + eps), y summed over heads
        return ((x + eps) * (y.sum(1, keepdim=True) + eps)).sum(-1)  # (B, H, N)

    incoming = flow(qs, ks)  # I_hi
    outgoing = flow(ks, qs)  # O_hj
    conserved_incoming = flow(qs, ks * _reciprocal(outgoing, keep).unsqueeze(-1))  # I^_hi
    conserved_outgoing_raw = flow(ks, qs * _reciprocal(incoming, keep).unsqueeze(-1))  # O^_hj, unclamped
    return incoming, outgoing, conserved_incoming, conserved_outgoing_raw


class _Options(TypedDict, total=False):
    """The keywords of :func:`mobile_attention` but ``return_flows``, for its overloads."""

    attn_mask: Tensor | None
    key_padding_mask: Tensor | None
    is_causal: bool
    eps: float
    out_dtype: torch.dtype | None


@overload
def mobile_attention(
    q: Tensor, k: Tensor, v: Tensor, *, return_flows: Literal[False] = ..., **options: Unpack[_Options]
) -> Tensor: ...
@overload
def mobile_attention(
    q: Tensor, k: Tensor, v: Tensor, *, return_flows: Literal[True], **options: Unpack[_Options]
) -> tuple[Tensor, FlowStats]: ...
@overload
def mobile_attention(
    q: Tensor, k: Tensor, v: Tensor, *, return_flows: bool, **options: Unpack[_Options]
) -> Tensor | tuple[Tensor, FlowStats]: ...


def mobile_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    attn_mask: torch.Tensor | None = None,
    key_padding_mask: torch.Tensor | None = None,
    is_causal: bool = False,
    eps: float = 1e-6,
    return_flows: bool = False,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor | tuple[torch.Tensor, FlowStats]:
    """Mobile-Attention (Yao et al., ICML 2024): Flow-Attention with the heads competing for each token.

    ``out_hi = a_hi (q~_hi / I_hi) . sum_j k~_hj (c_hj v_hj)^T``, the flows summed over the heads at one position
    (module docstring). Cost: O(B H N D Dv) time, O(B H N (D + Dv)) memory.

    Args:
        q, k, v: queries (B, H, N, D), keys (B, H, M, D) with M == N, values (B, H, M, Dv).
        key_padding_mask: (B, N) bool, True = padding: padded *positions*.
        attn_mask, is_causal: must be None and False.
        eps, return_flows, out_dtype: as in :func:`attnbook.flow_attention` (pass float32 to keep an output beyond
            float16's range).

    Returns:
        out (B, H, N, Dv), or ``(out, FlowStats)`` (every field (B, H, N)).

    Example:
        >>> import torch, attnbook
        >>> q, k, v = (torch.randn(2, 8, 16, 4) for _ in range(3))  # eight heads of width 4
        >>> out, flows = attnbook.mobile_attention(q, k, v, return_flows=True)
        >>> out.shape, tuple(flows.incoming.shape)
        (torch.Size([2, 8, 16, 4]), (2, 8, 16))
    """
    name = "mobile_attention"
    return_flows = check_bool(return_flows, "return_flows", name=name)
    check_choice(check_is_causal(is_causal, name=name), "is_causal", (False,), name=name, why=_NO_CAUSAL)
    B, _, N, _, _, _ = check_qkv(q, k, v, name=name, same_length=True, why=_PAIRS)
    check_no_attn_mask(attn_mask, name=name, why=_NO_ATTN_MASK)
    eps = check_eps(eps, name=name)
    dtype = result_dtype(q) if out_dtype is None else check_dtype(out_dtype, "out_dtype", name=name)
    acc = accumulation_dtype(q.dtype)
    keep = None  # (B, 1, N): True = a real position
    if key_padding_mask is not None:
        keep = ~check_key_padding_mask(key_padding_mask, B, N, name=name).to(q.device)[:, None, :]
    with autocast_disabled(q.device):
        out, stats = _mobile(q, k, v, eps, acc, keep)
    return (out.to(dtype), stats) if return_flows else out.to(dtype)


def _mobile(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, eps: float, acc: torch.dtype, keep: torch.Tensor | None
) -> tuple[torch.Tensor, FlowStats]:
    """Mobile-Attention on q, k (B, H, N, D), v (B, H, N, Dv); ``keep`` (B, 1, N) bool marks the real positions.
    Returns (out in the accumulation dtype, FlowStats)."""
    q, k, v = q.to(acc), k.to(acc), v.to(acc)
    N = M = q.shape[-2]
    m: float | torch.Tensor = M  # the real positions
    if keep is not None:  # a padded position sends and receives nothing, whatever it holds (NaN too)
        real = keep.unsqueeze(-1)  # (B, 1, N, 1)
        q, k, v = (torch.where(real, x, 0.0) for x in (q, k, v))
        m = keep.sum(-1, keepdim=True).to(acc)  # (B, 1, 1)
    qs, ks = torch.sigmoid(q), torch.sigmoid(k)  # (B, H, N, D)
    if keep is not None:
        qs, ks = torch.where(real, qs, 0.0), torch.where(real, ks, 0.0)
    incoming, outgoing, conserved_incoming, conserved_outgoing_raw = head_flows(qs, ks, eps, keep)  # (B, H, N) each
    conserved_outgoing = conserved_outgoing_raw.clamp(-1.0, 1.0)  # for stability, as published
    allocation = torch.sigmoid(conserved_incoming * (N / M))  # a_hi; N / M = 1
    scores = conserved_outgoing if keep is None else conserved_outgoing.masked_fill(~keep, float("-inf"))
    competition = torch.softmax(scores, dim=-1) * m  # c_hj: over the (real) sequence, times M
    if keep is not None:
        competition, allocation = torch.where(keep, competition, 0.0), torch.where(keep, allocation, 0.0)
    kv = ks.transpose(-2, -1) @ (v * competition.unsqueeze(-1))  # (B, H, D, Dv): sum_j k~_j (c_j v_j)^T
    out = (qs @ kv).mul_((allocation * _reciprocal(incoming, keep)).unsqueeze(-1))  # (B, H, N, Dv): a_i / I_i
    stats = FlowStats(
        incoming, outgoing, conserved_incoming, conserved_outgoing, competition, allocation, conserved_outgoing_raw
    )
    return out, _zero_padded(stats, keep, keep)


class MobileAttention(ProjectedAttention[NoReturn]):
    """Multi-head Mobile-Attention with the module family's projections (Yao et al., ICML 2024).

    The parameters of the published ``Mobile_Attention`` module (whose ``drop_out=0.05`` is the default); ``eps`` as in
    :func:`mobile_attention`. Calls as :class:`attnbook.ProjectedAttention`, with L == S, no ``attn_mask``, no causal
    form, and ``key_padding_mask`` padding positions.

    Example:
        >>> import torch, attnbook
        >>> layer = attnbook.MobileAttention(32, 32, 32, n_heads=8, drop_out=0.0)
        >>> layer(torch.randn(2, 10, 32)).shape
        torch.Size([2, 10, 32])
    """

    same_length = True
    same_length_reason = _PAIRS

    def __init__(
        self,
        d_input: int,
        d_model: int | None = None,
        d_output: int | None = None,
        n_heads: int | None = None,
        drop_out: float = 0.05,
        eps: float = 1e-6,
        **kwargs: Any,
    ):
        super().__init__(d_input, d_model, d_output, n_heads, drop_out, **kwargs)
        self.eps = check_eps(eps, name=type(self).__name__)

    def extra_repr(self) -> str:
        return f"n_heads={self.n_heads}, eps={self.eps}"

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
        initial_state: None = None,
        output_final_state: bool = False,
    ) -> torch.Tensor:
        is_causal = self.causal if is_causal is None else is_causal
        check_choice(is_causal, "is_causal", (False,), name=type(self).__name__, why=_NO_CAUSAL)
        # the accumulation dtype: the output can exceed float16's range where the projected output does not
        return mobile_attention(
            q,
            k,
            v,
            attn_mask=attn_mask,
            key_padding_mask=key_padding_mask,
            eps=self.eps,
            out_dtype=accumulation_dtype(q.dtype),
        )

    def attend_step(self, q_t: torch.Tensor, k_t: torch.Tensor, v_t: torch.Tensor, state: None) -> NoReturn:
        name, expected = f"{type(self).__name__}.step", f"have a recurrent step{_NO_CAUSAL}"
        check_supported(False, "the layer", name=name, expected=expected, got="a MobileAttention")
