"""Kernelized linear attention: chapter 2.

Replace the softmax kernel exp(q . k / sqrt(D)) by phi(q) . phi(k) and use associativity:

    out_i = phi(q_i)^T (sum_j phi(k_j) v_j^T) / (phi(q_i)^T (sum_j phi(k_j)) + eps)

The sums over keys are computed once, so the N x M matrix never exists: O(N R Dv) time instead of O(N M D).
Causal attention restricts both sums to j <= i; carried as a state (S, z) it is an RNN, which is what makes
generation cost O(1) per token (Katharopoulos et al., "Transformers are RNNs: Fast Autoregressive
Transformers with Linear Attention", ICML 2020, Eqs. 4-6 and 16-20). The non-causal numbers are those of
fast-transformers' ``LinearAttention``, eps added to the denominator.

The literal definitions (the normalised N x M matrix, the loop over time) are
:func:`attnbook.reference.linear_attention` and :func:`attnbook.reference.linear_attention_loop`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, NamedTuple, overload

import torch

from . import _causal, _prefix, feature_maps
from ._checks import (
    check_bool,
    check_chunk_size,
    check_drawn_width,
    check_dtype,
    check_eps,
    check_feature_widths,
    check_features,
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
from ._runtime import accumulation_dtype, autocast_disabled, needs_autograd, result_dtype, rows_per_group, tracing
from .feature_maps import (
    FEATURE_MAPS,
    FeatureMap,
    PerformerFeatures,
    features_into,
    resolve_feature_map,
)

__all__ = ["linear_attention", "LinearState", "linear_attention_step", "LinearAttention"]

_CAUSAL_PAIRS = " (causal attention pairs query i with key i)"
_NO_ATTN_MASK = (
    " (linear attention never forms the N x M weights, so an arbitrary mask cannot be applied to them: pass "
    "key_padding_mask for padding and is_causal=True for the causal mask)"
)


def _feature_map(feature_map: str | FeatureMap, D: int, *, name: str, got: str | Callable[[], str]) -> FeatureMap:
    """The resolved feature map; Performer features must be drawn for width D."""
    phi = resolve_feature_map(feature_map, name=name)
    if isinstance(phi, PerformerFeatures):
        check_drawn_width(phi.dim, D, name=name, got=got)
    return phi


@overload
def linear_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    is_causal: bool = ...,
    attn_mask: torch.Tensor | None = ...,
    key_padding_mask: torch.Tensor | None = ...,
    feature_map: str | FeatureMap = ...,
    eps: float = ...,
    chunk_size: int = ...,
    out_dtype: torch.dtype | None = ...,
    initial_state: LinearState | None = ...,
    output_final_state: Literal[False] = ...,
    causal: bool | None = ...,
) -> torch.Tensor: ...


@overload
def linear_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    is_causal: bool = ...,
    attn_mask: torch.Tensor | None = ...,
    key_padding_mask: torch.Tensor | None = ...,
    feature_map: str | FeatureMap = ...,
    eps: float = ...,
    chunk_size: int = ...,
    out_dtype: torch.dtype | None = ...,
    initial_state: LinearState | None = ...,
    output_final_state: Literal[True],
    causal: bool | None = ...,
) -> tuple[torch.Tensor, LinearState]: ...


@overload
def linear_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    is_causal: bool = ...,
    attn_mask: torch.Tensor | None = ...,
    key_padding_mask: torch.Tensor | None = ...,
    feature_map: str | FeatureMap = ...,
    eps: float = ...,
    chunk_size: int = ...,
    out_dtype: torch.dtype | None = ...,
    initial_state: LinearState | None = ...,
    output_final_state: bool,
    causal: bool | None = ...,
) -> torch.Tensor | tuple[torch.Tensor, LinearState]: ...


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
    chunk_size: int = 32,
    out_dtype: torch.dtype | None = None,
    initial_state: LinearState | None = None,
    output_final_state: bool = False,
    causal: bool | None = None,
) -> torch.Tensor | tuple[torch.Tensor, LinearState]:
    """Kernelized linear attention (Katharopoulos et al., ICML 2020), non-causal or causal.

        out_i = phi(q_i)^T S / (phi(q_i)^T z + eps),   S = sum_j phi(k_j) v_j^T,   z = sum_j phi(k_j)

    with both sums over all keys j, or over j <= i when ``is_causal``. ``phi`` is applied inside, to q and k.
    Causal attention may start from a state (S_0, z_0) of earlier tokens, added to both sums, and return the
    state after the last token, as flash-linear-attention's functions do.

    Cost: non-causal O(B H (N + M) R Dv) time and O(B H (N + M) R + B H R Dv) memory beside the inputs and
    the output. Causal, chunked (``chunk_size`` C: exact products inside a chunk, a carried (R, Dv) state
    between chunks): O(B H N (C + R) Dv) time; nothing of size N x N or N x R x Dv. The result does not
    depend on C (up to rounding). Without autograd (inference) the work runs in groups of (B H) rows written
    into one output, so the features exist for one group at a time; causal attention with a built-in
    feature map runs tile by tile (``attnbook._causal``), its features made inside each tile, and needs
    its output and one tile's buffers only. With a state, and under ``torch.compile`` / ``torch.export``, every
    chunk is processed at once in plain operations (:func:`attnbook._prefix.chunked_product`: the same numbers,
    O(B H N R Dv / C) memory for the chunk states). Differentiable any number of times.

    Args:
        q: queries (B, H, N, D).
        k: keys (B, H, M, D).
        v: values (B, H, M, Dv).
        is_causal: query i sees keys j <= i only; needs N == M.
        attn_mask: must be None: linear attention never forms the weights an arbitrary mask would act on (the
            argument exists so that a call written for SDPA gets this explanation).
        key_padding_mask: (B, M) bool, True = padding, as in ``nn.MultiheadAttention``. Padded keys and values
            contribute nothing, whatever their values (NaN and inf included), and get zero gradients.
        feature_map: "elu" (elu(x) + 1, default), "relu", a callable (..., D) -> (..., R) acting on each
            vector on its own (it may be called on groups of rows, (rows, N, D)), or an
            :class:`attnbook.feature_maps.PerformerFeatures` (FAVOR+ random features approximating softmax).
        eps: added to the denominator, as in fast-transformers.
        chunk_size: C of the causal algorithm (32: a quarter fewer operations than 64 at R = Dv = 64, in
            products that still run near a CPU's peak).
        out_dtype: dtype of the result; default the inputs' (under autocast: the autocast dtype). Pass the
            accumulation dtype (e.g. float32 for float16 inputs) to keep a result that float16 cannot hold.
        initial_state: causal only: the :class:`LinearState` of the tokens before these (S (B, H, R, Dv),
            z (B, H, R), in the accumulation dtype), or None for none.
        output_final_state: causal only: also return the :class:`LinearState` after the last token.
        causal: the deprecated name of ``is_causal`` (attnbook 0.1).

    Returns:
        (B, H, N, Dv) in ``out_dtype``, or ``(out, final_state)`` with ``output_final_state``. Feature maps,
        sums, normalisers and states are computed in at least float32 (with autocast off), so float16 /
        bfloat16 inputs do not overflow where float32 would not. A NaN or inf in a visible input makes the
        outputs that depend on it NaN; it is never hidden.

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
    chunk_size = check_chunk_size(chunk_size, name=name)
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
        if causal and (initial_state is not None or output_final_state or tracing()):
            out, state = _causal_with_state(q, k, v, keep, phi, eps, chunk_size, initial_state, name)
            return (out.to(dtype), state) if output_final_state else out.to(dtype)
        if causal:
            return _causal_attention(q, k, v, keep, phi, eps, chunk_size, name).to(dtype)  # (B, H, N, Dv)
        if needs_autograd(q, k, v, phi) or tracing():
            return _attend(q, k, v, keep, phi, eps, name, (B, H)).to(dtype)  # (B, H, N, Dv)
        # Without autograd: groups of rows of (B H), each written into one preallocated output and normalised
        # in place; for large batches the features of q and k then never exist for the whole batch at once.
        # Groups of about WORK_NUMBERS numbers of features: beside the output there are only the features of
        # one group.
        rows = B * H
        out = q.new_empty(rows, N, Dv)  # (B H, N, Dv)
        q, k, v = q.reshape(rows, N, D), k.reshape(rows, M, D), v.reshape(rows, M, Dv)
        if keep is not None:
            keep = keep.expand(B, H, M, 1).reshape(rows, M, 1)
        step = rows_per_group(q, max(N, M) * D, rows, numbers=True)
        # The built-in maps write the features of one piece of rows at a time into one buffer, allocated once
        # for all groups (small enough to be reused from the heap on later calls: fresh large tensors cost a
        # page fault per 4 KiB on first touch); see _in_pieces.
        work = None
        if phi in _KINDS:
            work = q.new_empty(min(step, _piece_rows(N, M, D)) * max(N, M) * D)
        for r0 in range(0, rows, step):
            r = slice(r0, r0 + step)
            mask = None if keep is None else keep[r]
            _attend(q[r], k[r], v[r], mask, phi, eps, name, (B, H), out[r], work)
        return out.view(B, H, N, Dv).to(dtype)


def _causal_with_state(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    keep: torch.Tensor | None,
    phi: FeatureMap,
    eps: float,
    chunk_size: int,
    initial_state: LinearState | None,
    name: str,
) -> tuple[torch.Tensor, LinearState]:
    """Causal linear attention from an initial state (or zeros) that also gives the final state, on q, k, v
    (B, H, N, .) in the accumulation dtype: every chunk at once (:func:`attnbook._prefix.chunked_product`).

    The values get a column of ones, so one product gives numerator and normaliser, and the state (S, z) is
    carried as one (R, Dv + 1) matrix [S | z]."""
    B, H, N, _ = q.shape
    if keep is not None:  # padded values must not reach a product (NaN * 0 = NaN), nor padded keys phi
        v = torch.where(keep, v, 0.0)
        k = torch.where(keep, k, 0.0)
    fq, fk = _feature_pair(q, k, keep, phi, name, (B, H))  # (B, H, N, R), padded keys' features zero
    R, Dv = fk.shape[-1], v.shape[-1]
    carried = None
    if initial_state is not None:
        fields = {"S": (B, H, R, Dv), "z": (B, H, R)}
        check_state(initial_state, LinearState, fields, name=name, dtype=q.dtype, device=q.device, arg="initial_state")
        carried = torch.cat([initial_state.S, initial_state.z.unsqueeze(-1)], dim=-1)  # (B, H, R, Dv + 1)
    ones = torch.ones_like(v[..., :1])
    C = chunk_size if tracing() else min(chunk_size, N)  # traced: no branch on N
    nd, final = _prefix.chunked_product(fq, fk, torch.cat([v, ones], dim=-1), C, carried)
    out = nd[..., :-1] * (nd[..., -1:] + eps).reciprocal()  # (B, H, N, Dv)
    return out, LinearState(final[..., :-1], final[..., -1])


def _causal_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    keep: torch.Tensor | None,
    phi: FeatureMap,
    eps: float,
    chunk_size: int,
    name: str,
) -> torch.Tensor:
    """Causal linear attention (:mod:`attnbook._causal`) on q, k, v (B, H, N, .) in the accumulation dtype.

    The built-in maps are made inside its tiles from q and k (padded keys' features zeroed there); other maps'
    features are made here first (without autograd: one group of rows at a time, about a third of the output,
    written into one output)."""
    B, H, N, D = q.shape
    Dv, rows = v.shape[-1], B * H
    kind = _KINDS.get(phi)
    if keep is not None:  # padded values must not reach a product: NaN or inf times a zero weight is NaN
        v = torch.where(keep, v, 0.0)  # (B, H, N, Dv)
        if kind is None:  # and a huge padded key must not become inf * 0 = NaN in its features (built-in
            k = torch.where(keep, k, 0.0)  # maps: their features are zeroed in the tiles)
    grad = needs_autograd(q, k, v, phi)
    drop = None
    if kind is not None and keep is not None:
        drop = keep.logical_not().expand(B, H, N, 1).reshape(rows, N, 1)  # padded keys
    q, k, v = (x.reshape(rows, N, x.shape[-1]) for x in (q, k, v))
    if keep is not None:
        keep = keep.expand(B, H, N, 1).reshape(rows, N, 1)
    if grad:
        if kind is None:
            q, k = _feature_pair(q, k, keep, phi, name, (B, H))
        return _causal.attention(q, k, v, kind, drop, chunk_size, eps).view(B, H, N, Dv)
    out = q.new_empty(rows, N, Dv)  # (B H, N, Dv)
    if kind is not None:
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()  # views of a wider tensor are not
        return _causal.forward(q, k, v, kind, drop, chunk_size, eps, out).view(B, H, N, Dv)
    step = rows_per_group(q, N * D, rows, numbers=True)
    if q.device.type == "cpu":  # features up to a third of the output
        step = max(1, min(rows, rows * N * Dv // 3 // (2 * N * D)))
    for r0 in range(0, rows, step):
        r = slice(r0, r0 + step)
        fq, fk = _feature_pair(q[r], k[r], None if keep is None else keep[r], phi, name, (B, H))
        _causal.forward(fq.contiguous(), fk.contiguous(), v[r].contiguous(), None, None, chunk_size, eps, out[r])
    return out.view(B, H, N, Dv)


def _feature_pair(
    q: torch.Tensor, k: torch.Tensor, keep: torch.Tensor | None, phi: FeatureMap, name: str, lead: tuple[int, ...]
) -> tuple[torch.Tensor, torch.Tensor]:
    """phi(q) and phi(k), checked, padded keys' features zero; k's padded keys are zero already (zeroed
    *before* phi: a huge padded key must not become inf * 0 = NaN)."""
    fq = _features(phi, q, name=name, label="q", lead=lead)  # (..., N, R)
    fk = _keys(phi, k, keep, name, lead)  # (..., N, R)
    check_feature_widths(fq, fk, name=name, lead=lead)
    return fq, fk


# The built-in maps, made inside the kernels (into buffers, or tile by tile in the causal one), by name.
_KINDS: dict[FeatureMap, str] = {phi: name for name, phi in FEATURE_MAPS.items()}


def _features(
    phi: FeatureMap, x: torch.Tensor, *, name: str, label: str, lead: tuple[int, ...], into: torch.Tensor | None = None
) -> torch.Tensor:
    """phi(x) checked, in x's dtype. Without autograd the built-in maps write into ``into`` (a flat buffer
    of at least x's size, x's dtype); other maps ignore it."""
    if into is not None and phi in _KINDS:
        return features_into(_KINDS[phi], x, into[: x.numel()].view(x.shape))  # (..., N, D), contiguous
    return check_features(phi(x), x, name=name, label=label, lead=lead).to(x.dtype)


def _attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    keep: torch.Tensor | None,
    phi: FeatureMap,
    eps: float,
    name: str,
    lead: tuple[int, ...],
    out: torch.Tensor | None = None,
    work: torch.Tensor | None = None,
) -> torch.Tensor:
    """Non-causal linear attention on q (..., N, D), k (..., M, D), v (..., M, Dv) in the accumulation dtype.

    ``keep`` (..., M, 1) bool marks real keys. With ``out`` (contiguous (..., N, Dv)) and no autograd, the
    result is written there and the normalisation happens in place; ``work``, a flat buffer for the features
    of the built-in maps (:func:`_in_pieces`). ``lead`` = (B, H), for messages.
    """
    if keep is not None:
        # Zero padded keys and values *before* phi: a huge padded key must not become inf * 0 = NaN.
        k = torch.where(keep, k, 0.0)  # (..., M, D)
        v = torch.where(keep, v, 0.0)  # (..., M, Dv)
    if work is not None:  # built-in map: phi(k), summed up, then phi(q)
        assert out is not None  # the no-autograd path passes its output with the buffer
        return _in_pieces(q, k, v, keep, phi, eps, name, lead, out, work)
    fq, fk = _feature_pair(q, k, keep, phi, name, lead)  # (..., N, R), (..., M, R)
    kv, z = fk.transpose(-2, -1) @ v, fk.sum(dim=-2).unsqueeze(-1)  # (..., R, Dv), (..., R, 1)
    den = _dots(fq, z)  # (..., N, 1): phi(q_i) . sum_j phi(k_j)
    if out is None:  # times the reciprocal, as in fast-transformers (its backward needs fewer temporaries)
        return (fq @ kv) * (den + eps).reciprocal()  # (..., N, Dv)
    return torch.matmul(fq, kv, out=out).mul_(den.add_(eps).reciprocal_())  # (..., N, Dv), in place


def _in_pieces(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    keep: torch.Tensor | None,
    phi: FeatureMap,
    eps: float,
    name: str,
    lead: tuple[int, ...],
    out: torch.Tensor,
    buf: torch.Tensor,
) -> torch.Tensor:
    """Non-causal linear attention without autograd, for a built-in feature map, into ``out`` (rows, N, Dv):

        z = sum_j phi(k_j),   S = sum_j phi(k_j) v_j^T,   out_i = (phi(q_i) / (phi(q_i) . z + eps))^T S

    The features are made one piece of whole rows at a time (:func:`_piece_rows`, about
    :data:`attnbook.feature_maps.ELU_PIECE` numbers) into ``buf`` (flat, at least one piece), and each piece,
    still in the cache, goes on at once: the keys' into z and S, the queries' divided by their normaliser and
    multiplied by S into ``out``. No pass over the features of all rows follows (B=4, H=8, N=4096, D=64,
    2 threads: 6 % quicker than the products over whole groups of rows).
    """
    rows, M, D = k.shape
    N = q.shape[1]
    step = _piece_rows(N, M, D)
    z = k.new_empty(rows, 1, D)  # (rows, 1, R): sum_j phi(k_j), as a row
    kv = v.new_empty(rows, D, v.shape[-1])  # (rows, R, Dv)
    for r0 in range(0, rows, step):
        r = slice(r0, r0 + step)
        fk = _keys(phi, k[r], None if keep is None else keep[r], name, lead, into=buf)  # (p, M, R)
        torch.sum(fk, dim=-2, keepdim=True, out=z[r])
        torch.bmm(fk.transpose(-2, -1), v[r], out=kv[r])
    for r0 in range(0, rows, step):
        r = slice(r0, r0 + step)
        fq = _features(phi, q[r], name=name, label="q", lead=lead, into=buf)  # (p, N, R)
        fq.mul_(_dots(fq, z[r].transpose(-2, -1)).add_(eps).reciprocal_())  # divided by phi(q_i) . z + eps
        torch.bmm(fq, kv[r], out=out[r])
    return out


def _piece_rows(N: int, M: int, D: int) -> int:
    """Rows of (B H) per piece of :func:`_in_pieces`: about ELU_PIECE numbers of features, at least one row."""
    return max(1, feature_maps.ELU_PIECE // (max(N, M) * D))


def _dots(fq: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """fq @ z, (..., N, R) @ (..., R, 1) -> (..., N, 1), computed as (z^T fq^T)^T: the same dot products, but
    a product with one row runs about twice as fast on the CPU as one with one column (one pass over fq)."""
    return (z.transpose(-2, -1) @ fq.transpose(-2, -1)).transpose(-2, -1)


def _keys(
    phi: FeatureMap,
    k: torch.Tensor,
    keep: torch.Tensor | None,
    name: str,
    lead: tuple[int, ...],
    into: torch.Tensor | None = None,
) -> torch.Tensor:
    """phi(k) (..., M, R), zero at padded keys (``keep`` (..., M, 1) False): phi(0) need not be 0. Features
    written into the buffer ``into`` (built-in maps, no autograd) are zeroed there, in place."""
    fk = _features(phi, k, name=name, label="k", lead=lead, into=into)
    if keep is None:
        return fk
    if into is not None and phi in _KINDS:
        return fk.masked_fill_(keep.logical_not(), 0.0)
    return torch.where(keep, fk, 0.0)


class LinearState(NamedTuple):
    """The recurrent state of causal linear attention after t tokens.

    S = sum_{j<=t} phi(k_j) v_j^T (B, H, R, Dv) and z = sum_{j<=t} phi(k_j) (B, H, R), in at least float32.

    Example:
        >>> import torch, attnbook
        >>> from attnbook.feature_maps import elu_feature_map
        >>> q, k, v = (torch.randn(1, 2, 6, 4) for _ in range(3))
        >>> _, state = attnbook.linear_attention(q, k, v, is_causal=True, output_final_state=True)
        >>> torch.allclose(state.z, elu_feature_map(k).sum(2), atol=1e-5)  # z: the keys' features, summed
        True
        >>> torch.allclose(state.S, elu_feature_map(k).transpose(-2, -1) @ v, atol=1e-5)  # S: phi(k)^T v
        True
    """

    S: torch.Tensor
    z: torch.Tensor


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

    Stepping through a sequence from ``state=None`` (zeros) reproduces ``linear_attention(causal=True)``.

    Cost per token: O(B H R Dv) time and memory, independent of the position t.

    Args:
        q_t: query (B, H, D).
        k_t: key (B, H, D).
        v_t: value (B, H, Dv).
        state: the :class:`LinearState` returned by the previous step (S (B, H, R, Dv) and z (B, H, R) in the
            accumulation dtype, on the inputs' device), or None to start from zeros.
        feature_map, eps: as in :func:`linear_attention`.

    Returns:
        (out_t (B, H, Dv) in the input dtype (under autocast: the autocast dtype), the new
        :class:`LinearState` in the accumulation dtype).

    Example:
        >>> import torch, attnbook
        >>> q, k, v = (torch.randn(1, 2, 5, 4) for _ in range(3))
        >>> state = None
        >>> for t in range(5):  # an RNN over the tokens
        ...     out_t, state = attnbook.linear_attention_step(q[:, :, t], k[:, :, t], v[:, :, t], state)
        >>> torch.allclose(out_t, attnbook.linear_attention(q, k, v, is_causal=True)[:, :, -1], atol=1e-5)
        True
        >>> tuple(state.S.shape), tuple(state.z.shape)  # the same size after any number of tokens
        ((1, 2, 4, 4), (1, 2, 4))
    """
    name = "linear_attention_step"
    B, H, D, Dv = check_step_inputs(q_t, k_t, v_t, name=name)
    eps = check_eps(eps, name=name)
    phi = _feature_map(feature_map, D, name=name, got=lambda: f"q_t {shape_str(q_t)}, k_t {shape_str(k_t)}")
    dtype, acc = result_dtype(q_t), accumulation_dtype(q_t.dtype)
    with autocast_disabled(q_t.device):
        q_t, k_t, v_t = q_t.to(acc), k_t.to(acc), v_t.to(acc)
        fq = check_features(phi(q_t), q_t, name=name, label="q_t").to(acc)  # (B, H, R)
        fk = check_features(phi(k_t), k_t, name=name, label="k_t").to(acc)  # (B, H, R)
        check_feature_widths(fq, fk, name=name, labels=("q_t", "k_t"))
        R = fk.shape[-1]
        if state is None:
            state = LinearState(fk.new_zeros(B, H, R, Dv), fk.new_zeros(B, H, R))
        else:
            fields = {"S": (B, H, R, Dv), "z": (B, H, R)}
            check_state(state, LinearState, fields, name=name, dtype=acc, device=q_t.device)
        S = state.S + fk.unsqueeze(-1) * v_t.unsqueeze(-2)  # (B, H, R, Dv)
        z = state.z + fk  # (B, H, R)
        num = (fq.unsqueeze(-2) @ S).squeeze(-2)  # (B, H, Dv)
        den = (fq * z).sum(dim=-1, keepdim=True)  # (B, H, 1)
        return (num / (den + eps)).to(dtype), LinearState(S, z)


class LinearAttention(ProjectedAttention[LinearState]):
    """Multi-head kernelized linear attention with the module family's projections.

    Args:
        d_input, d_model, d_output, n_heads, drop_out: see :class:`attnbook.ProjectedAttention`.
        feature_map: as in :func:`linear_attention`. A :class:`~attnbook.feature_maps.PerformerFeatures`
            becomes a submodule (its projection moves with the module) and must be drawn for
            D = d_model // n_heads.
        causal: every forward is causal (as if ``is_causal=True``; needs L == S).
        eps: added to the denominator.
        chunk_size: C of the causal chunked algorithm.
        device, dtype: of the parameters, as for torch's layers.

    Shape:
        ``forward(queries, keys=None, values=None, *, key_padding_mask=None, is_causal=False)``:
        (B, L, d_input), (B, S, d_input), (B, S, d_input) and a (B, S) bool mask (True = padding, as in
        ``nn.MultiheadAttention``) -> (B, L, d_output). ``attn_mask`` must be None (see
        :func:`linear_attention`). Causal self-attention also takes ``initial_state`` (a :class:`LinearState`)
        and ``output_final_state=True`` (-> ``(y, LinearState)``); ``step(x_t, state)``: (B, d_input) ->
        ((B, d_output), LinearState), in O(H R Dv) whatever the position.

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
        d_model: int,
        d_output: int,
        n_heads: int,
        drop_out: float = 0.0,
        feature_map: str | FeatureMap = "elu",
        causal: bool = False,
        eps: float = 1e-6,
        chunk_size: int = 32,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ):
        super().__init__(d_input, d_model, d_output, n_heads, drop_out, device=device, dtype=dtype)
        name = type(self).__name__
        self.causal = check_bool(causal, "causal", name=name)
        self.eps = check_eps(eps, name=name)
        self.chunk_size = check_chunk_size(chunk_size, name=name)
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
        is_causal = self.causal if is_causal is None else is_causal
        return linear_attention(
            q,
            k,
            v,
            is_causal=is_causal,
            attn_mask=attn_mask,
            feature_map=self.feature_map,
            key_padding_mask=key_padding_mask,
            eps=self.eps,
            chunk_size=self.chunk_size,
            out_dtype=accumulation_dtype(q.dtype),  # the out-projection rounds (module docstring)
            initial_state=initial_state,
            output_final_state=output_final_state,
        )

    def attend_step(
        self, q_t: torch.Tensor, k_t: torch.Tensor, v_t: torch.Tensor, state: LinearState | None
    ) -> tuple[torch.Tensor, LinearState]:
        out, state = linear_attention_step(q_t, k_t, v_t, state, feature_map=self.feature_map, eps=self.eps)
        return out, state
