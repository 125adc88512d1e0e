"""Softmax (scaled dot-product) attention: chapter 1.

    out_i = sum_j softmax_j(q_i . k_j * scale) v_j,   scale = 1 / sqrt(D)

Vaswani et al., "Attention Is All You Need", NeurIPS 2017. The fast path is torch's
``scaled_dot_product_attention`` (flash / memory-efficient kernels where they apply); the literal
definition, with the N x M matrix written out, is :func:`attnbook.reference.softmax_attention`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ._checks import check_bool_mask, check_qkv
from ._module import ProjectedAttention

__all__ = ["softmax_attention", "SoftmaxAttention"]


def softmax_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    mask: torch.Tensor | None = None,
    scale: float | None = None,
) -> torch.Tensor:
    """Scaled dot-product attention, with masks, through torch's SDPA.

    ``out_i = sum_j softmax_j(scale * q_i . k_j) v_j`` over the keys j that query i may attend to.

    Cost: O(B H N M D) time; O(B H N M) memory for the weights on backends that materialise them
    (the fused flash / memory-efficient kernels need only O(B H N) extra memory).

    Args:
        q: queries (B, H, N, D).
        k: keys (B, H, M, D).
        v: values (B, H, M, Dv).
        causal: query i attends only to keys j <= i (top-left aligned when N != M, as in SDPA).
        mask: bool, broadcastable to (B, H, N, M); True = may attend. Combined with ``causal``.
        scale: multiplies the scores; defaults to 1 / sqrt(D).

    Returns:
        (B, H, N, Dv) in the dtype of the inputs. A query with no key it may attend to gets zeros
        (and zero gradients), never NaN.
    """
    B, H, N, M, D, _ = check_qkv(q, k, v, name="softmax_attention")
    if scale is not None and not (isinstance(scale, (int, float)) and scale > 0):
        raise ValueError(f"softmax_attention: scale must be a positive number, got {scale!r}")
    if mask is None:
        # The fused kernels handle the causal mask themselves; every row has key 0, so none is empty.
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
    allowed = check_bool_mask(mask, (B, H, N, M), name="softmax_attention")
    if causal:
        allowed = allowed & torch.ones(N, M, dtype=torch.bool, device=q.device).tril()
    # A fully masked row would be softmax over nothing (NaN): let it attend to everything, then zero it.
    has_key = allowed.any(dim=-1, keepdim=True)  # (B, H, N, 1)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed | ~has_key, scale=scale)
    return out * has_key.to(out.dtype)


class SoftmaxAttention(ProjectedAttention):
    """Multi-head softmax attention with the module family's projections.

    Args:
        d_input, d_model, d_output, n_heads, drop_out: see :class:`attnbook.ProjectedAttention`
            (dropout is applied after the output projection).
        causal: each position attends only to itself and earlier positions.

    Shape:
        ``forward(queries, keys, values, mask=None)``: (B, L, d_input), (B, S, d_input), (B, S, d_input)
        -> (B, L, d_output); ``mask`` as in :func:`softmax_attention`.
    """

    def __init__(
        self, d_input: int, d_model: int, d_output: int, n_heads: int, drop_out: float = 0.0, causal: bool = False
    ):
        super().__init__(d_input, d_model, d_output, n_heads, drop_out)
        self.causal = causal

    def forward(
        self,
        queries: torch.Tensor,
        keys: torch.Tensor | None = None,
        values: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        return super().forward(queries, keys, values, mask=mask)

    def attend(self, q, k, v, mask=None):
        return softmax_attention(q, k, v, causal=self.causal, mask=mask)
