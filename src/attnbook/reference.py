"""Literal float64 definitions: the oracles that tests and the book check the fast code against.

Each function computes its mechanism exactly as the equations read: the N x M matrix written out,
sequences walked one step at a time. They are slow on purpose and never imported by the fast code.
Inputs are converted to float64; results are float64.

Example:
    >>> import torch, attnbook
    >>> from attnbook import reference
    >>> q, k, v = (torch.randn(1, 2, 8, 4) for _ in range(3))
    >>> fast = attnbook.linear_attention(q, k, v, is_causal=True)  # chunked, float32
    >>> oracle = reference.linear_attention(q, k, v, is_causal=True)  # the N x N matrix, float64
    >>> torch.testing.assert_close(fast.double(), oracle, rtol=2e-4, atol=2e-5)
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal, TypedDict, cast, overload

import torch
from torch import Tensor

from ._checks import (
    check_attn_mask,
    check_feature_map,
    check_is_causal,
    check_key_padding_mask,
    check_number,
    check_qkv,
    check_renamed_mask,
)

if TYPE_CHECKING:  # result and argument types only: the oracles compute everything themselves
    from typing_extensions import Unpack

    from ._module import RecurrentAttention
    from .feature_maps import FeatureMap
    from .flow import FlowStats
    from .moh import MoHAttention

# A q/k or scale normalisation of moh_attention: a callable on the last dimension.
_Norm = Callable[[torch.Tensor], torch.Tensor]

__all__ = [
    "softmax_attention",
    "linear_attention",
    "linear_attention_loop",
    "moh_attention",
    "flow_attention",
    "mobile_attention",
    "gated_linear_attention",
    "delta_rule_attention",
    "recurrent_layer",
]


def _positive(value: float | None, arg: str, *, name: str, zero: bool = False) -> Any:
    """A finite number > 0 (>= 0 with ``zero``), or None: a NaN, inf or negative one made NaN outputs."""
    return None if value is None else check_number(value, arg, name=name, minimum=0.0, strict_minimum=not zero)


def _f64(*xs: torch.Tensor) -> list[torch.Tensor]:
    return [x.to(torch.float64) for x in xs]


class _SoftmaxOptions(TypedDict, total=False):
    is_causal: bool
    attn_mask: Tensor | None
    key_padding_mask: Tensor | None
    scale: float | None
    causal: bool | None
    mask: Tensor | None


@overload
def softmax_attention(
    q: Tensor, k: Tensor, v: Tensor, *, return_weights: Literal[False] = ..., **options: Unpack[_SoftmaxOptions]
) -> Tensor: ...
@overload
def softmax_attention(
    q: Tensor, k: Tensor, v: Tensor, *, return_weights: Literal[True], **options: Unpack[_SoftmaxOptions]
) -> tuple[Tensor, Tensor]: ...
@overload
def softmax_attention(
    q: Tensor, k: Tensor, v: Tensor, *, return_weights: bool, **options: Unpack[_SoftmaxOptions]
) -> Tensor | tuple[Tensor, Tensor]: ...


def softmax_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    is_causal: bool = False,
    attn_mask: torch.Tensor | None = None,
    key_padding_mask: torch.Tensor | None = None,
    scale: float | None = None,
    return_weights: bool = False,
    causal: bool | None = None,
    mask: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """out_i = sum_j A_ij v_j with A_ij = exp(s_ij) / sum_j' exp(s_ij') over allowed j, s_ij = scale q_i . k_j + m_ij.

    The masks of :func:`attnbook.softmax_attention` (a row with no allowed key has zero weights). q (B,H,N,D),
    k (B,H,M,D), v (B,H,M,Dv) -> (B,H,N,Dv) float64 (and A (B,H,N,M) with ``return_weights``).

    Example:
        >>> import torch, attnbook
        >>> from attnbook import reference
        >>> q, k, v = (torch.randn(1, 2, 6, 4) for _ in range(3))
        >>> out, weights = reference.softmax_attention(q, k, v, is_causal=True, return_weights=True)
        >>> out.dtype, bool((weights.triu(1) == 0).all())  # float64; no weight above the diagonal
        (torch.float64, True)
        >>> torch.allclose(out.float(), attnbook.softmax_attention(q, k, v, is_causal=True), atol=1e-5)
        True
    """
    name = "reference.softmax_attention"
    check_qkv(q, k, v, name=name)
    scale = _positive(scale, "scale", name=name)
    is_causal = check_is_causal(is_causal, causal, name=name)
    attn_mask = check_renamed_mask(attn_mask, mask, name=name)
    q, k, v = _f64(q, k, v)
    B, H, N, M, D = q.shape[0], q.shape[1], q.shape[-2], k.shape[-2], q.shape[-1]
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    scores = torch.einsum("bhnd,bhmd->bhnm", q, k) * scale  # (B, H, N, M)
    allowed = torch.ones(N, M, dtype=torch.bool, device=q.device)
    if is_causal:
        allowed = allowed.tril()
    masks = [] if attn_mask is None else [check_attn_mask(attn_mask, (B, H, N, M), name=name)]
    if key_padding_mask is not None:
        padding = check_key_padding_mask(key_padding_mask, B, M, name=name, floating=True)[:, None, None, :]
        masks.append(~padding if padding.dtype == torch.bool else padding)  # as "may attend" or an addition
    for m in masks:
        if m.dtype == torch.bool:
            allowed = allowed & m.to(q.device)
        else:
            scores = scores + m.to(q.device, torch.float64)
            allowed = allowed & (m.to(q.device) != -math.inf)  # a NaN forbids nothing: its row is NaN
    allowed = allowed.expand_as(scores)
    scores = scores.masked_fill(~allowed, -math.inf)  # a forbidden score is -inf before exp, whatever it was
    row_max = scores.amax(dim=-1, keepdim=True)
    row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))  # nothing allowed: -inf
    numer = torch.exp(scores - row_max)  # (B, H, N, M), zero where not allowed
    denom = numer.sum(dim=-1, keepdim=True)
    weights = numer / torch.where(denom > 0, denom, torch.ones_like(denom))
    out = torch.einsum("bhnm,bhmv->bhnv", weights, v)  # (B, H, N, Dv)
    return (out, weights) if return_weights else out


def _linear_phi(feature_map: str | FeatureMap, x: torch.Tensor) -> torch.Tensor:
    """The feature map written out for the oracles: elu(x) + 1, max(x, 0), or the given callable."""
    check_feature_map(feature_map, ("elu", "relu"), name="reference")
    if feature_map == "elu":
        return torch.where(x > 0, x + 1, torch.exp(x))
    if feature_map == "relu":
        return torch.clamp(x, min=0)
    assert not isinstance(feature_map, str)  # check_feature_map accepts no other name
    return feature_map(x).to(torch.float64)


class _LinearOptions(TypedDict, total=False):
    is_causal: bool
    feature_map: str | FeatureMap
    key_padding_mask: Tensor | None
    eps: float
    causal: bool | None


@overload
def linear_attention(
    q: Tensor, k: Tensor, v: Tensor, *, return_weights: Literal[False] = ..., **options: Unpack[_LinearOptions]
) -> Tensor: ...
@overload
def linear_attention(
    q: Tensor, k: Tensor, v: Tensor, *, return_weights: Literal[True], **options: Unpack[_LinearOptions]
) -> tuple[Tensor, Tensor]: ...
@overload
def linear_attention(
    q: Tensor, k: Tensor, v: Tensor, *, return_weights: bool, **options: Unpack[_LinearOptions]
) -> Tensor | tuple[Tensor, Tensor]: ...


def linear_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    is_causal: bool = False,
    feature_map: str | FeatureMap = "elu",
    key_padding_mask: torch.Tensor | None = None,
    eps: float = 1e-6,
    return_weights: bool = False,
    causal: bool | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """out_i = sum_j A_ij v_j,  A_ij = phi(q_i).phi(k_j) / (sum_j' phi(q_i).phi(k_j') + eps) over allowed j.

    The normalised N x M kernel matrix written out (Katharopoulos et al., ICML 2020, Eq. 4). Allowed: the keys
    that ``key_padding_mask`` (B, M) does not pad, and j <= i when ``is_causal``. q (B,H,N,D), k (B,H,M,D),
    v (B,H,M,Dv) -> (B,H,N,Dv) float64 (and A (B,H,N,M) with ``return_weights``).

    Example:
        >>> import torch
        >>> from attnbook import reference
        >>> q, k, v = (torch.randn(1, 2, 6, 4) for _ in range(3))
        >>> pad = torch.tensor([[False] * 4 + [True] * 2])  # (B, M): the last two keys are padding
        >>> _, weights = reference.linear_attention(q, k, v, key_padding_mask=pad, return_weights=True)
        >>> bool((weights[..., 4:] == 0).all()), torch.allclose(weights.sum(-1), torch.ones(1, 2, 6).double())
        (True, True)
    """
    causal = check_is_causal(is_causal, causal, name="reference.linear_attention")
    check_qkv(q, k, v, name="reference.linear_attention", same_length=causal)
    eps = _positive(eps, "eps", name="reference.linear_attention", zero=True)
    q, k, v = _f64(q, k, v)
    N, M = q.shape[-2], k.shape[-2]
    fq, fk = _linear_phi(feature_map, q), _linear_phi(feature_map, k)  # (B, H, N, R), (B, H, M, R)
    kernel = torch.einsum("bhnr,bhmr->bhnm", fq, fk)  # (B, H, N, M)
    allowed = torch.ones(N, M, dtype=torch.bool, device=q.device)
    if causal:
        allowed = allowed.tril()
    if key_padding_mask is not None:
        allowed = allowed & ~key_padding_mask[:, None, None, :]
    kernel = kernel * allowed  # zero where not allowed
    den = kernel.sum(dim=-1, keepdim=True) + eps  # (B, H, N, 1); 0 only with eps = 0 and no weight at all
    weights = kernel / torch.where(den == 0, 1.0, den)  # (B, H, N, M): a row with no weight is zero
    out = torch.einsum("bhnm,bhmv->bhnv", weights, v)  # (B, H, N, Dv)
    return (out, weights) if return_weights else out


def linear_attention_loop(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    feature_map: str | FeatureMap = "elu",
    key_padding_mask: torch.Tensor | None = None,
    eps: float = 1e-6,
) -> torch.Tensor:
    """Causal linear attention as an RNN, one time step after the other (Katharopoulos et al., Eqs. 16-20).

        S_i = S_{i-1} + phi(k_i) v_i^T,  z_i = z_{i-1} + phi(k_i),  out_i = phi(q_i)^T S_i / (phi(q_i)^T z_i + eps)

    q, k (B,H,N,D), v (B,H,N,Dv) -> (B,H,N,Dv) float64; padded keys (``key_padding_mask`` (B, N)) are skipped.

    Example:
        >>> import torch
        >>> from attnbook import reference
        >>> q, k, v = (torch.randn(1, 2, 6, 4) for _ in range(3))
        >>> loop = reference.linear_attention_loop(q, k, v)  # the RNN, one token after the other
        >>> torch.allclose(loop, reference.linear_attention(q, k, v, is_causal=True))  # the masked matrix
        True
    """
    check_qkv(q, k, v, name="reference.linear_attention_loop", same_length=True)
    eps = _positive(eps, "eps", name="reference.linear_attention_loop", zero=True)
    q, k, v = _f64(q, k, v)
    B, H, N, _ = q.shape
    fq, fk = _linear_phi(feature_map, q), _linear_phi(feature_map, k)  # (B, H, N, R)
    S = q.new_zeros(B, H, fk.shape[-1], v.shape[-1])  # (B, H, R, Dv)
    z = q.new_zeros(B, H, fk.shape[-1])  # (B, H, R)
    real = torch.ones(B, N, dtype=torch.bool, device=q.device) if key_padding_mask is None else ~key_padding_mask
    outs = []
    for i in range(N):
        if_real = real[:, i].to(q.dtype)[:, None, None]  # (B, 1, 1): 0 for a padded key
        S = S + if_real[..., None] * torch.einsum("bhr,bhv->bhrv", fk[:, :, i], v[:, :, i])
        z = z + if_real * fk[:, :, i]
        num = torch.einsum("bhr,bhrv->bhv", fq[:, :, i], S)  # (B, H, Dv)
        den = torch.einsum("bhr,bhr->bh", fq[:, :, i], z)  # (B, H)
        den = den[..., None] + eps  # (B, H, 1); 0 only with eps = 0 and no weight at all: then num is 0 too
        outs.append(num / torch.where(den == 0, 1.0, den))
    return torch.stack(outs, dim=2)  # (B, H, N, Dv)


def _softmax_literal(logits: torch.Tensor) -> torch.Tensor:
    """exp(l_i - max l) / sum_j exp(l_j - max l) over a 1-D vector of logits."""
    e = torch.exp(logits - logits.max())
    return e / e.sum()


def moh_attention(
    x: torch.Tensor,
    *,
    num_heads: int,
    shared_head: int,
    routed_head: int,
    qkv_weight: torch.Tensor,
    proj_weight: torch.Tensor,
    qkv_bias: torch.Tensor | None = None,
    proj_bias: torch.Tensor | None = None,
    wg: torch.Tensor | None = None,
    wg_0: torch.Tensor | None = None,
    wg_1: torch.Tensor | None = None,
    q_norm: _Norm | None = None,
    k_norm: _Norm | None = None,
    attn_mask: torch.Tensor | None = None,
    is_causal: bool = False,
    key_padding_mask: torch.Tensor | None = None,
    scale_norm: _Norm | None = None,
    causal: bool | None = None,
    mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Mixture-of-head attention (Jin et al., arXiv:2410.11842) written out head by head, token by token.

    ``out_t = sum_h g_{t,h} head_h(t) W_O^h + b_O``, ``W_O^h`` the columns of the output projection that read head
    h, and for token t: shared heads 1..h_s ``g = a_1 h_s softmax(W_s x_t)``; routed heads (E = H - h_s) ``p =
    softmax(W_r x_t)``, the k = ``routed_head`` largest kept with ``g_i = a_2 k p_i / max(sum_{j kept} p_j, eps)``,
    the others 0; ``(a_1, a_2) = 2 softmax(W_h x_t)`` when there are both kinds of heads, else 1. The
    load-balancing loss is ``E sum_i f_i P_i`` over the B*N tokens (f_i the fraction that keep head i, P_i the
    mean of p_i).

    Weights as ``nn.Linear.weight`` matrices: ``qkv_weight`` (3 H D, C) (head h at rows ``h*D:(h+1)*D`` of each
    third), ``proj_weight`` (C_out, H D), ``wg`` = W_r (E, C), ``wg_0`` = W_h (2, C), ``wg_1`` = W_s (h_s, C);
    ``q_norm``, ``k_norm`` callables on (..., D); ``scale_norm`` a callable on (..., H D) applied to the gated
    heads before the projection. The masks restrict each head as in :func:`softmax_attention`.

    Returns:
        ``(out, gates, loss)``: out (B, N, C_out), gates (B, N, H), loss () (0 without routed heads), float64.

    Example:
        >>> import torch, attnbook
        >>> from attnbook import reference
        >>> _ = torch.manual_seed(0)  # a fixed draw: the router's top-k choices are compared
        >>> layer = attnbook.MoHAttention(16, num_heads=4, shared_head=1, routed_head=2)
        >>> w = {name: p.detach() for name, p in layer.named_parameters()}
        >>> x = torch.randn(1, 5, 16)
        >>> out, gates, loss = reference.moh_attention(
        ...     x, num_heads=4, shared_head=1, routed_head=2, qkv_weight=w["qkv.weight"],
        ...     proj_weight=w["proj.weight"], proj_bias=w["proj.bias"], wg=w["wg.weight"], wg_0=w["wg_0.weight"],
        ... )
        >>> tuple(gates.shape), torch.allclose(out.float(), layer(x), atol=1e-5)
        ((1, 5, 4), True)
    """
    name = "reference.moh_attention"
    causal = check_is_causal(is_causal, causal, name=name)
    attn_mask = check_renamed_mask(attn_mask, mask, name=name)
    x, qkv_weight, proj_weight = _f64(x, qkv_weight, proj_weight)
    B, N, _ = x.shape
    H, s, k = num_heads, shared_head, routed_head
    D = qkv_weight.shape[0] // (3 * H)
    E = H - s if k > 0 else 0

    # Gates, one token at a time.
    gate_rows: list[torch.Tensor] = []
    kept_rows: list[list[float]] = []
    prob_rows: list[torch.Tensor] = []
    for b in range(B):
        for n in range(N):
            xt = x[b, n]  # (C,)
            shared = [torch.ones((), dtype=x.dtype, device=x.device)] * s
            if s > 1:
                shared = list(_softmax_literal(cast(torch.Tensor, wg_1).double() @ xt) * s)
            routed: list[torch.Tensor] = []
            if k > 0:
                p = _softmax_literal(cast(torch.Tensor, wg).double() @ xt)  # (E,)
                order = sorted(range(E), key=lambda i: -float(p[i].detach()))
                keep = set(order[:k])
                denom = torch.clamp(cast(torch.Tensor, sum(p[i] for i in keep)), min=torch.finfo(torch.float64).eps)
                routed = [k * p[i] / denom if i in keep else p[i] * 0 for i in range(E)]
                kept_rows.append([float(i in keep) for i in range(E)])
                prob_rows.append(p)
                if s > 0:
                    a = _softmax_literal(cast(torch.Tensor, wg_0).double() @ xt) * 2
                    shared = [a[0] * g for g in shared]
                    routed = [a[1] * g for g in routed]
            gate_rows.append(torch.stack(shared + routed))  # (H,)
    gates = torch.stack(gate_rows).reshape(B, N, H)

    # Heads, one at a time, then the output as a sum over heads of gated head outputs.
    out = x.new_zeros(B, N, proj_weight.shape[0])
    if proj_bias is not None:
        out = out + proj_bias.double()
    gated_heads = []
    for h in range(H):
        rows = [slice(part * H * D + h * D, part * H * D + (h + 1) * D) for part in range(3)]
        q, kk, v = (x @ qkv_weight[r].T for r in rows)  # 3 x (B, N, D)
        if qkv_bias is not None:
            q, kk, v = (t + qkv_bias.double()[r] for t, r in zip((q, kk, v), rows, strict=True))
        if q_norm is not None:
            q, kk = q_norm(q), cast(_Norm, k_norm)(kk)  # k_norm is given with q_norm
        head_mask = None
        if attn_mask is not None:
            head_mask = attn_mask.reshape((1,) * (4 - attn_mask.dim()) + tuple(attn_mask.shape))
            head_mask = head_mask.expand(B, H, N, N)[:, h : h + 1]  # (B, 1, N, N)
        head = softmax_attention(
            q[:, None],
            kk[:, None],
            v[:, None],
            is_causal=causal,
            attn_mask=head_mask,
            key_padding_mask=key_padding_mask,
        )[:, 0]
        gated_heads.append(gates[..., h, None] * head)  # (B, N, D)
        if scale_norm is None:
            out = out + gated_heads[-1] @ proj_weight[:, h * D : (h + 1) * D].T  # (B, N, C_out)
    if scale_norm is not None:
        out = out + scale_norm(torch.cat(gated_heads, dim=-1)) @ proj_weight.T  # (B, N, C_out)

    loss = x.new_zeros(())
    if k > 0:
        T = B * N
        for i in range(E):
            f_i = sum(row[i] for row in kept_rows) / T
            P_i = sum(p[i] for p in prob_rows) / T
            loss = loss + E * f_i * P_i
    return out, gates, loss


def _float64_copy(norm: torch.nn.Module) -> torch.nn.Module | None:
    """A float64 copy of a q/k norm module (the layer itself is left as it is), None for ``nn.Identity``."""
    if isinstance(norm, torch.nn.Identity):
        return None
    return copy.deepcopy(norm).double()


def moh_layer(
    layer: MoHAttention,
    x: torch.Tensor,
    *,
    attn_mask: torch.Tensor | None = None,
    is_causal: bool | None = None,
    key_padding_mask: torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
    causal: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`moh_attention` with the weights of an :class:`attnbook.MoHAttention` ``layer`` (read, not run):
    ``(out, gates, loss)`` in float64. ``is_causal`` defaults to the layer's ``causal``, and is ORed with it.

    Example:
        >>> import torch, attnbook
        >>> from attnbook import reference
        >>> _ = torch.manual_seed(0)  # a fixed draw: the router's top-k choices are compared
        >>> layer = attnbook.MoHAttention(16, num_heads=4, shared_head=2, routed_head=1, causal=True)
        >>> x = torch.randn(2, 5, 16)
        >>> out, gates, loss = reference.moh_layer(layer, x)
        >>> torch.allclose(out.float(), layer(x), atol=1e-5), torch.allclose(loss.float(), layer.route(x).loss)
        (True, True)
    """
    name = "reference.moh_layer"
    if causal is not None:
        is_causal = check_is_causal(False, causal, name=name)
    attn_mask = check_renamed_mask(attn_mask, mask, name=name)
    params = {name: p.detach().to(torch.float64) for name, p in layer.named_parameters()}
    return moh_attention(
        x,
        num_heads=layer.num_heads,
        shared_head=layer.shared_head,
        routed_head=layer.routed_head,
        qkv_weight=params["qkv.weight"],
        proj_weight=params["proj.weight"],
        qkv_bias=params.get("qkv.bias"),
        proj_bias=params.get("proj.bias"),
        wg=params.get("wg.weight"),
        wg_0=params.get("wg_0.weight"),
        wg_1=params.get("wg_1.weight"),
        q_norm=_float64_copy(layer.q_norm),
        k_norm=_float64_copy(layer.k_norm),
        attn_mask=attn_mask,
        is_causal=layer.causal if is_causal is None else bool(is_causal or layer.causal),
        key_padding_mask=key_padding_mask,
        scale_norm=_float64_copy(layer.norm),
    )


def _flow_dot(x: torch.Tensor, y: torch.Tensor, eps: float) -> torch.Tensor:
    """(x + eps) . (y + eps) over the last dimension, eps added to every component (Flowformer's placement)."""
    return ((x + eps) * (y + eps)).sum(-1)


class _FlowOptions(TypedDict, total=False):
    is_causal: bool
    eps: float
    competition: bool
    allocation: bool
    causal: bool | None


@overload
def flow_attention(
    q: Tensor, k: Tensor, v: Tensor, *, return_flows: Literal[False] = ..., **options: Unpack[_FlowOptions]
) -> Tensor: ...
@overload
def flow_attention(
    q: Tensor, k: Tensor, v: Tensor, *, return_flows: Literal[True], **options: Unpack[_FlowOptions]
) -> tuple[Tensor, FlowStats]: ...
@overload
def flow_attention(
    q: Tensor, k: Tensor, v: Tensor, *, return_flows: bool, **options: Unpack[_FlowOptions]
) -> Tensor | tuple[Tensor, FlowStats]: ...


def flow_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    is_causal: bool = False,
    eps: float = 1e-6,
    return_flows: bool = False,
    competition: bool = True,
    allocation: bool = True,
    causal: bool | None = None,
) -> torch.Tensor | tuple[torch.Tensor, FlowStats]:
    """Flow-Attention (Wu et al., ICML 2022) term by term, with the N x M flow matrix written out.

    The equations of :mod:`attnbook.flow`, out_i = sum_j a_i (q~_i.k~_j) / I_i c_j v_j; causal (N == M): a loop
    over positions, every sum over the prefix and divided by t_i = i + 1. q (B,H,N,D), k (B,H,M,D), v (B,H,M,Dv)
    -> (B,H,N,Dv) float64, and a FlowStats with ``return_flows``.

    Example:
        >>> import torch, attnbook
        >>> from attnbook import reference
        >>> q, k, v = (torch.randn(1, 2, 7, 4) for _ in range(3))
        >>> out, flows = reference.flow_attention(q, k, v, is_causal=True, return_flows=True)
        >>> torch.allclose(out.float(), attnbook.flow_attention(q, k, v, is_causal=True), atol=1e-5)
        True
        >>> torch.allclose(flows.competition[..., 0], torch.ones(1, 2).double())  # the first source: c = 1
        True
    """
    from .flow import FlowStats  # the result type only

    causal = check_is_causal(is_causal, causal, name="reference.flow_attention")
    check_qkv(q, k, v, name="reference.flow_attention", same_length=causal)
    eps = _positive(eps, "eps", name="reference.flow_attention", zero=True)
    q, k, v = _f64(q, k, v)
    qs, ks = torch.sigmoid(q), torch.sigmoid(k)
    N, M = qs.shape[-2], ks.shape[-2]
    if not causal:
        incoming = _flow_dot(qs, ks.sum(-2, keepdim=True), eps)  # (B, H, N)
        outgoing = _flow_dot(ks, qs.sum(-2, keepdim=True), eps)  # (B, H, M)
        conserved_incoming = _flow_dot(qs, (ks / outgoing[..., None]).sum(-2, keepdim=True), eps)
        raw = _flow_dot(ks, (qs / incoming[..., None]).sum(-2, keepdim=True), eps)
        conserved_outgoing = raw.clamp(-1.0, 1.0)
        alloc = torch.sigmoid(conserved_incoming * N / M)
        e = torch.exp(conserved_outgoing)
        comp = e / e.sum(-1, keepdim=True) * M
        comp = comp if competition else torch.ones_like(comp)
        alloc = alloc if allocation else torch.ones_like(alloc)
        flow = (alloc / incoming)[..., :, None] * (qs @ ks.transpose(-2, -1)) * comp[..., None, :]
    else:
        I, O = [], []
        for i in range(N):
            t = i + 1
            I.append(_flow_dot(qs[..., i, :], ks[..., :t, :].sum(-2), eps) / t)
            O.append(_flow_dot(ks[..., i, :], qs[..., :t, :].sum(-2), eps) / t)
        incoming, outgoing = torch.stack(I, -1), torch.stack(O, -1)  # (B, H, N)
        Ih, Oh, C = [], [], []
        for i in range(N):
            t = i + 1
            Ih.append(_flow_dot(qs[..., i, :], (ks[..., :t, :] / outgoing[..., :t, None]).sum(-2), eps) / t)
            Oh.append(_flow_dot(ks[..., i, :], (qs[..., :t, :] / incoming[..., :t, None]).sum(-2), eps) / t)
        conserved_incoming, raw = torch.stack(Ih, -1), torch.stack(Oh, -1)
        conserved_outgoing = raw.clamp(-1.0, 1.0)
        alloc = torch.sigmoid(conserved_incoming)
        e = torch.exp(conserved_outgoing)
        for j in range(N):
            C.append(e[..., j] / e[..., : j + 1].sum(-1) * (j + 1))
        comp = torch.stack(C, -1)
        comp = comp if competition else torch.ones_like(comp)
        alloc = alloc if allocation else torch.ones_like(alloc)
        ts = torch.arange(1, N + 1, dtype=torch.float64, device=q.device)  # t_i
        mask = torch.ones(N, N, dtype=torch.bool, device=q.device).tril()
        scores = (qs @ ks.transpose(-2, -1)).masked_fill(~mask, 0.0)  # (B, H, N, N)
        flow = (alloc / (incoming * ts))[..., :, None] * scores * comp[..., None, :]
    out = flow @ v  # (B, H, N, Dv)
    if not return_flows:
        return out
    stats = FlowStats(incoming, outgoing, conserved_incoming, conserved_outgoing, comp, alloc, raw)
    return out, stats


@overload
def mobile_attention(
    q: Tensor, k: Tensor, v: Tensor, *, eps: float = ..., return_flows: Literal[False] = ...
) -> Tensor: ...
@overload
def mobile_attention(
    q: Tensor, k: Tensor, v: Tensor, *, eps: float = ..., return_flows: Literal[True]
) -> tuple[Tensor, FlowStats]: ...
@overload
def mobile_attention(
    q: Tensor, k: Tensor, v: Tensor, *, eps: float = ..., return_flows: bool
) -> Tensor | tuple[Tensor, FlowStats]: ...


def mobile_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    eps: float = 1e-6,
    return_flows: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, FlowStats]:
    """Mobile-Attention (Yao et al., ICML 2024) term by term: flow sums over the heads at each position.

    The equations of :mod:`attnbook.mobile`, out_hi = sum_j a_hi (q~_hi.k~_hj) / I_hi c_hj v_hj. q, k (B,H,N,D),
    v (B,H,N,Dv) -> (B,H,N,Dv) float64, and a FlowStats with ``return_flows``.

    Example:
        >>> import torch, attnbook
        >>> from attnbook import reference
        >>> q, k, v = (torch.randn(1, 4, 6, 2) for _ in range(3))  # four heads compete at each position
        >>> out, flows = reference.mobile_attention(q, k, v, eps=0.0, return_flows=True)
        >>> torch.allclose(out.float(), attnbook.mobile_attention(q, k, v, eps=0.0), atol=1e-5)
        True
        >>> torch.allclose(flows.conserved_incoming.sum(1), torch.full((1, 6), 4.0).double())  # sum_h I^ = H
        True
    """
    from .flow import FlowStats  # the result type only

    check_qkv(q, k, v, name="reference.mobile_attention", same_length=True)
    eps = _positive(eps, "eps", name="reference.mobile_attention", zero=True)
    q, k, v = _f64(q, k, v)
    qs, ks = torch.sigmoid(q), torch.sigmoid(k)
    N, M = qs.shape[-2], ks.shape[-2]
    incoming = _flow_dot(qs, ks.sum(1, keepdim=True), eps)  # (B, H, N)
    outgoing = _flow_dot(ks, qs.sum(1, keepdim=True), eps)  # (B, H, N)
    conserved_incoming = _flow_dot(qs, (ks / outgoing[..., None]).sum(1, keepdim=True), eps)
    raw = _flow_dot(ks, (qs / incoming[..., None]).sum(1, keepdim=True), eps)
    conserved_outgoing = raw.clamp(-1.0, 1.0)
    allocation = torch.sigmoid(conserved_incoming * N / M)
    e = torch.exp(conserved_outgoing)
    competition = e / e.sum(-1, keepdim=True) * M
    flow = (allocation / incoming)[..., :, None] * (qs @ ks.transpose(-2, -1)) * competition[..., None, :]
    out = flow @ v  # (B, H, N, Dv)
    if not return_flows:
        return out
    stats = FlowStats(incoming, outgoing, conserved_incoming, conserved_outgoing, competition, allocation, raw)
    return out, stats


def gated_linear_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    *,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
) -> Any:
    """Gated linear attention one token after the other, in float64 (as fla's ``naive_recurrent_gla``):

        S_t = diag(exp(g_t)) S_{t-1} + k_t v_t^T,    o_t = S_t^T (scale q_t)

    q, k (B, H, N, D), v (B, H, N, Dv), g (B, H, N, D) or (B, H, N), S from zeros or ``initial_state`` -> o
    (B, H, N, Dv) [, the last S].

    Example:
        >>> import torch, attnbook
        >>> from attnbook import reference
        >>> q, k, v = (torch.randn(1, 2, 9, 4) for _ in range(3))
        >>> g = -torch.rand(1, 2, 9)  # one log-decay per head and token
        >>> torch.allclose(attnbook.gated_linear_attention(q, k, v, g).double(),
        ...                reference.gated_linear_attention(q, k, v, g), atol=1e-5)
        True
    """
    check_qkv(q, k, v, name="reference.gated_linear_attention", same_length=True)
    scale = _positive(scale, "scale", name="reference.gated_linear_attention")
    q, k, v, g = _f64(q, k, v, g)
    g = g if g.dim() == 4 else g.unsqueeze(-1)  # (B, H, N, D or 1)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    S = q.new_zeros(*q.shape[:2], q.shape[-1], v.shape[-1]) if initial_state is None else initial_state.double()
    outs = []
    for t in range(q.shape[2]):
        S = torch.exp(g[:, :, t]).unsqueeze(-1) * S + torch.einsum("bhd,bhv->bhdv", k[:, :, t], v[:, :, t])
        outs.append(torch.einsum("bhd,bhdv->bhv", scale * q[:, :, t], S))
    out = torch.stack(outs, dim=2)  # (B, H, N, Dv)
    return (out, S) if output_final_state else out


def delta_rule_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor,
    *,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
) -> Any:
    """The delta rule one token after the other, in float64 (as fla's ``delta_rule_recurrence``):

        u_t = beta_t (v_t - S_{t-1}^T k_t),    S_t = S_{t-1} + k_t u_t^T,    o_t = S_t^T (scale q_t)

    q, k (B, H, N, D), v (B, H, N, Dv), beta (B, H, N), S from zeros or ``initial_state`` -> o (B, H, N, Dv)
    [, the last S].

    Example:
        >>> import torch, torch.nn.functional as F, attnbook
        >>> from attnbook import reference
        >>> q, v = torch.randn(1, 2, 9, 4), torch.randn(1, 2, 9, 4)
        >>> k = F.normalize(torch.randn(1, 2, 9, 4), dim=-1)
        >>> beta = torch.rand(1, 2, 9)
        >>> torch.allclose(attnbook.delta_rule_attention(q, k, v, beta).double(),
        ...                reference.delta_rule_attention(q, k, v, beta), atol=1e-5)
        True
    """
    check_qkv(q, k, v, name="reference.delta_rule_attention", same_length=True)
    scale = _positive(scale, "scale", name="reference.delta_rule_attention")
    q, k, v, beta = _f64(q, k, v, beta)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    S = q.new_zeros(*q.shape[:2], q.shape[-1], v.shape[-1]) if initial_state is None else initial_state.double()
    outs = []
    for t in range(q.shape[2]):
        predicted = torch.einsum("bhd,bhdv->bhv", k[:, :, t], S)  # S^T k_t
        u = beta[:, :, t, None] * (v[:, :, t] - predicted)
        S = S + torch.einsum("bhd,bhv->bhdv", k[:, :, t], u)
        outs.append(torch.einsum("bhd,bhdv->bhv", scale * q[:, :, t], S))
    out = torch.stack(outs, dim=2)  # (B, H, N, Dv)
    return (out, S) if output_final_state else out


def recurrent_layer(layer: RecurrentAttention, x: torch.Tensor, *, key_padding_mask: Tensor | None = None) -> Tensor:
    """A :class:`attnbook.GatedLinearAttention` or :class:`attnbook.DeltaRuleAttention` layer evaluated literally in
    float64 on x (B, N, C) (a float64 copy, unless the layer is float64: then its parameters get the gradients). A
    padded token (``key_padding_mask`` (B, N) True) has a zero input (whatever it held), zero key and value, and
    g = 0 or beta = 0.

    Example:
        >>> import torch, attnbook
        >>> from attnbook import reference
        >>> layer = attnbook.GatedLinearAttention(16, num_heads=2)
        >>> x = torch.randn(2, 7, 16)
        >>> torch.allclose(layer(x).double(), reference.recurrent_layer(layer, x), atol=1e-5)
        True
    """
    if any(p.dtype != torch.float64 for p in layer.parameters()):
        layer = copy.deepcopy(layer).double()
    x = x.double()
    if key_padding_mask is not None:
        x = torch.where(key_padding_mask[..., None], 0.0, x)
    q, k = layer.qk(layer.heads(layer.query_projection(x)), layer.heads(layer.key_projection(x)))
    v, gate = layer.heads(layer.value_projection(x)), layer.gates(x).double()
    if key_padding_mask is not None:
        keep = (~key_padding_mask)[:, None, :].double()  # (B, 1, N)
        k, v = k * keep[..., None], v * keep[..., None]
        gate = gate * (keep if gate.dim() == 3 else keep[..., None])  # g = 0 or beta = 0 at padding
    loop = delta_rule_attention if type(layer).__name__ == "DeltaRuleAttention" else gated_linear_attention
    out: Tensor = loop(q, k, v, gate)  # (B, H, N, D)
    B, H, N, D = out.shape
    y: Tensor = layer.out_projection(out.transpose(1, 2).reshape(B, N, H * D))  # (B, N, C)
    return y
