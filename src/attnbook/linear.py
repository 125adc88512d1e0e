"""Kernelized linear attention: chapter 2.

Replace the softmax kernel exp(q . k / sqrt(D)) by phi(q) . phi(k) and use associativity:

    out_i = phi(q_i)^T S / (phi(q_i)^T z + eps),   S = sum_j phi(k_j) v_j^T,   z = sum_j phi(k_j)

The sums over keys are computed once, so the N x M matrix never exists: O(N R Dv) time instead of O(N M D).
Causal attention restricts both sums to j <= i; carried as a state (S, z) it is an RNN, so generation costs O(1)
per token (Katharopoulos et al., "Transformers are RNNs", ICML 2020, Eqs. 4-6 and 16-20). eps is added to the
denominator, as in fast-transformers.

The causal sums are one chunked form (:func:`chunked_causal_product`): inside a chunk of ell positions the masked
ell x ell product, between chunks the carried state (Yang et al., "Gated Linear Attention Transformers with
Hardware-Efficient Training", ICML 2024, Sec. 2.2). On the CPU with one thread, causal attention with a built-in
feature map and no state goes to the speed annex (:mod:`attnbook._fast`) unless :func:`attnbook.config.plain`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, TypedDict, overload

import torch
import torch.nn.functional as F
from torch import Tensor

from . import config
from ._checks import (
    check_bool,
    check_drawn_width,
    check_dtype,
    check_eps,
    check_feature_widths,
    check_features,
    check_int,
    check_is_causal,
    check_key_padding_mask,
    check_no_attn_mask,
    check_qkv,
    check_state,
    check_state_call,
    check_step_inputs,
    shape_str,
)
from ._module import ProjectedAttention
from ._runtime import (
    accumulation_dtype,
    autocast_disabled,
    chunk_count,
    chunk_length,
    product_dtype,
    result_dtype,
    tracing,
)
from .feature_maps import FEATURE_MAPS, FeatureMap, PerformerFeatures, resolve_feature_map

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["linear_attention", "LinearState", "linear_attention_step", "LinearAttention", "chunked_causal_product"]

_CAUSAL_PAIRS = " (causal attention pairs query i with key i)"
_NO_ATTN_MASK = (
    " (linear attention never forms the N x M weights, so an arbitrary mask cannot be applied to them: pass "
    "key_padding_mask for padding and is_causal=True for the causal mask)"
)


class LinearState(NamedTuple):
    """The recurrent state of causal linear attention after t tokens, in at least float32:
    S = sum_{j<=t} phi(k_j) v_j^T (B, H, R, Dv) and z = sum_{j<=t} phi(k_j) (B, H, R).

    Example:
        >>> import torch, attnbook
        >>> from attnbook.feature_maps import elu_feature_map
        >>> q, k, v = (torch.randn(1, 2, 6, 4) for _ in range(3))
        >>> _, state = attnbook.linear_attention(q, k, v, is_causal=True, output_final_state=True)
        >>> torch.allclose(state.S, elu_feature_map(k).transpose(-2, -1) @ v, atol=1e-5)  # S: phi(k)^T v
        True
    """

    S: torch.Tensor
    z: torch.Tensor


def chunked_causal_product(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, chunk_size: int, state: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """o_i = q_i^T (S_0 + sum_{j<=i} k_j v_j^T), every chunk at once; and the state after the last position.

    q, k (..., N, R), v (..., N, Dv), S_0 (..., R, Dv) (zero when None), in the accumulation dtype, cut into chunks
    of ell = ``chunk_size`` positions (the last padded with zeros): inside a chunk (q k^T) masked to j <= i, times v;
    before it, q_i^T S_c, S_c the running sum of the chunks' k^T v. The products' inputs are in
    :func:`attnbook._runtime.product_dtype`. Cost: O(N (ell + R) Dv) time, O(N (ell + R Dv / ell)) memory.
    Returns (o (..., N, Dv), S_0 + sum_j k_j v_j^T (..., R, Dv)), in the accumulation dtype.
    """
    acc, mm = q.dtype, product_dtype(q)
    N = q.shape[-2]
    ell = chunk_length(N, chunk_size)
    n = chunk_count(N, ell)  # chunks; the last one padded with zeros
    qc, kc, vc = (
        F.pad(x, (0, 0, 0, n * ell - N)).reshape(*x.shape[:-2], n, ell, x.shape[-1]).to(mm) for x in (q, k, v)
    )
    kv = (kc.transpose(-2, -1) @ vc).to(acc)  # (..., n, R, Dv): each chunk's own sum of k_j v_j^T
    states = F.pad(kv, (0, 0, 0, 0, 1, 0)).cumsum(-3)  # (..., n + 1, R, Dv): the state before chunk c, and at the end
    if state is not None:
        states = states + state.unsqueeze(-3)
    scores = (qc @ kc.transpose(-2, -1)).tril()  # (..., n, ell, ell): q_i . k_j inside a chunk, j <= i
    out = (scores @ vc).to(acc) + (qc @ states[..., :-1, :, :].to(mm)).to(acc)  # (..., n, ell, Dv)
    out = out.flatten(-3, -2)[..., :N, :]  # (..., N, Dv)
    # Traced, a copy: torch 2.13's inductor compiles the backward of a product that saved this slice with the
    # strides of the first length, and fails at the next one (with dynamic shapes; reduced in the changelog).
    return (out.contiguous() if tracing() else out), states[..., -1, :, :]


def _feature_map(feature_map: str | FeatureMap, D: int, *, name: str, got: str | Callable[[], str]) -> FeatureMap:
    """The resolved feature map; Performer features must be drawn for width D."""
    phi = resolve_feature_map(feature_map, name=name)
    if isinstance(phi, PerformerFeatures):
        check_drawn_width(phi.dim, D, name=name, got=got)
    return phi


def _features(
    phi: FeatureMap, q: torch.Tensor, k: torch.Tensor, keep: torch.Tensor | None = None, *, name: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """phi(q) (..., N, R) and phi(k) (..., M, R), checked, in q's dtype; 0 for a padded key (``keep`` False)."""
    fq = check_features(phi(q), q, name=name, label="q").to(q.dtype)
    fk = check_features(phi(k), k, name=name, label="k").to(q.dtype)
    check_feature_widths(fq, fk, name=name)
    return fq, fk if keep is None else torch.where(keep, fk, 0.0)


def _divide(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    """num / den, and 0 where den is 0 (eps = 0 and no weight at all: then num is 0 too); NaN stays NaN."""
    return num / torch.where(den == 0, 1.0, den)


def _divide_(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    """:func:`_divide` in place, for a ``num`` made for it: one tensor of the output's size fewer."""
    return num.div_(torch.where(den == 0, 1.0, den))


class _Options(TypedDict, total=False):
    """The keywords of :func:`linear_attention` that its overloads do not tell apart."""

    is_causal: bool
    attn_mask: torch.Tensor | None
    key_padding_mask: torch.Tensor | None
    feature_map: str | FeatureMap
    eps: float
    chunk_size: int
    out_dtype: torch.dtype | None
    initial_state: LinearState | None
    causal: bool | None


@overload
def linear_attention(
    q: Tensor, k: Tensor, v: Tensor, *, output_final_state: Literal[False] = ..., **options: Unpack[_Options]
) -> Tensor: ...
@overload
def linear_attention(
    q: Tensor, k: Tensor, v: Tensor, *, output_final_state: Literal[True], **options: Unpack[_Options]
) -> tuple[Tensor, LinearState]: ...
@overload
def linear_attention(
    q: Tensor, k: Tensor, v: Tensor, *, output_final_state: bool, **options: Unpack[_Options]
) -> Tensor | tuple[Tensor, LinearState]: ...


def linear_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    is_causal: bool = False,
    attn_mask: torch.Tensor | None = None,
    key_padding_mask: torch.Tensor | None = None,
    feature_map: str | FeatureMap = "elu",
    eps: float = 1e-6,
    chunk_size: int = 64,
    out_dtype: torch.dtype | None = None,
    initial_state: LinearState | None = None,
    output_final_state: bool = False,
    causal: bool | None = None,
) -> torch.Tensor | tuple[torch.Tensor, LinearState]:
    """Kernelized linear attention (Katharopoulos et al., ICML 2020), non-causal or causal.

        out_i = phi(q_i)^T S / (phi(q_i)^T z + eps),   S = sum_j phi(k_j) v_j^T,   z = sum_j phi(k_j)

    with both sums over all keys j, or over j <= i when ``is_causal``, then from a state (S_0, z_0) of earlier tokens.

    Cost: non-causal O(B H (N + M) R Dv) time and O(B H (N + M) R) memory; causal: O(B H N (ell + R) Dv) time.

    Args:
        q, k, v: queries (B, H, N, D), keys (B, H, M, D), values (B, H, M, Dv).
        is_causal: query i sees keys j <= i only; needs N == M.
        attn_mask: must be None: no N x M weights are formed for an arbitrary mask to act on.
        key_padding_mask: (B, M) bool, True = padding: those keys contribute nothing, whatever they hold.
        feature_map: "elu" (elu(x) + 1), "relu", a callable (..., D) -> (..., R) on each vector, or a
            :class:`attnbook.feature_maps.PerformerFeatures`.
        eps: added to the denominator; with eps = 0 a query with no weight at all gets zeros.
        chunk_size: ell of the causal chunked form (the result does not depend on it beyond rounding).
        out_dtype: dtype of the result; default the inputs' (under autocast: the autocast dtype).
        initial_state, output_final_state: causal only: the :class:`LinearState` before these tokens, or None; and
            whether to return the one after the last.
        causal: the deprecated name of ``is_causal``.

    Returns:
        (B, H, N, Dv), or ``(out, final_state)``; a NaN or inf in a visible input makes the outputs on it NaN (and,
        causal, the earlier outputs of its chunk: there a weight of 0 multiplies it, and 0 * NaN is NaN).

    Example:
        >>> import torch, attnbook
        >>> q, k, v = (torch.randn(1, 2, 12, 8) for _ in range(3))  # (B, H, N, D)
        >>> out = attnbook.linear_attention(q, k, v, is_causal=True)
        >>> head, state = attnbook.linear_attention(q[:, :, :8], k[:, :, :8], v[:, :, :8], is_causal=True,
        ...                                         output_final_state=True)  # a prompt of 8 tokens
        >>> tail = attnbook.linear_attention(q[:, :, 8:], k[:, :, 8:], v[:, :, 8:], is_causal=True,
        ...                                  initial_state=state)  # the next 4, from its state
        >>> torch.allclose(torch.cat([head, tail], dim=2), out, atol=1e-5)
        True
    """
    name = "linear_attention"
    causal = check_is_causal(is_causal, causal, name=name)
    B, H, N, M, D, Dv = check_qkv(q, k, v, name=name, same_length=causal, why=_CAUSAL_PAIRS)
    check_no_attn_mask(attn_mask, name=name, why=_NO_ATTN_MASK)
    eps = check_eps(eps, name=name)
    chunk_size = check_int(chunk_size, "chunk_size", name=name, minimum=1)
    output_final_state = check_bool(output_final_state, "output_final_state", name=name)
    phi = _feature_map(feature_map, D, name=name, got=lambda: f"q {shape_str(q)}, k {shape_str(k)}")
    check_state_call(causal, initial_state, output_final_state, name=name)
    keep = None  # (B, 1, M, 1): True = a real key
    if key_padding_mask is not None:
        keep = ~check_key_padding_mask(key_padding_mask, B, M, name=name).to(q.device)[:, None, :, None]
    dtype = result_dtype(q) if out_dtype is None else check_dtype(out_dtype, "out_dtype", name=name)
    acc = accumulation_dtype(q.dtype)
    with autocast_disabled(q.device):
        q, k, v = q.to(acc), k.to(acc), v.to(acc)
        if keep is not None:  # zero padded keys before phi (no huge key becomes inf * 0 = NaN) and their values
            k, v = torch.where(keep, k, 0.0), torch.where(keep, v, 0.0)
        if _annex_takes((q, k, v), phi, causal, initial_state, output_final_state):
            return _annex(q, k, v, phi, keep, chunk_size, eps).to(dtype)  # attnbook._fast: speed only
        fq, fk = _features(phi, q, k, keep, name=name)  # (B, H, N, R), (B, H, M, R)
        if causal:
            if initial_state is not None:
                fields = {"S": (B, H, fk.shape[-1], Dv), "z": (B, H, fk.shape[-1])}
                check_state(
                    initial_state, LinearState, fields, name=name, dtype=acc, device=q.device, arg="initial_state"
                )
            out, state = _causal(fq, fk, v, chunk_size, eps, initial_state)
            return (out.to(dtype), state) if output_final_state else out.to(dtype)
        S = fk.transpose(-2, -1) @ v  # (B, H, R, Dv): sum_j phi(k_j) v_j^T
        z = fk.sum(-2)  # (B, H, R): sum_j phi(k_j)
        num = fq @ S  # (B, H, N, Dv)
        den = fq @ z.unsqueeze(-1)  # (B, H, N, 1)
        return _divide_(num, den + eps).to(dtype)  # (B, H, N, Dv)


#: The built-in feature maps by function, for the annex, which makes them itself.
FEATURE_NAMES: dict[FeatureMap, str] = {phi: name for name, phi in FEATURE_MAPS.items()}


def _annex_takes(
    qkv: tuple[torch.Tensor, ...], phi: FeatureMap, causal: bool, state: object, output_state: bool
) -> bool:
    """Whether the speed annex runs this call: it is on (:func:`attnbook.config.plain`), the call is causal without
    a state, with a built-in feature map, needs no gradient, is not traced, on the CPU with one thread (its tiles are
    laid out for one core's caches; with more threads the plain form was as fast, and the tiles' own backward was
    less than 1.3 times faster than autograd's: ``benchmarks/bench_annex.py``)."""
    if config.plain() or not causal or state is not None or output_state or phi not in FEATURE_NAMES:
        return False
    grad = torch.is_grad_enabled() and any(x.requires_grad for x in qkv)
    return qkv[0].device.type == "cpu" and not grad and not tracing() and torch.get_num_threads() == 1


def _annex(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    phi: FeatureMap,
    keep: torch.Tensor | None,
    chunk_size: int,
    eps: float,
) -> torch.Tensor:
    """The annex's causal linear attention without autograd (``attnbook._fast.causal``), imported only when it runs."""
    from ._fast.causal import causal_linear_attention

    return causal_linear_attention(q, k, v, FEATURE_NAMES[phi], keep, chunk_size, eps)


def _causal(
    fq: torch.Tensor,
    fk: torch.Tensor,
    v: torch.Tensor,
    chunk_size: int,
    eps: float,
    state: LinearState | None,
) -> tuple[torch.Tensor, LinearState]:
    """Causal linear attention on features fq, fk (B, H, N, R) and values v (B, H, N, Dv) from ``state``. The
    values get a column of ones, so one chunked product gives numerator and normaliser; (S, z) travels as [S | z]."""
    ones = torch.ones_like(v[..., :1])
    carried = None if state is None else torch.cat([state.S, state.z.unsqueeze(-1)], dim=-1)  # (B, H, R, Dv + 1)
    nd, final = chunked_causal_product(fq, fk, torch.cat([v, ones], dim=-1), chunk_size, carried)
    out = _divide(nd[..., :-1], nd[..., -1:] + eps)  # (B, H, N, Dv)
    return out, LinearState(final[..., :-1].contiguous(), final[..., -1].contiguous())  # states of one layout


def linear_attention_step(
    q_t: torch.Tensor,
    k_t: torch.Tensor,
    v_t: torch.Tensor,
    state: LinearState | None = None,
    *,
    feature_map: str | FeatureMap = "elu",
    eps: float = 1e-6,
) -> tuple[torch.Tensor, LinearState]:
    """One token of causal linear attention as an RNN (Katharopoulos et al., ICML 2020, Eqs. 16-20).

        S_t = S_{t-1} + phi(k_t) v_t^T,   z_t = z_{t-1} + phi(k_t),   out_t = phi(q_t)^T S_t / (phi(q_t)^T z_t + eps)

    q_t, k_t (B, H, D), v_t (B, H, Dv) and the :class:`LinearState` before them (None: zeros) -> ``(out_t (B, H, Dv),
    new state)``, in O(B H R Dv) whatever the position; the options as in :func:`linear_attention`.

    Example:
        >>> import torch, attnbook
        >>> q, k, v = (torch.randn(1, 2, 5, 4) for _ in range(3))
        >>> state = None
        >>> for t in range(5):  # an RNN over the tokens
        ...     out_t, state = attnbook.linear_attention_step(q[:, :, t], k[:, :, t], v[:, :, t], state)
        >>> torch.allclose(out_t, attnbook.linear_attention(q, k, v, is_causal=True)[:, :, -1], atol=1e-5)
        True
    """
    name = "linear_attention_step"
    B, H, D, Dv = check_step_inputs(q_t, k_t, v_t, name=name)
    eps = check_eps(eps, name=name)
    phi = _feature_map(feature_map, D, name=name, got=lambda: f"q_t {shape_str(q_t)}, k_t {shape_str(k_t)}")
    dtype, acc = result_dtype(q_t), accumulation_dtype(q_t.dtype)
    with autocast_disabled(q_t.device):
        fq, fk = _features(phi, q_t.to(acc), k_t.to(acc), name=name)  # (B, H, R)
        R = fk.shape[-1]
        if state is None:
            state = LinearState(fk.new_zeros(B, H, R, Dv), fk.new_zeros(B, H, R))
        else:
            check_state(
                state, LinearState, {"S": (B, H, R, Dv), "z": (B, H, R)}, name=name, dtype=acc, device=fq.device
            )
        S = state.S + fk.unsqueeze(-1) * v_t.to(acc).unsqueeze(-2)  # (B, H, R, Dv)
        z = state.z + fk  # (B, H, R)
        num = (fq.unsqueeze(-2) @ S).squeeze(-2)  # (B, H, Dv)
        den = (fq * z).sum(dim=-1, keepdim=True)  # (B, H, 1)
        return _divide(num, den + eps).to(dtype), LinearState(S, z)


class LinearAttention(ProjectedAttention[LinearState]):
    """Multi-head kernelized linear attention with the module family's projections.

    ``feature_map``, ``eps``, ``chunk_size`` as in :func:`linear_attention` (a
    :class:`~attnbook.feature_maps.PerformerFeatures` becomes a submodule, drawn for D = d_model // n_heads);
    ``causal``: every forward is causal. Calls as :class:`attnbook.ProjectedAttention`, ``attn_mask`` None; the state
    is a :class:`LinearState`.

    Example:
        >>> import torch, attnbook
        >>> layer = attnbook.LinearAttention(32, 32, 32, n_heads=4, causal=True)
        >>> x = torch.randn(2, 10, 32)
        >>> y, state = layer(x[:, :9], output_final_state=True)  # prefill 9 tokens in one call
        >>> y_t, state = layer.step(x[:, 9], state)  # then one token at a time
        >>> torch.allclose(y_t, layer(x)[:, 9], atol=1e-5)
        True
    """

    def __init__(
        self,
        d_input: int,
        d_model: int | None = None,
        d_output: int | None = None,
        n_heads: int | None = None,
        drop_out: float = 0.0,
        feature_map: str | FeatureMap = "elu",
        causal: bool = False,
        eps: float = 1e-6,
        chunk_size: int = 64,
        **kwargs: Any,
    ):
        super().__init__(d_input, d_model, d_output, n_heads, drop_out, **kwargs)
        name = type(self).__name__
        self.causal = check_bool(causal, "causal", name=name)
        self.eps = check_eps(eps, name=name)
        self.chunk_size = check_int(chunk_size, "chunk_size", name=name, minimum=1)
        head_dim = self.d_model // self.n_heads
        got = f"heads of width D = d_model // n_heads = {head_dim}"
        self.feature_map = _feature_map(feature_map, head_dim, name=name, got=got)  # a Performer is a submodule
        self.same_length, self.same_length_reason = self.causal, _CAUSAL_PAIRS

    def extra_repr(self) -> str:
        return f"n_heads={self.n_heads}, causal={self.causal}, eps={self.eps}"

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
        initial_state: LinearState | None = None,
        output_final_state: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, LinearState]:
        return linear_attention(
            q,
            k,
            v,
            is_causal=self.causal if is_causal is None else is_causal,
            attn_mask=attn_mask,
            feature_map=self.feature_map,
            key_padding_mask=key_padding_mask,
            eps=self.eps,
            chunk_size=self.chunk_size,
            out_dtype=accumulation_dtype(q.dtype),  # the out-projection rounds (attnbook.ProjectedAttention)
            initial_state=initial_state,
            output_final_state=output_final_state,
        )

    def attend_step(
        self, q_t: torch.Tensor, k_t: torch.Tensor, v_t: torch.Tensor, state: LinearState | None
    ) -> tuple[torch.Tensor, LinearState]:
        return linear_attention_step(q_t, k_t, v_t, state, feature_map=self.feature_map, eps=self.eps)
