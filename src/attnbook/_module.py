"""The module family shared by softmax, linear, flow and mobile attention.

Every module of the family has the constructor ``(d_input, d_model, d_output, n_heads, drop_out, ...)`` and
the parameters ``query_projection``, ``key_projection``, ``value_projection`` and ``out_projection``, as in the
Flowformer / Mobile-Attention reference code, so the modules are drop-in replacements for one another and
load the reference checkpoints unchanged. A subclass only says how the heads attend (:meth:`attend`).
"""

from __future__ import annotations

import torch
from torch import nn

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
        ``layer(x)`` with x (B, L, d_input) is self-attention.
    """

    def __init__(self, d_input: int, d_model: int, d_output: int, n_heads: int, drop_out: float = 0.0):
        super().__init__()
        for label, value in (("d_input", d_input), ("d_model", d_model), ("d_output", d_output), ("n_heads", n_heads)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{type(self).__name__}: {label} must be a positive int, got {value!r}")
        if d_model % n_heads:
            raise ValueError(f"{type(self).__name__}: d_model={d_model} is not divisible by n_heads={n_heads}")
        if not 0.0 <= drop_out < 1.0:
            raise ValueError(f"{type(self).__name__}: drop_out must be in [0, 1), got {drop_out}")
        self.d_input, self.d_model, self.d_output, self.n_heads = d_input, d_model, d_output, n_heads
        self.query_projection = nn.Linear(d_input, d_model)
        self.key_projection = nn.Linear(d_input, d_model)
        self.value_projection = nn.Linear(d_input, d_model)
        self.out_projection = nn.Linear(d_model, d_output)
        self.dropout = nn.Dropout(drop_out)

    def extra_repr(self) -> str:
        return f"n_heads={self.n_heads}"

    def _check_inputs(self, queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> None:
        name = type(self).__name__
        shapes = f"queries {tuple(queries.shape)}, keys {tuple(keys.shape)}, values {tuple(values.shape)}"
        if queries.dim() != 3 or keys.dim() != 3 or values.dim() != 3:
            raise ValueError(f"{name}: expected (B, L, d_input) tensors, got {shapes}")
        if not (queries.shape[-1] == keys.shape[-1] == values.shape[-1] == self.d_input):
            raise ValueError(f"{name}: last dimension must be d_input={self.d_input}, got {shapes}")
        if not (queries.shape[0] == keys.shape[0] == values.shape[0]):
            raise ValueError(f"{name}: batch sizes differ: {shapes}")
        if keys.shape[1] != values.shape[1]:
            raise ValueError(f"{name}: keys and values must have the same length S: {shapes}")

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
        self._check_inputs(queries, keys, values)
        q = self._split(self.query_projection(queries))  # (B, H, L, D)
        k = self._split(self.key_projection(keys))  # (B, H, S, D)
        v = self._split(self.value_projection(values))  # (B, H, S, D)
        x = self.attend(q, k, v, **kwargs)  # (B, H, L, D)
        B, H, L, D = x.shape
        x = x.transpose(1, 2).reshape(B, L, H * D)  # (B, L, d_model)
        return self.dropout(self.out_projection(x))  # (B, L, d_output)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kwargs) -> torch.Tensor:
        """Per-head attention: q (B,H,L,D), k (B,H,S,D), v (B,H,S,D) -> (B,H,L,D)."""
        raise NotImplementedError
