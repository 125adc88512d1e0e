"""Softmax (scaled dot-product) attention: chapter 1.

    out_i = sum_j softmax_j(q_i . k_j * scale) v_j,   scale = 1 / sqrt(D)

Vaswani et al., "Attention Is All You Need", NeurIPS 2017. The fast path is torch's
``scaled_dot_product_attention`` (flash / memory-efficient kernels where they apply); the literal
definition, with the N x M matrix written out, is :func:`attnbook.reference.softmax_attention`.

Masked positions and non-finite numbers (the rule every masked entry point of the package follows):

* A key that *no* query of its (batch, head) may attend to -- a padding position -- contributes nothing,
  whatever its key and value hold (NaN and inf included): it is replaced by zeros before any arithmetic, and
  gets zero gradients (:func:`zero_unseen_keys`). Zeroing is exact only for such keys: a key masked for some
  queries but visible to others must keep its value for those others.
* A query with no key it may attend to returns zeros (and zero gradients), whatever it holds.
* A NaN or inf in a *visible* input (a query with something to attend to, a key or value some query may
  attend to) is never hidden: the outputs of the queries that attend to it are NaN (or inf), and the fused
  kernels, which multiply zero weights by the values of masked keys, may carry it to other queries of the
  same (batch, head) as well. It is never replaced by zeros.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ._checks import check_bool, check_bool_mask, check_qkv, check_scale
from ._module import ProjectedAttention

__all__ = ["softmax_attention", "SoftmaxAttention", "zero_unseen_keys"]


def zero_unseen_keys(k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """k and v with every key that no query may attend to replaced by zeros.

    ``allowed`` (..., N, M) bool, broadcastable against the scores (B, H, N, M); k (B, H, M, D), v (B, H, M, Dv).
    A masked key's score is excluded from the softmax, but the weighted sum still multiplies its weight 0 by its
    value (0 * NaN = NaN), and additive masks add -inf to its score (NaN + -inf = NaN): zeroing the keys that
    nobody sees is what makes garbage in padding harmless. Cost O(B H (N M + M (D + Dv))).
    """
    seen = allowed.any(dim=-2).unsqueeze(-1)  # (..., M, 1): some query may attend to key j
    return torch.where(seen, k, 0.0), torch.where(seen, v, 0.0)


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
        mask: bool, broadcastable to (B, H, N, M); True = may attend. Combined with ``causal``. Keys that no
            query may attend to contribute nothing, whatever they hold (module docstring).
        scale: multiplies the scores; defaults to 1 / sqrt(D). A positive number float32 holds as a normal
            number (about 1.2e-38 to 3.4e38).

    Returns:
        (B, H, N, Dv) in the dtype of the inputs (under autocast: the autocast dtype, as SDPA). A query with no
        key it may attend to gets zeros (and zero gradients), never NaN. SDPA's kernels form the scores and
        the softmax in float32 for half-precision inputs. Twice differentiable only on SDPA's math backend
        (``torch.nn.attention.sdpa_kernel(SDPBackend.MATH)``); the fused kernels raise on a second derivative.
    """
    name = "softmax_attention"
    B, H, N, M, _, _ = check_qkv(q, k, v, name=name)
    causal = check_bool(causal, "causal", name=name)
    scale = check_scale(scale, name=name)
    if mask is not None:
        mask = check_bool_mask(mask, (B, H, N, M), name=name).to(q.device)  # (b, h, n, M), 1 or full size
    return _attend(q, k, v, causal, mask, scale)


def _attend(q, k, v, causal: bool, mask: torch.Tensor | None, scale: float | None) -> torch.Tensor:
    """SDPA with the package's rules for masks: keys nobody sees are zeroed, empty rows are zero, and a query
    with a NaN or inf that attends to something gives a NaN row (torch's CPU kernel returns zeros for it)."""
    if mask is None:
        # The fused kernels handle the causal mask themselves; every row has key 0, so none is empty.
        out = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
        return _keep_broken_queries(q, out, k.shape[-2])  # (B, H, N, Dv)
    allowed = mask  # (b, h, n, M)
    if causal:
        N, M = q.shape[-2], k.shape[-2]
        allowed = allowed & torch.ones(N, M, dtype=torch.bool, device=q.device).tril()  # (b, h, N, M)
    has_key = allowed.any(dim=-1, keepdim=True)  # (b, h, n, 1)
    k, v = zero_unseen_keys(k, v, allowed)
    # A fully masked row would be softmax over nothing (NaN): let it attend to everything, then zero it.
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed | ~has_key, scale=scale)
    return torch.where(has_key, _keep_broken_queries(q, out, k.shape[-2]), 0.0)  # (B, H, N, Dv)


# Below this many keys, torch's CPU SDPA kernel returns zeros for a query holding a NaN (measured with torch
# 2.13: its vectorised loop over keys propagates the NaN, the scalar tail for M < 8 does not); with more keys
# the kernels propagate it themselves, and the tests check both sides of the bound.
_SHORT_KEYS = 64


def _keep_broken_queries(q: torch.Tensor, out: torch.Tensor, M: int) -> torch.Tensor:
    """``out`` with the row of every query holding a NaN or inf set to NaN, for short key lengths M (above,
    SDPA does it). Elementwise, no host sync; O(B H N D), next to the attention's O(B H N M D)."""
    if M >= _SHORT_KEYS:
        return out
    broken = ~torch.isfinite(q.detach()).all(dim=-1, keepdim=True)  # (B, H, N, 1)
    return torch.where(broken, float("nan"), out)


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
        self.causal = check_bool(causal, "causal", name=type(self).__name__)

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
