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
(before the clamp), whereas in Flow-Attention the budget is spread over the sequence. Queries and keys
must have the same length: the head sums pair query i with key i (the published code does not check this
and silently broadcasts when one length is 1). :class:`attnbook.FlowStats` holds the flows themselves
(I, not 1 / I).

Cost: O(B H N D Dv) time, O(B H N (D + Dv)) memory, like linear attention.

Padding (``key_padding_mask`` (B, N), True = padding, as in ``nn.MultiheadAttention``): the head sums pair
query i with key i, so the mask pads *positions*: a padded position sends and receives no flow, takes no part
in the competition over the sequence, and its output is 0; the real positions get the numbers of a run on the
unpadded sequence. There is no causal form (the competition is a softmax over the whole sequence).

Range: the flows are sums over the H heads of one position, not over the sequence, so the weights
(q~_hi . k~_hj) / I_hi of one query sum to about N / H and the output can grow like N |v| (for small D
and long sequences it exceeds float16's 65504 long before float32's range). Everything is computed in
float32; :class:`MobileAttention` feeds that float32 result to its output projection without rounding it to
float16 first.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, NoReturn, TypedDict, overload

import torch
from torch import Tensor

from . import config
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
from ._runtime import accumulation_dtype, autocast_disabled, result_dtype, tracing
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
    """The flows of Mobile-Attention, every sum over the H heads of one position, as the module docstring
    writes them: q~, k~ (B, H, N, D) (0 at padding, ``keep`` (B, 1, N) False) -> I, O, I^, O^ (B, H, N)."""

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

    ``out_hi = a_hi (q~_hi / I_hi) . sum_j k~_hj (c_hj v_hj)^T``, the flows I, O, I^, O^ summed over the heads
    at one position (module docstring), competition c = softmax over the sequence of clamp(O^, -1, 1) times M,
    allocation a = sigmoid(I^).

    Cost: O(B H N D Dv) time, O(B H N (D + Dv)) memory.

    Args:
        q: queries (B, H, N, D).
        k: keys (B, H, M, D), with M == N.
        v: values (B, H, M, Dv).
        attn_mask: must be None: no N x M weights are formed for an arbitrary mask to act on.
        key_padding_mask: (B, N) bool, True = padding: padded *positions* (module docstring).
        is_causal: must be False: Mobile-Attention has no causal form.
        eps: added to every component of the flow vectors, as in the published code (0 <= eps <= 1).
        return_flows: also return the :class:`attnbook.FlowStats` (every field (B, H, N)).
        out_dtype: dtype of ``out``; default the inputs' (under autocast: the autocast dtype). The output can
            exceed float16's range (module docstring): pass float32 to keep it.

    Returns:
        out (B, H, N, Dv) in ``out_dtype`` (computed in at least float32, autocast off), or
        ``(out, FlowStats)``; the statistics are in the accumulation dtype. A NaN in any visible input makes
        the outputs that depend on it NaN (every output of its batch element); it is never hidden.

    Raises:
        ValueError: bad shapes, including N != M.

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
    if config.plain() or tracing() or torch.is_grad_enabled():  # the annex's Gram form: for inference only
        flows = head_flows(qs, ks, eps, keep)
    else:
        from ._fast.mobile import head_flows as gram_flows  # the speed annex (attnbook._fast)

        flows = gram_flows(qs, ks, eps, keep)
    incoming, outgoing, conserved_incoming, conserved_outgoing_raw = flows  # (B, H, N) each
    conserved_outgoing = conserved_outgoing_raw.clamp(-1.0, 1.0)  # for stability, as published
    allocation = torch.sigmoid(conserved_incoming * (N / M))  # a_hi; N / M = 1
    scores = conserved_outgoing if keep is None else conserved_outgoing.masked_fill(~keep, float("-inf"))
    competition = torch.softmax(scores, dim=-1) * m  # c_hj: over the (real) sequence, times M
    if keep is not None:
        competition, allocation = torch.where(keep, competition, 0.0), torch.where(keep, allocation, 0.0)
    kv = ks.transpose(-2, -1) @ (v * competition.unsqueeze(-1))  # (B, H, D, Dv): sum_j k~_j (c_j v_j)^T
    out = (qs @ kv).mul_((allocation * _reciprocal(incoming, keep)).unsqueeze(-1))  # (B, H, N, Dv): a_i / I_i
    stats = FlowStats(*flows[:3], conserved_outgoing, competition, allocation, conserved_outgoing_raw)
    return out, _zero_padded(stats, keep, keep)


class MobileAttention(ProjectedAttention[NoReturn]):
    """Multi-head Mobile-Attention with the module family's projections (Yao et al., ICML 2024).

    Parameter names and shapes are those of the published ``Mobile_Attention`` module, so its checkpoints load
    unchanged and give the same outputs.

    Args:
        d_input, d_model, d_output, n_heads, drop_out: see :class:`attnbook.ProjectedAttention`; the default
            ``drop_out=0.05`` is the published module's.
        eps: see :func:`mobile_attention`.
        device, dtype: of the parameters, as for torch's layers.

    Shape:
        ``forward(queries, keys=None, values=None, *, key_padding_mask=None)``: (B, L, d_input),
        (B, L, d_input), (B, L, d_input) -> (B, L, d_output); queries and keys of different lengths raise
        ``ValueError``. ``key_padding_mask`` (B, L) bool, True = padding, pads positions
        (:func:`mobile_attention`); ``attn_mask`` must be None and ``is_causal`` False (no causal form).

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
        check_supported(
            False,
            "the layer",
            name=f"{type(self).__name__}.step",
            expected=f"have a recurrent step{_NO_CAUSAL}",
            got="a MobileAttention",
        )
