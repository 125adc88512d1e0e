"""The module family shared by softmax, linear, flow and mobile attention.

Every module of the family has the constructor ``(d_input, d_model, d_output, n_heads, drop_out, ...)`` and
the parameters ``query_projection``, ``key_projection``, ``value_projection`` and ``out_projection``, as in the
Flowformer / Mobile-Attention reference code, so the modules are drop-in replacements for one another and
load the reference checkpoints unchanged. A subclass only says how the heads attend (:meth:`attend`).

The defaults of ``drop_out`` differ on purpose: each is that of the mechanism's published layer, so that a
published checkpoint, loaded with its default arguments, behaves as it did. Flow-Attention and
Mobile-Attention: 0.05 (thuml's ``Flow_Attention`` and ``Mobile_Attention``); softmax and linear attention:
0.0 (torch's ``nn.MultiheadAttention`` and fast-transformers' attention layer default to no dropout). Pass
``drop_out`` explicitly when swapping one mechanism for another; :data:`attnbook.mechanisms.MECHANISMS`
builds every layer with ``drop_out=0.0``.

Under ``torch.autocast`` a layer behaves like torch's layers: the projections run in the autocast dtype, the
attention accumulates in float32, and the output is in the autocast dtype. Inputs must have the dtype and
device of the parameters (under autocast any floating dtype but float64 is accepted, as ``nn.Linear`` does).
"""

from __future__ import annotations

import torch
from torch import nn

from ._checks import check_divisible, check_int, check_layer_inputs, check_probability
from ._runtime import linear_in_range

__all__ = ["ProjectedAttention"]


class ProjectedAttention(nn.Module):
    """Project, split into heads, attend, merge heads, project out, dropout.

    Args:
        d_input: width of the incoming queries, keys and values.
        d_model: width of the projected queries, keys and values, split into ``n_heads`` heads of
            ``d_model // n_heads``.
        d_output: width of the output.
        n_heads: number of heads H.
        drop_out: dropout probability applied after the output projection.

    Shape:
        queries (B, L, d_input), keys (B, S, d_input), values (B, S, d_input) -> (B, L, d_output);
        ``layer(x)`` with x (B, L, d_input) is self-attention. Every size must be at least 1.
    """

    #: The heads pair query i with key i, so queries and keys need one length (L == S).
    same_length: bool = False
    #: Why, for the message when they differ.
    same_length_reason: str = ""

    def __init__(self, d_input: int, d_model: int, d_output: int, n_heads: int, drop_out: float = 0.0):
        super().__init__()
        name = type(self).__name__
        d_input = check_int(d_input, "d_input", name=name, minimum=1)
        d_model = check_int(d_model, "d_model", name=name, minimum=1)
        d_output = check_int(d_output, "d_output", name=name, minimum=1)
        n_heads = check_int(n_heads, "n_heads", name=name, minimum=1)
        check_divisible(d_model, n_heads, name=name, total_arg="d_model", parts_arg="n_heads")
        drop_out = check_probability(drop_out, "drop_out", name=name)
        self.d_input, self.d_model, self.d_output, self.n_heads = d_input, d_model, d_output, n_heads
        self.query_projection = nn.Linear(d_input, d_model)
        self.key_projection = nn.Linear(d_input, d_model)
        self.value_projection = nn.Linear(d_input, d_model)
        self.out_projection = nn.Linear(d_model, d_output)
        self.dropout = nn.Dropout(drop_out)

    def extra_repr(self) -> str:
        return f"n_heads={self.n_heads}"

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        B, L, _ = x.shape
        return x.view(B, L, self.n_heads, -1).transpose(1, 2)  # (B, H, L, d_model / H)

    def forward(
        self, queries: torch.Tensor, keys: torch.Tensor | None = None, values: torch.Tensor | None = None, **kwargs
    ) -> torch.Tensor:
        """Attention of ``queries`` over ``keys`` / ``values``; ``layer(x)`` is self-attention (keys = values = x).

        ``values`` defaults to ``keys``, and ``keys`` to ``queries``.
        """
        keys = queries if keys is None else keys
        values = keys if values is None else values
        check_layer_inputs(
            queries,
            keys,
            values,
            name=type(self).__name__,
            d_input=self.d_input,
            like=self.query_projection.weight,
            same_length=self.same_length,
            why=self.same_length_reason,
        )
        q = self._split(self.query_projection(queries))  # (B, H, L, D)
        k = self._split(self.key_projection(keys))  # (B, H, S, D)
        v = self._split(self.value_projection(values))  # (B, H, S, D)
        x = self.attend(q, k, v, **kwargs)  # (B, H, L, D), in q's dtype or a wider (accumulation) one
        B, H, L, D = x.shape
        x = x.transpose(1, 2).reshape(B, L, H * D)  # (B, L, d_model)
        # The attention output may exceed float16's range where the projected output does not.
        return self.dropout(linear_in_range(self.out_projection, x, q.dtype))  # (B, L, d_output)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kwargs) -> torch.Tensor:
        """Per-head attention: q (B,H,L,D), k (B,H,S,D), v (B,H,S,D) -> (B,H,L,D)."""
        raise NotImplementedError
