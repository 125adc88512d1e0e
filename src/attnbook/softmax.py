"""Softmax (scaled dot-product) attention: chapter 1.

    out_i = sum_j softmax_j(q_i . k_j * scale + m_ij) v_j,   scale = 1 / sqrt(D)

Vaswani et al., "Attention Is All You Need", NeurIPS 2017. The fast path is torch's
``scaled_dot_product_attention`` (SDPA), with its signature and its masks; the literal definition is
:func:`attnbook.reference.softmax_attention`. Unlike SDPA, ``attn_mask`` and ``is_causal`` may be combined, and
``key_padding_mask`` is taken as ``nn.MultiheadAttention`` takes it ((B, M), True = padding, or a float added to
that key's scores).

Masked positions and non-finite numbers (the rule every masked entry point of the package follows):

* A key that *no* query of its (batch, head) may attend to (padding) contributes nothing, whatever it holds (NaN
  included): it is replaced by zeros before any arithmetic (:func:`zero_unseen_keys`). A key masked for some
  queries only keeps its value for the others.
* A query with no key it may attend to returns zeros (and zero gradients), whatever it holds.
* A NaN or inf in a *visible* input is never hidden: the outputs of the queries that attend to it are NaN, and
  the fused kernels, which multiply zero weights by masked values, may carry it to other queries of the same
  (batch, head).

Generation keeps a **KV cache** (:class:`KVCache`) of every past token's keys and values: :class:`SoftmaxAttention`
prefills one in one parallel call (``forward(x, output_final_state=True)``) and continues token by token
(:meth:`SoftmaxAttention.step`).
"""

from __future__ import annotations

from typing import Any, NamedTuple, cast

import torch
import torch.nn.functional as F

from ._checks import (
    check_attn_mask,
    check_bool,
    check_is_causal,
    check_key_padding_mask,
    check_kv_cache,
    check_no_attn_mask,
    check_padding,
    check_probability,
    check_qkv,
    check_renamed_mask,
    check_scale,
    check_tensor,
)
from ._module import ProjectedAttention
from ._runtime import result_dtype, tracing

__all__ = ["softmax_attention", "SoftmaxAttention", "KVCache", "zero_unseen_keys", "combine_masks", "cached_attention"]


def zero_unseen_keys(k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """k (B, H, M, D) and v (B, H, M, Dv) with every key that no query may attend to (``allowed`` (..., N, M) bool)
    replaced by zeros: the weighted sum still multiplies a masked weight 0 by its value (0 * NaN = NaN)."""
    seen = allowed.any(dim=-2).unsqueeze(-1)  # (..., M, 1): some query may attend to key j
    return torch.where(seen, k, 0.0), torch.where(seen, v, 0.0)


def softmax_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    *,
    key_padding_mask: torch.Tensor | None = None,
    causal: bool | None = None,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Scaled dot-product attention with torch's masks, through torch's SDPA (and with its signature).

    ``out_i = sum_j softmax_j(scale * q_i . k_j + m_ij) v_j`` over the keys j that query i may attend to.

    Cost: O(B H N M D) time; O(B H N M) memory on backends that materialise the weights (the fused flash /
    memory-efficient kernels need O(B H N) extra memory).

    Args:
        q, k, v: queries (B, H, N, D), keys (B, H, M, D), values (B, H, M, Dv).
        attn_mask: as in SDPA: bool (True = may attend) or floating (added to the scores in the inputs' dtype;
            -inf forbids, as does a value beyond that dtype's range, -1e9 in float16), broadcastable to
            (B, H, N, M). May be combined with ``is_causal``.
        dropout_p: dropout on the attention weights, as in SDPA (whenever it is > 0: pass 0.0 in evaluation).
        is_causal: query i attends only to keys j <= i (top-left aligned when N != M, as in SDPA).
        scale: multiplies the scores; default 1 / sqrt(D); a normal float32 number.
        key_padding_mask: as in ``nn.MultiheadAttention``: (B, M), bool True = padding, or floating (added to
            that key's scores).
        causal, mask: the deprecated names of ``is_causal`` and ``attn_mask``.

    Returns:
        (B, H, N, Dv) in the inputs' dtype (under autocast: the autocast dtype, as SDPA). A query with no key it
        may attend to gets zeros, never NaN. Twice differentiable only on SDPA's math backend.

    Example:
        >>> import torch, attnbook
        >>> q, k, v = (torch.randn(2, 4, 10, 16) for _ in range(3))  # (B, H, N, D)
        >>> out = attnbook.softmax_attention(q, k, v, is_causal=True)
        >>> torch.allclose(out, torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True), atol=1e-6)
        True
        >>> padding = torch.tensor([[False] * 8 + [True] * 2, [False] * 10])  # (B, M): True = padding
        >>> attnbook.softmax_attention(q, k, v, key_padding_mask=padding).shape
        torch.Size([2, 4, 10, 16])
    """
    name = "softmax_attention"
    B, H, N, M, _, _ = check_qkv(q, k, v, name=name)
    is_causal = check_is_causal(is_causal, causal, name=name)
    attn_mask = check_renamed_mask(attn_mask, mask, name=name)
    dropout_p = check_probability(dropout_p, "dropout_p", name=name)
    scale = check_scale(scale, name=name)
    if attn_mask is not None:
        attn_mask = check_attn_mask(attn_mask, (B, H, N, M), name=name).to(q.device)  # (b, h, n, M)
    if key_padding_mask is not None:
        key_padding_mask = check_key_padding_mask(key_padding_mask, B, M, name=name, floating=True).to(q.device)
    return _attend(q, k, v, attn_mask, key_padding_mask, is_causal, scale, dropout_p)


def combine_masks(
    attn_mask: torch.Tensor | None,
    key_padding_mask: torch.Tensor | None,
    causal: bool,
    N: int,
    M: int,
    device: torch.device,
    lower_right: bool = False,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The masks of one attention call as (allowed, additive): ``allowed`` bool (True = may attend) from a bool
    ``attn_mask``, a bool ``key_padding_mask`` (True = padding) and the causal mask; ``additive`` the sum of the
    float masks, added to the scores. Both broadcastable to (B, H, N, M), either None when no mask of its kind
    was given. ``lower_right`` aligns the causal mask to the last key (new queries continuing a cache)."""
    allowed, additive = None, None
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            allowed = attn_mask
        else:
            additive = attn_mask
    if key_padding_mask is not None:
        padded = key_padding_mask[:, None, None, :]  # (B, 1, 1, M)
        if padded.dtype == torch.bool:
            allowed = ~padded if allowed is None else allowed & ~padded
        else:
            additive = padded if additive is None else additive + padded
    if causal:
        tril = torch.ones(N, M, dtype=torch.bool, device=device).tril(M - N if lower_right else 0)  # (N, M)
        allowed = tril if allowed is None else allowed & tril
    return allowed, additive


def _attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attn_mask: torch.Tensor | None,
    key_padding_mask: torch.Tensor | None,
    causal: bool,
    scale: float | None,
    dropout_p: float = 0.0,
    lower_right: bool = False,
) -> torch.Tensor:
    """SDPA with the package's rules for masks: keys nobody sees are zeroed, empty rows are zero, and a query with a NaN
    or inf, or one that sees a key holding a NaN, gives a NaN row. ``lower_right`` aligns the causal mask to the last
    key."""
    N, M = q.shape[-2], k.shape[-2]
    if attn_mask is None and key_padding_mask is None and not (causal and lower_right and N != M):
        # The fused kernels handle the causal mask themselves; every row has key 0, so none is empty.
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=causal, scale=scale)
        return _keep_broken_rows(q, k, out, None, causal)  # (B, H, N, Dv)
    allowed, additive = combine_masks(attn_mask, key_padding_mask, causal, N, M, q.device, lower_right)
    visible = allowed
    if additive is not None:
        # In the dtype SDPA adds it in: a value beyond that dtype's range (-1e9 in float16) is -inf there.
        additive = additive.to(result_dtype(q))
        not_forbidden = additive != float("-inf")  # a NaN forbids nothing: it reaches the scores, and the row is NaN
        visible = not_forbidden if visible is None else visible & not_forbidden
    assert visible is not None  # a mask was given, or the causal mask was made
    has_key = visible.any(dim=-1, keepdim=True)  # (b, h, n, 1)
    seen_k, seen_v = zero_unseen_keys(k, v, visible)
    if additive is None:
        # A fully masked row would be softmax over nothing (NaN): let it attend to everything, then zero it.
        sdpa_mask: torch.Tensor = visible | ~has_key
    else:
        if allowed is not None:
            additive = additive.masked_fill(~allowed, float("-inf"))
        sdpa_mask = torch.where(has_key, additive, 0.0)
    # A query with no key is zeroed too: whatever it holds (NaN) then reaches no weight and no gradient.
    out = F.scaled_dot_product_attention(
        torch.where(has_key, q, 0.0), seen_k, seen_v, attn_mask=sdpa_mask, dropout_p=dropout_p, scale=scale
    )
    return torch.where(has_key, _keep_broken_rows(q, k, out, visible, False), 0.0)  # (B, H, N, Dv)


# Below this many keys, torch's CPU SDPA kernels return a finite row for a query holding a NaN or seeing a key k that
# holds one (measured with torch 2.13: their vectorised loop over keys propagates the NaN, the scalar tail for M < 8
# does not); in float32 and float64 with more keys they propagate it themselves, and the tests check both sides of
# the bound. In float16 and bfloat16 they dropped an inf query at some M above it (64, 65, 128, 200), and traced
# (torch.compile, torch.export) a branch on M would tie the graph to one side of the bound: there the rule is
# applied at every M.
_SHORT_KEYS = 64


def _keep_broken_rows(
    q: torch.Tensor, k: torch.Tensor, out: torch.Tensor, visible: torch.Tensor | None, causal: bool
) -> torch.Tensor:
    """``out`` with NaN in the row of every query that holds a NaN or inf or may attend to a key whose k holds a NaN
    (a NaN value reaches its channel through the weighted sum, which SDPA keeps); ``visible`` (..., N, M) bool says
    which keys each query sees (None: every key, or with ``causal`` the keys j <= i). Elementwise, no host
    synchronisation."""
    M = k.shape[-2]
    if not tracing() and M >= _SHORT_KEYS and q.dtype in (torch.float32, torch.float64):
        return out
    broken = ~torch.isfinite(q.detach()).all(dim=-1, keepdim=True)  # (B, H, N, 1)
    bad_key = k.detach().isnan().any(-1)  # (B, H, M)
    if visible is not None:
        sees_bad = (visible & bad_key.unsqueeze(-2)).any(dim=-1, keepdim=True)  # (B, H, N, 1)
    elif causal:  # query i sees the keys j <= i
        bad_before = bad_key.cumsum(-1) > 0  # (B, H, M): a bad key at j or before it
        sees_bad = bad_before[..., torch.arange(q.shape[-2], device=q.device).clamp(max=M - 1)].unsqueeze(-1)
    else:
        sees_bad = bad_key.any(dim=-1, keepdim=True).unsqueeze(-1)  # (B, H, 1, 1)
    return torch.where(broken | sees_bad, float("nan"), out)


class KVCache(NamedTuple):
    """The keys and values of the first ``t`` tokens of one softmax-attention layer: its decoding state.

    A NamedTuple (a pytree whose length ``t`` is a size of its tensors, so one dynamic graph serves every t);
    :meth:`extend` and :meth:`append` return a new cache and leave this one as it was, so a generation can branch.

    Attributes:
        keys, values: (B, H, t, D) and (B, H, t, Dv), or None before the first token.
        padding: (B, t) bool, True where the token was padding; None when none was.

    Example:
        >>> import torch
        >>> from attnbook import KVCache
        >>> cache = KVCache.empty().extend(torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8))  # a prompt of 5
        >>> cache = cache.append(torch.randn(1, 2, 8), torch.randn(1, 2, 8))  # one more token
        >>> cache.t, tuple(cache.keys.shape)
        (6, (1, 2, 6, 8))
    """

    keys: torch.Tensor | None = None
    values: torch.Tensor | None = None
    padding: torch.Tensor | None = None

    @property
    def t(self) -> int:
        """The number of tokens held."""
        return 0 if self.keys is None else self.keys.shape[2]

    @staticmethod
    def empty() -> KVCache:
        """The cache before the first token."""
        return KVCache()

    def extend(self, k: torch.Tensor, v: torch.Tensor, padding: torch.Tensor | None = None) -> KVCache:
        """The cache with n more tokens: k (B, H, n, D), v (B, H, n, Dv); ``padding`` (B, n) bool, True = padding."""
        name = "KVCache.extend"
        k = check_tensor(k, "k", name=name, dims=4, layout="(B, H, n, D)")
        v = check_tensor(v, "v", name=name, dims=4, layout="(B, H, n, Dv)")
        check_kv_cache(self, KVCache, k, v, name=name, arg="self")
        check_padding(padding, k.shape[0], k.shape[2], k.device, name=name)
        return self._extended(k, v, padding)

    def _extended(self, k: torch.Tensor, v: torch.Tensor, padding: torch.Tensor | None) -> KVCache:
        """:meth:`extend` for a caller that has checked its arguments (:func:`cached_attention`, once a token)."""
        if self.keys is None or self.values is None:  # contiguous, as the concatenations that follow are
            return KVCache(k.contiguous(), v.contiguous(), padding)
        if padding is not None or self.padding is not None:
            old = self.padding if self.padding is not None else k.new_zeros(k.shape[0], self.t, dtype=torch.bool)
            new = padding if padding is not None else k.new_zeros(k.shape[0], k.shape[2], dtype=torch.bool)
            padding = torch.cat([old, new], dim=1)  # (B, t + n)
        return KVCache(torch.cat([self.keys, k], dim=2), torch.cat([self.values, v], dim=2), padding)

    def append(self, k_t: torch.Tensor, v_t: torch.Tensor) -> KVCache:
        """The cache with one more token: k_t (B, H, D), v_t (B, H, Dv)."""
        return self.extend(k_t.unsqueeze(2), v_t.unsqueeze(2))


def cached_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cache: KVCache | None,
    *,
    key_padding_mask: torch.Tensor | None = None,
    scale: float | None = None,
    name: str,
    arg: str = "initial_state",
) -> tuple[torch.Tensor, KVCache]:
    """Causal softmax attention of n new tokens that continue ``cache``: q, k (B, H, n, D), v (B, H, n, Dv) ->
    (out (B, H, n, Dv), the cache with the new keys). Each new query attends to every cached key and to the new
    keys up to its own; ``key_padding_mask`` (B, n) bool marks padded new tokens, remembered in the cache."""
    if key_padding_mask is not None:
        key_padding_mask = check_key_padding_mask(key_padding_mask, k.shape[0], k.shape[2], name=name).to(k.device)
    if cache is None:
        cache = KVCache.empty().extend(k, v, key_padding_mask)
    else:  # checked once, in the caller's words, not again by extend
        check_kv_cache(cache, KVCache, k, v, name=name, arg=arg)
        cache = cache._extended(k, v, key_padding_mask)
    keys, values = cast(torch.Tensor, cache.keys), cast(torch.Tensor, cache.values)  # not None after extend
    out = _attend(q, keys, values, None, cache.padding, True, scale, lower_right=True)
    return out, cache


_NO_MASK_WITH_CACHE = (
    " with an initial_state (the keys then include the cached ones: use key_padding_mask for padding, and the "
    "causal mask is made for you)"
)


class SoftmaxAttention(ProjectedAttention[KVCache]):
    """Multi-head softmax attention with the module family's projections.

    ``causal``: every forward is causal. Calls as :class:`attnbook.ProjectedAttention`, with the masks of
    :func:`softmax_attention`; the state is a :class:`KVCache`.

    Example:
        >>> import torch, attnbook
        >>> layer = attnbook.SoftmaxAttention(32, 32, 32, n_heads=4, causal=True)
        >>> x = torch.randn(2, 10, 32)
        >>> y, cache = layer(x[:, :9], output_final_state=True)  # prefill 9 tokens
        >>> y_t, cache = layer.step(x[:, 9], cache)  # then one more
        >>> torch.allclose(y_t, layer(x)[:, 9], atol=1e-5)
        True
    """

    has_weights = True

    def __init__(
        self,
        d_input: int,
        d_model: int | None = None,
        d_output: int | None = None,
        n_heads: int | None = None,
        drop_out: float = 0.0,
        causal: bool = False,
        **kwargs: Any,
    ):
        super().__init__(d_input, d_model, d_output, n_heads, drop_out, **kwargs)
        self.causal = check_bool(causal, "causal", name=type(self).__name__)

    def extra_repr(self) -> str:
        return f"n_heads={self.n_heads}, causal={self.causal}"

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
        initial_state: KVCache | None = None,
        output_final_state: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, KVCache]:
        is_causal = self.causal if is_causal is None else is_causal
        if initial_state is None and not output_final_state:
            p = self.attn_drop if self.training else 0.0  # timm's attn_drop: dropout on the weights
            return softmax_attention(q, k, v, attn_mask, p, is_causal, key_padding_mask=key_padding_mask)
        name = type(self).__name__
        if initial_state is not None:
            check_no_attn_mask(attn_mask, name=name, why=_NO_MASK_WITH_CACHE)
        if attn_mask is not None:  # a prefill from nothing: the mask covers the new keys only
            out = softmax_attention(q, k, v, attn_mask, is_causal=True, key_padding_mask=key_padding_mask)
            kpm = (
                None
                if key_padding_mask is None
                else check_key_padding_mask(key_padding_mask, k.shape[0], k.shape[2], name=name)
            )
            cache = KVCache.empty().extend(k, v, kpm)
        else:
            out, cache = cached_attention(q, k, v, initial_state, key_padding_mask=key_padding_mask, name=name)
        return (out, cache) if output_final_state else out

    def attend_step(
        self, q_t: torch.Tensor, k_t: torch.Tensor, v_t: torch.Tensor, state: KVCache | None
    ) -> tuple[torch.Tensor, KVCache]:
        out, cache = cached_attention(
            q_t.unsqueeze(2), k_t.unsqueeze(2), v_t.unsqueeze(2), state, name=f"{type(self).__name__}.step", arg="state"
        )
        return out.squeeze(2), cache  # (B, H, Dv)
