"""Mixture-of-head attention (MoH): chapter 5.

Jin, Zhu, Yuan, Yan, "MoH: Multi-Head Attention as Mixture-of-Head Attention", arXiv:2410.11842 (2024).

Multi-head attention is a sum over heads, ``concat(head_1..head_H) W_O = sum_h head_h W_O^h``. MoH treats the
heads as experts and weights each head's output per token with a gate ``g_{t,h}``:

    out_t = sum_h g_{t,h} head_h(t) W_O^h

The first ``h_s = shared_head`` heads are *shared*: every token uses them, weighted by ``h_s * softmax(W_s x_t)``.
The other ``E = H - h_s`` heads are *routed*: a router ``W_r`` scores them, each token keeps its top ``k =
routed_head`` and weights them by ``k * p_i / sum_{j in top-k} p_j``. When both kinds exist, ``2 * softmax(W_h
x_t) = (a_1, a_2)`` scales the shared and the routed gates. The factors keep gates on the scale of multi-head
attention (every gate 1). A load-balancing loss ``E * sum_i f_i P_i`` (``f_i`` the fraction of tokens that pick
routed head i, ``P_i`` its mean router probability) keeps the router from collapsing onto a few heads.

Parameter names are the MoH reference code's and timm's (``qkv``, ``q_norm``, ``k_norm``, ``proj``, ``wg`` = W_r,
``wg_0`` = W_h, ``wg_1`` = W_s), so MoH checkpoints and timm ViT weights load. Like the reference, every head is
computed and unselected heads are multiplied by 0: no FLOPs are saved.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, TypeAlias, TypedDict, cast, overload

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ._checks import (
    check_attn_mask,
    check_bool,
    check_choice,
    check_factory,
    check_found,
    check_head_dim,
    check_int,
    check_is_causal,
    check_key_padding_mask,
    check_module,
    check_moh_heads,
    check_no_attn_mask,
    check_norm_layer,
    check_probability,
    check_same_value,
    check_state_call,
    check_step_token,
    check_tokens,
)
from ._runtime import accumulation_dtype, autocast_disabled, exporting, linear_in_range
from .softmax import _NO_MASK_WITH_CACHE, KVCache, cached_attention, combine_masks, softmax_attention, zero_unseen_keys

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["HeadRouting", "MoHAttention", "moh_load_balancing_loss", "default_heads"]


def default_heads(num_heads: int) -> tuple[int, int]:
    """(shared_head, routed_head) of an :class:`MoHAttention` built without either: a quarter of the heads shared
    (at least one), each token routed to half of them (at least one); a single head is shared."""
    if num_heads == 1:
        return 1, 0
    return max(1, num_heads // 4), max(1, num_heads // 2)


class HeadRouting(NamedTuple):
    """What the router decided in one :class:`MoHAttention` forward, in at least float32.

    Heads ``0 .. h_s-1`` are the shared heads, heads ``h_s .. H-1`` the ``E = H - h_s`` routed heads.

    Attributes:
        gates: (B, N, H) the weight of each head's output (0 for unselected routed heads).
        selected: (B, N, H) bool, True where the head is active (shared heads, and the token's top-k).
        routed_probs: (B, N, E) the router's ``p = softmax(W_r x)`` (before top-k).
        load, importance: (E,) ``f_i`` (the fraction of tokens that selected head i; sums to ``k``) and ``P_i``.
        loss: () the load-balancing loss ``E * sum_i f_i P_i`` (gradient through ``P_i``); 0 without routed heads.
        shared_weight, routed_weight: (B, N) ``(a_1, a_2) = 2 softmax(W_h x)``; both 1 without ``wg_0``.

    Example:
        >>> import torch, attnbook
        >>> layer = attnbook.MoHAttention(32, num_heads=4, shared_head=1, routed_head=2)
        >>> _, routing = layer(torch.randn(2, 6, 32), return_routing=True)
        >>> routing.selected.sum(-1).unique().tolist()  # 1 shared + 2 routed heads for every token
        [3]
    """

    gates: torch.Tensor
    selected: torch.Tensor
    routed_probs: torch.Tensor
    load: torch.Tensor
    importance: torch.Tensor
    loss: torch.Tensor
    shared_weight: torch.Tensor
    routed_weight: torch.Tensor


#: What :meth:`MoHAttention.forward` returns: out, and the routing and the cache when asked for.
_Out: TypeAlias = "Tensor | tuple[Tensor, HeadRouting] | tuple[Tensor, KVCache] | tuple[Tensor, HeadRouting, KVCache]"


class _Options(TypedDict, total=False):
    """The keywords of :meth:`MoHAttention.forward` that its overloads do not tell apart."""

    key_padding_mask: Tensor | None
    initial_state: KVCache | None


class MoHAttention(nn.Module):
    """Mixture-of-head attention (Jin et al. 2024): per-token gates over the heads of multi-head attention.

    ``out_t = proj(concat_h g_{t,h} head_h(t))``, ``head_h = softmax(q_h k_h^T / sqrt(D)) v_h``, the gates of
    :class:`HeadRouting`. With ``shared_head = num_heads``, ``routed_head = 0`` and a zero ``wg_1`` every gate is 1:
    timm's ``Attention`` (whose state dict loads with ``strict=False``). Cost: O(B H N^2 D) time for the heads,
    O(B N C H) for the router.

    Args:
        dim, num_heads: model width C and number of heads H.
        qkv_bias, qk_norm, attn_drop, proj_drop, norm_layer, scale_norm, proj_bias, dim_out: timm ``Attention``'s.
        shared_head, routed_head: h_s, the heads active for every token, and k, the routed heads each token activates.
            Neither given: :func:`default_heads`; one given: the other is 0. Valid: ``routed_head = 0`` with
            ``shared_head = num_heads``, or ``routed_head >= 1`` with ``shared_head + routed_head <= num_heads``.
        head_dim: width D of a head (timm: ``attn_head_dim``), default ``dim // num_heads``.
        causal: every forward is causal.
        gated: must be False (timm's sigmoid output gate; MoH's gates take its place).
        device, dtype: of the parameters, as for torch's layers.

    Attributes:
        load_balancing_loss: the loss of the latest *training* forward (attached to its graph), else None.

    Shape:
        ``forward(x, attn_mask=None, is_causal=False)``: (B, N, dim) -> (B, N, dim_out), as timm's ``Attention``;
        ``return_routing=True`` adds the :class:`HeadRouting`; causal calls carry a :class:`attnbook.KVCache`.

    Example:
        >>> import torch, attnbook
        >>> layer = attnbook.MoHAttention(64, num_heads=8, shared_head=2, routed_head=3, causal=True)
        >>> x = torch.randn(2, 10, 64)
        >>> y, cache = layer(x[:, :9], output_final_state=True)  # prefill, then one more token
        >>> torch.allclose(layer.step(x[:, 9], cache)[0], layer(x)[:, 9], atol=1e-5)
        True
    """

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        qkv_bias: bool = False,
        qk_norm: bool = False,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
        norm_layer: Callable[..., nn.Module] | None = None,
        shared_head: int | None = None,
        routed_head: int | None = None,
        head_dim: int | None = None,
        causal: bool = False,
        *,
        scale_norm: bool = False,
        proj_bias: bool = True,
        attn_head_dim: int | None = None,
        dim_out: int | None = None,
        gated: bool = False,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ):
        super().__init__()
        name = type(self).__name__
        dim = check_int(dim, "dim", name=name, minimum=1)
        if shared_head is None and routed_head is None:  # neither given (timm builds the layer so): the default split
            shared_head, routed_head = default_heads(check_int(num_heads, "num_heads", name=name, minimum=1))
        shared_head = 0 if shared_head is None else shared_head
        routed_head = 0 if routed_head is None else routed_head
        num_heads, shared_head, routed_head = check_moh_heads(num_heads, shared_head, routed_head, name=name)
        if attn_head_dim is not None:
            why = " (attn_head_dim is timm's name for head_dim)"
            check_same_value(head_dim, attn_head_dim, "head_dim", "attn_head_dim", name=name, why=why)
            head_dim = attn_head_dim
        head_dim = check_head_dim(head_dim, dim, num_heads, name=name)
        dim_out = dim if dim_out is None else check_int(dim_out, "dim_out", name=name, minimum=1)
        scale_norm = check_bool(scale_norm, "scale_norm", name=name)
        proj_bias = check_bool(proj_bias, "proj_bias", name=name)
        why = " (timm's sigmoid output gate is not part of MoH, whose per-token head gates take its place)"
        check_choice(check_bool(gated, "gated", name=name), "gated", (False,), name=name, why=why)
        norm_layer = nn.LayerNorm if norm_layer is None else norm_layer
        factory = check_factory(device, dtype, name=name)
        attn_drop = check_probability(attn_drop, "attn_drop", name=name)
        proj_drop = check_probability(proj_drop, "proj_drop", name=name)
        qkv_bias = check_bool(qkv_bias, "qkv_bias", name=name)
        qk_norm = check_bool(qk_norm, "qk_norm", name=name)
        causal = check_bool(causal, "causal", name=name)

        self.dim, self.dim_out, self.num_heads, self.head_dim = dim, dim_out, num_heads, head_dim
        self.scale = head_dim**-0.5
        self.shared_head, self.routed_head = shared_head, routed_head
        self.num_routed = num_heads - shared_head if routed_head > 0 else 0  # E, the routed experts
        self.causal = causal  # every forward is causal (as if is_causal=True): for decoders
        self.fused_attn = True  # timm's switch: False takes the explicit-matrix path (same math)

        inner = num_heads * head_dim
        self.qkv = nn.Linear(dim, 3 * inner, bias=qkv_bias, **factory)
        self.q_norm = check_norm_layer(norm_layer, head_dim, name=name, **factory) if qk_norm else nn.Identity()
        self.k_norm = check_norm_layer(norm_layer, head_dim, name=name, **factory) if qk_norm else nn.Identity()
        self.attn_drop = nn.Dropout(attn_drop)
        self.norm = check_norm_layer(norm_layer, inner, name=name, **factory) if scale_norm else nn.Identity()
        self.proj = nn.Linear(inner, dim_out, bias=proj_bias, **factory)
        self.proj_drop = nn.Dropout(proj_drop)
        # Router weights, created exactly when the reference creates them (checkpoint compatibility), except
        # that a single shared head needs no wg_1: softmax over one logit is identically 1.
        if routed_head > 0:
            self.wg = nn.Linear(dim, self.num_routed, bias=False, **factory)  # W_r, scores the routed heads
            if shared_head > 0:
                self.wg_0 = nn.Linear(dim, 2, bias=False, **factory)  # W_h, the two-stage weighting
        if shared_head > 1:
            self.wg_1 = nn.Linear(dim, shared_head, bias=False, **factory)  # W_s, weights the shared heads
        self.load_balancing_loss: torch.Tensor | None = None

    def reset_parameters(self) -> None:
        """Draw every weight again with torch's default initialisation of its layer (``nn.Linear``, the norms)."""
        for module in self.modules():
            if module is not self and hasattr(module, "reset_parameters"):
                reset = cast(Callable[[], None], module.reset_parameters)  # torch types it as Tensor | Module
                reset()

    def extra_repr(self) -> str:
        return (
            f"dim={self.dim}, num_heads={self.num_heads}, head_dim={self.head_dim}, dim_out={self.dim_out}, "
            f"shared_head={self.shared_head}, routed_head={self.routed_head}, causal={self.causal}"
        )

    def route(self, x: torch.Tensor) -> HeadRouting:
        """The router alone: per-token head gates for x (B, N, dim), in at least float32 with autocast off (the top-k
        choices and softmaxes do not suffer from half precision)."""
        check_tokens(x, "x", name=type(self).__name__, width=self.dim, like=self.qkv.weight)
        B, N, _ = x.shape
        acc = accumulation_dtype(x.dtype)
        s, k, E = self.shared_head, self.routed_head, self.num_routed
        with autocast_disabled(x.device):
            xr = x.to(acc)
            ones = xr.new_ones(B, N)

            # All router logits in one matmul (W_r, W_h, W_s stacked): one pass over x instead of three.
            # (A single head, all shared, has no router at all.)
            names = [n for n in ("wg", "wg_0", "wg_1") if hasattr(self, n)]
            logit = {}  # name -> (B, N, out_features)
            if names:
                stacked = torch.cat([getattr(self, n).weight for n in names]).to(acc)  # (E + 2 + h_s, C)
                split = F.linear(xr, stacked).split([getattr(self, n).out_features for n in names], dim=-1)
                logit = dict(zip(names, split, strict=True))

            # Shared heads: h_s * softmax(W_s x); one shared head has softmax 1 and needs no W_s.
            if s > 1:
                shared = F.softmax(logit["wg_1"], dim=-1) * s  # (B, N, h_s)
            else:
                shared = xr.new_ones(B, N, s)  # (B, N, h_s), h_s in {0, 1}

            if k == 0:  # all heads shared (validated: s == H)
                selected, none = torch.ones_like(shared, dtype=torch.bool), xr.new_zeros(0)  # no routed heads
                return HeadRouting(shared, selected, xr.new_zeros(B, N, 0), none, none, xr.new_zeros(()), ones, ones)

            # Routed heads: top-k of p = softmax(W_r x), renormalised over the chosen k and scaled by k.
            probs = F.softmax(logit["wg"], dim=-1)  # (B, N, E)
            top = probs.topk(k, dim=-1).indices  # (B, N, k)
            chosen = torch.zeros_like(probs, dtype=torch.bool).scatter(-1, top, True)  # (B, N, E)
            kept = probs * chosen
            denom = kept.sum(dim=-1, keepdim=True).clamp(min=torch.finfo(acc).eps)  # (B, N, 1)
            routed = kept / denom * k  # (B, N, E)

            # Load balancing over all B*N tokens: E * sum_i f_i P_i, written as the reference does.
            importance = probs.reshape(B * N, E).mean(dim=0)  # (E,) P_i
            load = chosen.reshape(B * N, E).to(acc).mean(dim=0)  # (E,) f_i
            loss = torch.mean(importance * load) * E * E

            # Two-stage weighting: (a_1, a_2) = 2 softmax(W_h x) splits the weight between the two kinds.
            if s > 0:
                weight = F.softmax(logit["wg_0"], dim=-1) * 2  # (B, N, 2)
                shared_weight, routed_weight = weight[..., 0], weight[..., 1]  # (B, N)
                shared = shared * shared_weight.unsqueeze(-1)
                routed = routed * routed_weight.unsqueeze(-1)
            else:
                shared_weight = routed_weight = ones
            gates = torch.cat([shared, routed], dim=-1)  # (B, N, H)
            selected = torch.cat([torch.ones_like(shared, dtype=torch.bool), chosen], dim=-1)  # (B, N, H)
        return HeadRouting(gates, selected, probs, load, importance, loss, shared_weight, routed_weight)

    @overload
    def forward(
        self, x: Tensor, attn_mask: Tensor | None = ..., is_causal: bool = ..., return_routing: Literal[False] = ..., *,
        output_final_state: Literal[False] = ..., **options: Unpack[_Options],
    ) -> Tensor: ...  # fmt: skip
    @overload
    def forward(
        self, x: Tensor, attn_mask: Tensor | None = ..., is_causal: bool = ..., *, return_routing: Literal[True],
        output_final_state: Literal[False] = ..., **options: Unpack[_Options],
    ) -> tuple[Tensor, HeadRouting]: ...  # fmt: skip
    @overload
    def forward(
        self, x: Tensor, attn_mask: Tensor | None = ..., is_causal: bool = ..., return_routing: Literal[False] = ..., *,
        output_final_state: Literal[True], **options: Unpack[_Options],
    ) -> tuple[Tensor, KVCache]: ...  # fmt: skip
    @overload
    def forward(
        self, x: Tensor, attn_mask: Tensor | None = ..., is_causal: bool = ..., *, return_routing: Literal[True],
        output_final_state: Literal[True], **options: Unpack[_Options],
    ) -> tuple[Tensor, HeadRouting, KVCache]: ...  # fmt: skip
    @overload
    def forward(
        self, x: Tensor, attn_mask: Tensor | None = ..., is_causal: bool = ..., return_routing: Literal[False] = ..., *,
        output_final_state: bool, **options: Unpack[_Options],
    ) -> Tensor | tuple[Tensor, KVCache]: ...  # fmt: skip
    @overload
    def forward(
        self, x: Tensor, attn_mask: Tensor | None = ..., is_causal: bool = ..., return_routing: bool = ..., *,
        output_final_state: bool = ..., **options: Unpack[_Options],
    ) -> _Out: ...  # fmt: skip

    def forward(
        self,
        x: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        is_causal: bool = False,
        return_routing: bool = False,
        *,
        key_padding_mask: torch.Tensor | None = None,
        initial_state: KVCache | None = None,
        output_final_state: bool = False,
    ) -> _Out:
        """Gated multi-head self-attention of x (B, N, dim) -> (B, N, dim_out) [, HeadRouting] [, KVCache].

        timm's ``Attention.forward`` plus ``return_routing``; ``key_padding_mask`` (B, N), bool True = padding or float;
        causal calls only: ``initial_state`` (a :class:`attnbook.KVCache`) and ``output_final_state``.
        """
        name = type(self).__name__
        causal = check_is_causal(is_causal, name=name) or self.causal
        return_routing = check_bool(return_routing, "return_routing", name=name)
        output_final_state = check_bool(output_final_state, "output_final_state", name=name)
        routing = self.route(x)  # validates x
        B, N, _ = x.shape
        H, D = self.num_heads, self.head_dim
        stateful = initial_state is not None or output_final_state
        check_state_call(causal, initial_state, output_final_state, name=name)
        if attn_mask is not None:
            attn_mask = check_attn_mask(attn_mask, (B, H, N, N), name=name).to(x.device)
        if key_padding_mask is not None:
            key_padding_mask = check_key_padding_mask(key_padding_mask, B, N, name=name, floating=not stateful)
            key_padding_mask = key_padding_mask.to(x.device)
        q, k, v = self.qkv(x).view(B, N, 3, H, D).permute(2, 0, 3, 1, 4).unbind(0)  # 3 x (B, H, N, D)
        q, k = self.q_norm(q), self.k_norm(k)
        dtype = v.dtype  # the projections' dtype: the layer's, or the autocast dtype
        p = self.attn_drop.p if self.training else 0.0
        cache = None
        if stateful:
            check_no_attn_mask(attn_mask, name=name, why=_NO_MASK_WITH_CACHE)
            heads, cache = cached_attention(
                q, k, v, initial_state, key_padding_mask=key_padding_mask, scale=self.scale, name=name
            )  # (B, H, N, D)
        elif not self.fused_attn or (p > 0 and (attn_mask is not None or key_padding_mask is not None or causal)):
            heads = self._explicit_attention(q, k, v, attn_mask, key_padding_mask, causal)  # (B, H, N, D)
        elif p > 0:
            heads = F.scaled_dot_product_attention(q, k, v, dropout_p=p)  # (B, H, N, D)
        else:
            heads = softmax_attention(
                q, k, v, attn_mask, is_causal=causal, scale=self.scale, key_padding_mask=key_padding_mask
            )  # (B, H, N, D)
        out = self._gated_output(heads, routing.gates, dtype)  # (B, N, dim_out)
        if not exporting():  # an exported program holds no module state (its loss is in the routing it returns)
            self.load_balancing_loss = routing.loss if self.training and self.routed_head > 0 else None
        if output_final_state:
            assert cache is not None  # output_final_state made the call stateful
            return (out, routing, cache) if return_routing else (out, cache)
        return (out, routing) if return_routing else out

    if TYPE_CHECKING:  # layer(...) is typed as forward(...) (torch types nn.Module.__call__ as returning Any)
        __call__ = forward

    def _gated_output(self, heads: torch.Tensor, gates: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """heads (B, H, N, D) times gates (B, N, H), merged, normalised (``scale_norm``), projected, dropout."""
        B, H, N, D = heads.shape
        with autocast_disabled(heads.device):
            gated = heads.transpose(1, 2).to(gates.dtype) * gates.unsqueeze(-1)  # (B, N, H, D)
        merged = self.norm(gated.reshape(B, N, H * D))  # (B, N, H D)
        out: torch.Tensor = self.proj_drop(linear_in_range(self.proj, merged, dtype))  # (B, N, dim_out)
        return out

    def step(self, x_t: torch.Tensor, state: KVCache | None = None) -> tuple[torch.Tensor, KVCache]:
        """One token of causal MoH: x_t (B, dim) after the tokens held in ``state`` (a KV cache, or None) ->
        ``(y_t (B, dim_out), new cache)``, as a causal forward over the whole sequence gives it."""
        name = f"{type(self).__name__}.step"
        check_step_token(x_t, "x_t", name=name, width=self.dim, like=self.qkv.weight)
        x = x_t.unsqueeze(1)  # (B, 1, C)
        B, H, D = x.shape[0], self.num_heads, self.head_dim
        gates = self.route(x).gates  # (B, 1, H), in at least float32
        q, k, v = self.qkv(x).view(B, 1, 3, H, D).permute(2, 0, 3, 1, 4).unbind(0)  # 3 x (B, H, 1, D)
        q, k = self.q_norm(q), self.k_norm(k)
        heads, cache = cached_attention(q, k, v, state, scale=self.scale, name=name, arg="state")  # (B, H, 1, D)
        return self._gated_output(heads, gates, v.dtype)[:, 0], cache  # (B, dim_out)

    def _explicit_attention(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        attn_mask: torch.Tensor | None,
        key_padding_mask: torch.Tensor | None,
        causal: bool,
    ) -> torch.Tensor:
        """timm's unfused path, the (B, H, N, N) matrix written out, in the accumulation dtype; also the path
        for dropout on the weights together with a mask. Same mask rules as :func:`attnbook.softmax_attention`."""
        N = q.shape[-2]
        allowed, additive = combine_masks(attn_mask, key_padding_mask, causal, N, N, q.device)
        acc = accumulation_dtype(v.dtype)
        with autocast_disabled(q.device):
            q, k, v = q.to(acc), k.to(acc), v.to(acc)
            visible = allowed
            if additive is not None:
                finite = additive > float("-inf")
                visible = finite if visible is None else visible & finite
            if visible is not None:
                k, v = zero_unseen_keys(k, v, visible)
            scores = (q * self.scale) @ k.transpose(-2, -1)  # (B, H, N, N)
            if additive is not None:
                scores = scores + additive.to(acc)
            if visible is not None:
                scores = scores.masked_fill(~visible, float("-inf"))
            weights = scores.softmax(dim=-1)
            if visible is not None:  # a row with nothing allowed: zero weights (a NaN from the inputs stays)
                weights = torch.where(visible.any(dim=-1, keepdim=True), weights, 0.0)
            dropped: torch.Tensor = self.attn_drop(weights)  # (B, H, N, N)
            return dropped @ v  # (B, H, N, D)

    def __getstate__(self) -> dict[str, Any]:
        # The last training loss is attached to that forward's autograd graph, which cannot be copied or
        # pickled; it is not part of the layer's state either. Dropping it keeps copy.deepcopy (EMA
        # models) and pickling working after a training step.
        state = self.__dict__.copy()
        state["load_balancing_loss"] = None
        return state


def moh_load_balancing_loss(model: nn.Module, reduction: str = "mean") -> torch.Tensor:
    """The load-balancing losses of every :class:`MoHAttention` layer in ``model``, after a training forward: add
    ``beta * loss`` to the task loss (the MoH paper: beta = 0.01).

    ``reduction="mean"`` averages over the layers with routed heads (one ``beta`` for any depth), ``"sum"`` adds them
    up; 0 when no layer has routed heads.

    Example:
        >>> import torch, attnbook
        >>> model = torch.nn.Sequential(attnbook.MoHAttention(32, num_heads=4, shared_head=1, routed_head=2))
        >>> out = model.train()(torch.randn(2, 6, 32))  # a training forward records each layer's loss
        >>> (out.pow(2).mean() + 0.01 * attnbook.moh_load_balancing_loss(model)).backward()
    """
    where = "moh_load_balancing_loss"
    check_module(model, "model", name=where)
    check_choice(reduction, "reduction", ("mean", "sum"), name=where)
    layers = [(name, m) for name, m in model.named_modules() if isinstance(m, MoHAttention)]
    got = f"a {type(model).__name__} without one"
    check_found(layers, "model", name=where, expected="contain a MoHAttention layer", got=got)
    losses: list[torch.Tensor] = []
    for name, m in layers:
        if m.routed_head == 0:
            continue
        expected = "have run a forward in training mode (model.train()) before its loss is gathered"
        found = [] if m.load_balancing_loss is None else [m.load_balancing_loss]
        check_found(found, f"layer {name or '<model>'!r}", name=where, expected=expected, got="no load-balancing loss")
        loss = cast(torch.Tensor, m.load_balancing_loss)  # not None: checked above
        if torch.is_grad_enabled() and loss.grad_fn is None and m.wg.weight.requires_grad:
            warnings.warn(
                f"{where}: the load-balancing loss of layer {name or '<model>'!r} was computed without autograd (a "
                "training forward under torch.no_grad, or inside torch.utils.checkpoint with use_reentrant=True, "
                "whose first forward runs without autograd): it gives the router no gradient. Checkpoint with "
                "use_reentrant=False",
                UserWarning,
                stacklevel=2,
            )
        losses.append(loss)
    if not losses:
        return next(layers[0][1].parameters()).new_zeros((), dtype=torch.float32)
    total = torch.stack([loss.to(losses[0].dtype) for loss in losses]).sum()
    return total / len(losses) if reduction == "mean" else total
