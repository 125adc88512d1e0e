"""The module family shared by softmax, linear, flow and mobile attention, and chapter 8's recurrent layers.

Every module of the family has the constructor ``(d_input, d_model, d_output, n_heads, drop_out, ...)`` and the
parameters ``query_projection``, ``key_projection``, ``value_projection`` and ``out_projection`` of the Flowformer
/ Mobile-Attention reference code, so the modules replace one another and load the reference checkpoints. A
subclass says how the heads attend (:meth:`attend`) and how one token attends to the state before it
(:meth:`attend_step`). The calls follow torch's layers and carry a state as flash-linear-attention does; every
layer also takes timm ``Attention``'s keywords (``timm.models.VisionTransformer(attn_layer=attnbook.FlowAttention)``
builds). Each ``drop_out`` default is the published layer's: 0.05 for Flow- and Mobile-Attention, 0.0 for softmax
and linear attention.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Generic, Literal, TypedDict, TypeVar, cast, overload

import torch
from torch import Tensor, nn

from ._checks import (
    check_bool,
    check_choice,
    check_divisible,
    check_factory,
    check_int,
    check_is_causal,
    check_key_padding_mask,
    check_layer_inputs,
    check_norm_layer,
    check_probability,
    check_same_value,
    check_state_call,
    check_step_token,
)
from ._runtime import linear_in_range

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["ProjectedAttention", "RecurrentAttention"]

#: The recurrent state of a layer's causal self-attention: :class:`attnbook.KVCache` (softmax),
#: :class:`attnbook.LinearState`, :class:`attnbook.FlowState`.
StateT = TypeVar("StateT")


class _Options(TypedDict, total=False):
    """The keywords of :meth:`ProjectedAttention.forward` that its overloads do not tell apart."""

    attn_mask: Tensor | None
    key_padding_mask: Tensor | None
    is_causal: bool


class ProjectedAttention(nn.Module, Generic[StateT]):
    """Project, split into heads, attend, merge heads, project out, dropout.

    Args:
        d_input: width of the incoming queries, keys and values.
        d_model: width of the projected queries, keys and values, split into ``n_heads`` heads (default ``d_input``).
        d_output: width of the output (default ``d_input``).
        n_heads: number of heads H (timm: ``num_heads``).
        drop_out: dropout probability after the output projection (timm: ``proj_drop``).
        qkv_bias, qk_norm, scale_norm, proj_bias, attn_drop, norm_layer: timm ``Attention``'s keywords; ``attn_drop``
            only for a mechanism that forms weights (softmax attention).
        device, dtype: of the parameters, as for torch's layers.

    Shape:
        queries (B, L, d_input), keys (B, S, d_input), values (B, S, d_input) -> (B, L, d_output). ``StateT`` is the
        type of the recurrent state.

    Example:
        >>> import torch, attnbook
        >>> layer = attnbook.SoftmaxAttention(32, 64, 16, n_heads=4)  # 32 -> 4 heads of 16 -> 16
        >>> queries, memory = torch.randn(2, 5, 32), torch.randn(2, 9, 32)
        >>> layer(queries, memory).shape  # cross-attention: 5 queries over 9 keys and values
        torch.Size([2, 5, 16])
    """

    #: The heads pair query i with key i, so queries and keys need one length (L == S).
    same_length: bool = False
    #: Why, for the message when they differ.
    same_length_reason: str = ""
    #: Every forward is causal (the constructor's ``causal``; ``is_causal=True`` makes one call causal).
    causal: bool = False
    #: The mechanism forms attention weights that ``attn_drop`` can drop (softmax attention).
    has_weights: bool = False

    def __init__(
        self,
        d_input: int,
        d_model: int | None = None,
        d_output: int | None = None,
        n_heads: int | None = None,
        drop_out: float = 0.0,
        *,
        num_heads: int | None = None,
        qkv_bias: bool = True,
        qk_norm: bool = False,
        scale_norm: bool = False,
        proj_bias: bool = True,
        attn_drop: float = 0.0,
        proj_drop: float | None = None,
        norm_layer: Callable[..., nn.Module] | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ):
        super().__init__()
        name = type(self).__name__
        d_input = check_int(d_input, "d_input", name=name, minimum=1)
        d_model = d_input if d_model is None else check_int(d_model, "d_model", name=name, minimum=1)
        d_output = d_input if d_output is None else check_int(d_output, "d_output", name=name, minimum=1)
        check_same_value(n_heads, num_heads, "n_heads", "num_heads", name=name, why=" (num_heads is timm's name)")
        heads = n_heads if n_heads is not None else num_heads
        n_heads = check_int(heads, "n_heads", name=name, minimum=1, why=" (or timm's num_heads)")
        check_divisible(d_model, n_heads, name=name, total_arg="d_model", parts_arg="n_heads")
        if proj_drop is not None:
            drop_out = proj_drop
        drop_out = check_probability(drop_out, "drop_out" if proj_drop is None else "proj_drop", name=name)
        self.attn_drop = check_probability(attn_drop, "attn_drop", name=name)
        if not self.has_weights:
            why = " (this mechanism never forms attention weights to drop)"
            check_choice(float(self.attn_drop), "attn_drop", (0.0,), name=name, why=why)
        self.d_input, self.d_model, self.d_output, self.n_heads = d_input, d_model, d_output, n_heads
        factory = check_factory(device, dtype, name=name)
        bias = check_bool(qkv_bias, "qkv_bias", name=name)
        self.query_projection = nn.Linear(d_input, d_model, bias=bias, **factory)
        self.key_projection = nn.Linear(d_input, d_model, bias=bias, **factory)
        self.value_projection = nn.Linear(d_input, d_model, bias=bias, **factory)
        self.out_projection = nn.Linear(
            d_model, d_output, bias=check_bool(proj_bias, "proj_bias", name=name), **factory
        )
        self.dropout = nn.Dropout(drop_out)
        norm = nn.LayerNorm if norm_layer is None else norm_layer
        head = d_model // n_heads
        qk = check_bool(qk_norm, "qk_norm", name=name)
        self.q_norm = check_norm_layer(norm, head, name=name, **factory) if qk else nn.Identity()
        self.k_norm = check_norm_layer(norm, head, name=name, **factory) if qk else nn.Identity()
        merged = check_bool(scale_norm, "scale_norm", name=name)
        self.norm = check_norm_layer(norm, d_model, name=name, **factory) if merged else nn.Identity()

    def reset_parameters(self) -> None:
        """Draw the projections again (torch's initialisation of ``nn.Linear``) and reset the norms."""
        for layer in self.modules():
            if layer is not self and hasattr(layer, "reset_parameters"):
                reset = cast(Callable[[], None], layer.reset_parameters)  # torch types it as Tensor | Module
                reset()

    def extra_repr(self) -> str:
        return f"n_heads={self.n_heads}"

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        B, L, _ = x.shape
        return x.view(B, L, self.n_heads, -1).transpose(1, 2)  # (B, H, L, d_model / H)

    def _out(self, x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """(B, H, L, D) heads -> (B, L, d_output): merge, project (without rounding to float16 first), dropout."""
        B, H, L, D = x.shape
        x = self.norm(x.transpose(1, 2).reshape(B, L, H * D))  # (B, L, d_model)
        y: torch.Tensor = self.dropout(linear_in_range(self.out_projection, x, dtype))  # (B, L, d_output)
        return y

    @overload
    def forward(
        self, queries: Tensor, keys: Tensor | None = ..., values: Tensor | None = ..., *,
        initial_state: StateT | None = ..., output_final_state: Literal[False] = ..., **options: Unpack[_Options],
    ) -> Tensor: ...  # fmt: skip
    @overload
    def forward(
        self, queries: Tensor, keys: Tensor | None = ..., values: Tensor | None = ..., *,
        initial_state: StateT | None = ..., output_final_state: Literal[True], **options: Unpack[_Options],
    ) -> tuple[Tensor, StateT]: ...  # fmt: skip
    @overload
    def forward(
        self, queries: Tensor, keys: Tensor | None = ..., values: Tensor | None = ..., *,
        initial_state: StateT | None = ..., output_final_state: bool, **options: Unpack[_Options],
    ) -> Tensor | tuple[Tensor, StateT]: ...  # fmt: skip

    def forward(
        self,
        queries: torch.Tensor,
        keys: torch.Tensor | None = None,
        values: torch.Tensor | None = None,
        *,
        attn_mask: torch.Tensor | None = None,
        key_padding_mask: torch.Tensor | None = None,
        is_causal: bool = False,
        initial_state: StateT | None = None,
        output_final_state: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, StateT]:
        """Attention of ``queries`` (B, L, d_input) over ``keys`` and ``values`` (B, S, d_input) -> (B, L, d_output).

        ``values`` defaults to ``keys``, ``keys`` to ``queries`` (self-attention). ``attn_mask``: as in
        ``scaled_dot_product_attention``, for mechanisms that form scores; ``key_padding_mask``: (B, S) bool, True =
        padding; ``is_causal``: position i attends to positions <= i. Causal self-attention only: ``initial_state``, the
        state of the tokens before, and ``output_final_state``, which returns ``(output, state)``.
        """
        name = type(self).__name__
        # self-attention: layer(x), or nn.MultiheadAttention's idiom layer(x, x, x) with the same tensor (there a
        # padded position must not receive flow either, or Flow-Attention's real outputs would change)
        self_attention = keys is None or (keys is queries and (values is None or values is queries))
        keys = queries if keys is None else keys
        values = keys if values is None else values
        check_layer_inputs(
            queries,
            keys,
            values,
            name=name,
            d_input=self.d_input,
            like=self.query_projection.weight,
            same_length=self.same_length,
            why=self.same_length_reason,
        )
        causal = check_is_causal(is_causal, name=name) or self.causal
        output_final_state = check_bool(output_final_state, "output_final_state", name=name)
        check_state_call(causal, initial_state, output_final_state, name=name, self_attention=self_attention)
        q = self.q_norm(self._split(self.query_projection(queries)))  # (B, H, L, D)
        k = self.k_norm(self._split(self.key_projection(keys)))  # (B, H, S, D)
        v = self._split(self.value_projection(values))  # (B, H, S, D)
        result = self.attend(
            q,
            k,
            v,
            attn_mask=attn_mask,
            key_padding_mask=key_padding_mask,
            self_attention=self_attention,
            is_causal=causal,
            initial_state=initial_state,
            output_final_state=output_final_state,
        )  # (B, H, L, D) in q's dtype or a wider (accumulation) one [, state]
        if output_final_state:
            x, state = cast("tuple[torch.Tensor, StateT]", result)
            return self._out(x, q.dtype), state
        return self._out(cast(torch.Tensor, result), q.dtype)

    if TYPE_CHECKING:  # layer(...) is typed as forward(...) (torch types nn.Module.__call__ as returning Any)
        __call__ = forward

    def step(self, x_t: torch.Tensor, state: StateT | None = None) -> tuple[torch.Tensor, StateT]:
        """One token of causal self-attention: x_t (B, d_input) after the tokens summed up in ``state`` (None before
        the first) -> ``(y_t (B, d_output), new state)``, as one causal forward over the sequence gives it."""
        name = f"{type(self).__name__}.step"
        check_step_token(x_t, "x_t", name=name, width=self.d_input, like=self.query_projection.weight)
        B = x_t.shape[0]
        q = self.q_norm(self.query_projection(x_t).view(B, self.n_heads, -1))  # (B, H, D)
        k = self.k_norm(self.key_projection(x_t).view(B, self.n_heads, -1))  # (B, H, D)
        v = self.value_projection(x_t).view(B, self.n_heads, -1)  # (B, H, Dv)
        out, state = self.attend_step(q, k, v, state)  # (B, H, Dv)
        y = linear_in_range(self.out_projection, self.norm(out.reshape(B, -1)), q.dtype)  # (B, d_output)
        return self.dropout(y), state

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
        initial_state: StateT | None = None,
        output_final_state: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, StateT]:
        """Per-head attention: q (B,H,L,D), k (B,H,S,D), v (B,H,S,D) -> (B,H,L,D) [, final state]; ``is_causal=None``:
        the layer's own ``causal``; the rest as in :meth:`forward` (``self_attention``: keys are the queries')."""
        raise NotImplementedError

    def attend_step(
        self, q_t: torch.Tensor, k_t: torch.Tensor, v_t: torch.Tensor, state: StateT | None
    ) -> tuple[torch.Tensor, StateT]:
        """One token: q_t, k_t (B, H, D), v_t (B, H, Dv) and the state before it -> (out (B, H, Dv), new state)."""
        raise NotImplementedError


class RecurrentAttention(nn.Module):
    """Causal self-attention whose heads carry a matrix state S (B, H, D, D): the layers of chapter 8.

    As flash-linear-attention's layers: ``Layer(dim, num_heads)`` projects x (B, N, C) to H heads of D = C / H, computes
    a gate from x (:meth:`gates`), lets the mechanism mix them (:meth:`mix`, :meth:`mix_step`), merges the heads and
    projects out. ``forward(x, initial_state=S, output_final_state=True)`` returns ``(y, S)``; a padded token
    (``key_padding_mask`` (B, N) True) is read as zeros, whatever it holds, and leaves the state as it was
    (:meth:`neutral`).

    Example:
        >>> import torch, attnbook
        >>> layer = attnbook.DeltaRuleAttention(16, num_heads=2)  # a RecurrentAttention
        >>> y, S = layer(torch.randn(3, 7, 16), output_final_state=True)
        >>> y.shape, S.shape  # the state: (B, H, D, D)
        (torch.Size([3, 7, 16]), torch.Size([3, 2, 8, 8]))
    """

    causal = True

    def __init__(
        self,
        dim: int,
        num_heads: int | None = None,
        *,
        n_heads: int | None = None,
        qkv_bias: bool = False,
        proj_bias: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ):
        super().__init__()
        name = type(self).__name__
        dim = check_int(dim, "dim", name=name, minimum=1)
        check_same_value(n_heads, num_heads, "n_heads", "num_heads", name=name, why=" (num_heads is timm's name)")
        heads = num_heads if num_heads is not None else n_heads
        self.n_heads = check_int(8 if heads is None else heads, "num_heads", name=name, minimum=1)
        check_divisible(dim, self.n_heads, name=name, total_arg="dim", parts_arg="num_heads")
        self.dim, self.head_dim = dim, dim // self.n_heads
        factory = check_factory(device, dtype, name=name)
        bias = check_bool(qkv_bias, "qkv_bias", name=name)
        self.query_projection = nn.Linear(dim, dim, bias=bias, **factory)
        self.key_projection = nn.Linear(dim, dim, bias=bias, **factory)
        self.value_projection = nn.Linear(dim, dim, bias=bias, **factory)
        self.out_projection = nn.Linear(dim, dim, bias=check_bool(proj_bias, "proj_bias", name=name), **factory)

    def reset_parameters(self) -> None:
        """Draw every projection's weights and biases again (torch's initialisation of ``nn.Linear``)."""
        for layer in self.modules():
            if isinstance(layer, nn.Linear):
                layer.reset_parameters()

    def extra_repr(self) -> str:
        return f"dim={self.dim}, num_heads={self.n_heads}"

    def heads(self, x: torch.Tensor) -> torch.Tensor:
        """Split the last dimension into heads: (B, N, C) -> (B, H, N, D), one token's (B, C) -> (B, H, D)."""
        if x.dim() == 2:
            return x.view(x.shape[0], self.n_heads, -1)
        return x.view(x.shape[0], x.shape[1], self.n_heads, -1).transpose(1, 2)

    def qk(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The queries and keys the mechanism reads (default: the projections as they are)."""
        return q, k

    def gates(self, x: torch.Tensor) -> torch.Tensor:
        """The gate of every head and token of x (B, N, C), or of one token x_t (B, C)."""
        raise NotImplementedError

    def mix(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gate: torch.Tensor, state: Any, final: bool
    ) -> Any:
        """The mechanism on (B, H, N, D) heads from S (None: zeros): (B, H, N, D) [, S with ``final``]."""
        raise NotImplementedError

    def mix_step(
        self, q_t: torch.Tensor, k_t: torch.Tensor, v_t: torch.Tensor, gate_t: torch.Tensor, state: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The mechanism's recurrent step on (B, H, D) heads: (out (B, H, D), S)."""
        raise NotImplementedError

    def neutral(self, gate: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        """The gate with padded tokens (``keep`` (B, 1, N) False) set to leave the state as it was."""
        raise NotImplementedError

    def _project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        q, k = self.qk(self.heads(self.query_projection(x)), self.heads(self.key_projection(x)))
        return q, k, self.heads(self.value_projection(x)), self.gates(x)

    def forward(
        self,
        x: torch.Tensor,
        *,
        key_padding_mask: torch.Tensor | None = None,
        is_causal: bool = True,
        initial_state: torch.Tensor | None = None,
        output_final_state: bool = False,
    ) -> Any:
        """x (B, N, C) -> (B, N, C), causal; ``(y, S)`` with ``output_final_state`` (S (B, H, D, D))."""
        name = type(self).__name__
        check_layer_inputs(x, x, x, name=name, d_input=self.dim, like=self.query_projection.weight)
        why = " (this mechanism is causal only: its state is written token by token)"
        check_choice(check_is_causal(is_causal, name=name), "is_causal", (True,), name=name, why=why)
        output_final_state = check_bool(output_final_state, "output_final_state", name=name)
        keep = None
        if key_padding_mask is not None:
            pad = check_key_padding_mask(key_padding_mask, x.shape[0], x.shape[1], name=name).to(x.device)
            keep = ~pad[:, None, :]  # (B, 1, N): True = a real token
            x = torch.where(keep.transpose(1, 2), x, 0.0)  # whatever a padded token holds (NaN) goes nowhere
        q, k, v, gate = self._project(x)
        if keep is not None:
            k, v = k * keep[..., None], v * keep[..., None]
            gate = self.neutral(gate, keep)
        result = self.mix(q, k, v, gate, initial_state, output_final_state)
        out, state = result if output_final_state else (result, None)
        B, H, N, D = out.shape
        y = linear_in_range(self.out_projection, out.transpose(1, 2).reshape(B, N, H * D), q.dtype)  # (B, N, C)
        return (y, state) if output_final_state else y

    if TYPE_CHECKING:
        __call__ = forward

    def step(self, x_t: torch.Tensor, state: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """One token x_t (B, C) after the tokens summed up in S (None before the first): ((B, C), S)."""
        name = f"{type(self).__name__}.step"
        check_step_token(x_t, "x_t", name=name, width=self.dim, like=self.query_projection.weight)
        q, k, v, gate = self._project(x_t)  # (B, H, D) each, the gate (B, H[, D])
        out, state = self.mix_step(q, k, v, gate, state)  # (B, H, D)
        return linear_in_range(self.out_projection, out.reshape(out.shape[0], -1), q.dtype), state
