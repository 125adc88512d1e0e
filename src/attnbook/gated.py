"""Gated linear attention: linear attention whose state forgets, at a fixed rate or as the data decide (chapter 8).

One head carries a matrix state S (D x Dv). Each token first decays it, row by row, then writes its key-value
pair, and its query reads the result::

    S_t = diag(exp(g_t)) S_{t-1} + k_t v_t^T,      o_t = S_t^T (scale q_t)

``g_t`` holds log-decays (<= 0, so every factor exp(g_t) is in [0, 1]; -inf forgets everything): one per key
dimension, (B, H, N, D), as in gated linear attention (Yang et al., "Gated Linear Attention Transformers with
Hardware-Efficient Training", ICML 2024), or one per head, (B, H, N), which covers RetNet's fixed decay (Sun et
al., "Retentive Network", 2023) and Mamba-2's scalar gate (Dao and Gu, "Transformers are SSMs", ICML 2024). With
g = 0 it is causal linear attention without a feature map or a normaliser.

Conventions are flash-linear-attention's (``naive_recurrent_gla``): no feature map, no normaliser, ``scale``
D^-1/2 by default, S of shape (B, H, D, Dv), ``initial_state=`` / ``output_final_state=``. RetNet's xpos rotation
and group norm, and GLA's output gate and low-rank gate projection, belong to their layers; not to
:class:`GatedLinearAttention`.

The chunked form (:func:`chunked_gated_product`), chapter 2's chunks with decay: inside a chunk of ell positions,
with the log-decay between positions seg[i, j] = g_{j+1} + ... + g_i (j <= i),

    o_i = sum_{j <= i in the chunk} (sum_d q_id k_jd exp(seg[i, j, d])) v_j  +  (q_i * exp(g_1 + ... + g_i))^T S_c
    S_{c+1} = diag(exp(g_1 + ... + g_ell)) S_c + sum_j (k_j * exp(g_{j+1} + ... + g_ell)) v_j^T

Every exponent is a sum of log-decays, formed by cumulative sums without a subtraction, so it is <= 0: nothing
overflows, and g = -inf gives exact zeros. Cost: O(N ell (D + Dv) + N D Dv) time, and O(N ell D) memory for
vector gates (O(N ell) for one per head); the state passes from chunk to chunk in a loop. Vector gates weigh each
pair one decay per key dimension, not by a matrix product, hence short chunks (``chunk_size`` 8).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ._checks import check_bool, check_choice, check_gated, check_int, check_number
from ._module import RecurrentAttention
from ._runtime import accumulation_dtype, autocast_disabled, chunk_count, chunk_length

__all__ = [
    "gated_linear_attention",
    "gated_linear_attention_step",
    "chunked_gated_product",
    "GatedLinearAttention",
    "retnet_log_decays",
]


def _segment_sums(g: torch.Tensor) -> torch.Tensor:
    """seg[..., x, j, i] = g_{j+1} + ... + g_i (the x-th entries) for j <= i, 0 on the diagonal and -inf for j > i,
    from g (..., L, X) -> (..., X, L, L): a cumulative sum, not a difference of prefix sums, so -inf stays -inf."""
    L = g.shape[-2]
    after = torch.ones(L, L, dtype=torch.bool, device=g.device).triu(1)  # (L, L): [j, i] with i > j
    steps = g.transpose(-2, -1).unsqueeze(-2).expand(*g.shape[:-2], g.shape[-1], L, L)  # (..., X, L, L): g_i
    seg = steps.masked_fill(~after, 0.0).cumsum(-1)  # (..., X, L, L): the sum of g_s over j < s <= i
    return seg.masked_fill(after.transpose(0, 1), float("-inf"))  # j > i: no path from a later key


def chunked_gated_product(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, chunk_size: int, state: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The chunked form of the module docstring: q (already scaled), k (B, H, N, D), v (B, H, N, Dv), log-decays g
    (B, H, N, X), X = D or 1, and S (B, H, D, Dv), in one dtype -> (o (B, H, N, Dv), the state after the last token)."""
    N = q.shape[-2]
    ell = chunk_length(N, chunk_size)
    n = chunk_count(N, ell)  # chunks, the last padded: no decay (g = 0) and no write (k = 0) there
    qc, kc, vc, gc = (
        F.pad(x, (0, 0, 0, n * ell - N)).reshape(*x.shape[:-2], n, ell, x.shape[-1]) for x in (q, k, v, g)
    )  # (B, H, n, ell, .)
    decay = _segment_sums(gc).exp()  # (B, H, n, X, ell, ell): the decay from key j to query i in each chunk
    from_start = gc.cumsum(-2).exp()  # (B, H, n, ell, X): the decay from the chunk's start to i
    to_end = decay[..., -1].transpose(-2, -1)  # (B, H, n, ell, X): the decay from j to the chunk's end
    if g.shape[-1] == 1:  # one decay per head: the decays scale each score
        scores = (qc @ kc.transpose(-2, -1)) * decay[..., 0, :, :].transpose(-2, -1)  # (B, H, n, ell, ell)
    else:  # one per key dimension: they weigh each term of the dot product
        scores = torch.einsum("bhcid,bhcjd,bhcdji->bhcij", qc, kc, decay)  # (B, H, n, ell, ell)
    inside = scores @ vc  # (B, H, n, ell, Dv): the pairs j <= i of each chunk
    written = (kc * to_end).transpose(-2, -1) @ vc  # (B, H, n, D, Dv): what each chunk adds to the state
    kept = from_start[..., -1, :].unsqueeze(-1)  # (B, H, n, X, 1): the decay across each whole chunk
    reads = qc * from_start  # (B, H, n, ell, D): each query, decayed back to its chunk's start
    outs = []
    for inside_c, read_c, kept_c, written_c in zip(*(x.unbind(2) for x in (inside, reads, kept, written)), strict=True):
        outs.append(inside_c + read_c @ state)  # (B, H, ell, Dv): the chunk's own pairs and the carried state
        state = kept_c * state + written_c  # (B, H, D, Dv): carried to the next chunk
    return torch.cat(outs, dim=-2)[:, :, :N], state  # (B, H, N, Dv), (B, H, D, Dv)


def gated_linear_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    *,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    chunk_size: int = 8,
) -> Any:
    """Causal gated linear attention: S_t = diag(exp(g_t)) S_{t-1} + k_t v_t^T, o_t = S_t^T (scale q_t).

    Args:
        q, k, v: (B, H, N, D), (B, H, N, D), (B, H, N, Dv).
        g: log-decays <= 0, (B, H, N, D) (one per key dimension) or (B, H, N) (one per head).
        scale: multiplies q; default D^-1/2.
        initial_state: S before the first token, (B, H, D, Dv) in the accumulation dtype, or None for zeros.
        output_final_state: also return S after the last token.
        chunk_size: ell of the chunked form (the result does not depend on it beyond rounding).

    Returns:
        (B, H, N, Dv) in q's dtype (under autocast: the autocast dtype), or ``(output, S)``.

    Example:
        >>> import torch, attnbook
        >>> q, k, v = (torch.randn(1, 2, 10, 4) for _ in range(3))
        >>> g = torch.full((1, 2, 10), -0.1)  # every head forgets 10 % a token (RetNet-like)
        >>> out = attnbook.gated_linear_attention(q, k, v, g)
        >>> head, tail = (slice(0, 6), slice(6, 10))
        >>> _, S = attnbook.gated_linear_attention(*(x[:, :, head] for x in (q, k, v, g)), output_final_state=True)
        >>> tail = attnbook.gated_linear_attention(*(x[:, :, tail] for x in (q, k, v, g)), initial_state=S)
        >>> torch.allclose(tail, out[:, :, 6:], atol=1e-5)  # the state carries the first 6 tokens
        True
    """
    name = "gated_linear_attention"
    g, s, state, dtype = check_gated(q, k, v, g, initial_state, name=name, arg="g", vector=True, scale=scale)
    final = check_bool(output_final_state, "output_final_state", name=name)
    ell = check_int(chunk_size, "chunk_size", name=name, minimum=1)
    with autocast_disabled(q.device):
        acc = state.dtype
        g = (g if g.dim() == 4 else g.unsqueeze(-1)).to(acc)  # (B, H, N, X)
        out, S = chunked_gated_product(q.to(acc) * s, k.to(acc), v.to(acc), g, ell, state)
    return (out.to(dtype), S) if final else out.to(dtype)


def gated_linear_attention_step(
    q_t: torch.Tensor,
    k_t: torch.Tensor,
    v_t: torch.Tensor,
    g_t: torch.Tensor,
    state: torch.Tensor | None = None,
    *,
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token of gated linear attention, the recurrence itself: q_t, k_t (B, H, D), v_t (B, H, Dv), g_t (B, H, D)
    or (B, H), and S (B, H, D, Dv) before it (None: zeros). Returns (o_t (B, H, Dv), S after it).

    Example:
        >>> import torch, attnbook
        >>> q, k, v = (torch.randn(1, 2, 5, 4) for _ in range(3))
        >>> g = torch.full((1, 2, 5, 4), -0.5)  # every key dimension keeps exp(-0.5) = 61 % a token
        >>> S = None
        >>> for t in range(5):
        ...     o_t, S = attnbook.gated_linear_attention_step(q[:, :, t], k[:, :, t], v[:, :, t], g[:, :, t], S)
        >>> torch.allclose(o_t, attnbook.gated_linear_attention(q, k, v, g)[:, :, -1], atol=1e-5)
        True
    """
    name = "gated_linear_attention_step"
    g_t, s, S, dtype = check_gated(q_t, k_t, v_t, g_t, state, name=name, arg="g_t", vector=True, scale=scale, step=True)
    acc = S.dtype
    with autocast_disabled(q_t.device):
        decay = (g_t if g_t.dim() == 3 else g_t.unsqueeze(-1)).to(acc).exp().unsqueeze(-1)  # (B, H, D or 1, 1)
        S = decay * S + k_t.to(acc).unsqueeze(-1) * v_t.to(acc).unsqueeze(-2)  # (B, H, D, Dv)
        o_t = ((q_t.to(acc) * s).unsqueeze(-1) * S).sum(-2)  # (B, H, Dv): S^T (scale q)
    return o_t.to(dtype), S


def retnet_log_decays(n_heads: int) -> torch.Tensor:
    """RetNet's fixed decay per head, as log-decays (H,): log(1 - 2^(-5 - h)) for h = 0 .. H - 1 (Sun et al.,
    2023, Sec. 2.2), so head 0 forgets 3 % a token and later heads ever less."""
    return torch.log1p(-(2.0 ** (-5.0 - torch.arange(n_heads, dtype=torch.float64)))).float()


class GatedLinearAttention(RecurrentAttention):
    """Causal self-attention by :func:`gated_linear_attention`, with its decays from a fixed rate or from the input.

    ``decay="data"`` (GLA: g = logsigmoid(x W_g + b) / ``gate_normalizer``, one per key dimension and token; fla's
    ``gate_logit_normalizer`` 16 keeps a fresh layer's decays small) or ``"fixed"`` (RetNet:
    :func:`retnet_log_decays`, one per head). A padded token neither writes nor decays the state.
    ``GatedLinearAttention(dim, num_heads, ...)``; shapes and calls as :class:`attnbook.RecurrentAttention`.

    Example:
        >>> import torch, attnbook
        >>> layer = attnbook.GatedLinearAttention(32, num_heads=4)
        >>> x = torch.randn(2, 10, 32)
        >>> y, S = layer(x[:, :9], output_final_state=True)  # prefill 9 tokens
        >>> y_t, S = layer.step(x[:, 9], S)  # and the tenth
        >>> torch.allclose(y_t, layer(x)[:, 9], atol=1e-5)
        True
    """

    log_decays: Tensor  # "fixed": RetNet's log-decay per head, (H,)

    def __init__(
        self,
        dim: int,
        num_heads: int | None = None,
        *,
        n_heads: int | None = None,
        decay: str = "data",
        gate_normalizer: float = 16.0,
        qkv_bias: bool = False,
        proj_bias: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ):
        super().__init__(dim, num_heads, n_heads=n_heads, qkv_bias=qkv_bias, proj_bias=proj_bias, device=device,
                         dtype=dtype)  # fmt: skip
        name = type(self).__name__
        self.decay = check_choice(decay, "decay", ("data", "fixed"), name=name)
        self.gate_normalizer = check_number(
            gate_normalizer, "gate_normalizer", name=name, minimum=0.0, strict_minimum=True
        )
        if self.decay == "data":
            self.gate_projection = nn.Linear(dim, dim, device=device, dtype=dtype)  # one log-decay per key dim
        else:
            self.register_buffer("log_decays", retnet_log_decays(self.n_heads).to(device), persistent=False)

    def gates(self, x: torch.Tensor) -> torch.Tensor:
        """Log-decays of x (B, N, C) or (B, C): (B, H, N, D) or (B, H, D) ("data"), (B, H, N) or (B, H) ("fixed")."""
        if self.decay == "fixed":
            shape = (x.shape[0], self.n_heads) + ((x.shape[1],) if x.dim() == 3 else ())
            lead = self.log_decays.view(self.n_heads, *([1] if x.dim() == 3 else []))
            return lead.to(accumulation_dtype(x.dtype)).expand(shape)
        g = F.logsigmoid(self.gate_projection(x).to(accumulation_dtype(x.dtype))) / self.gate_normalizer  # <= 0
        return self.heads(g)

    def mix(self, q: Tensor, k: Tensor, v: Tensor, gate: Tensor, state: Any, final: bool) -> Any:
        return gated_linear_attention(q, k, v, gate, initial_state=state, output_final_state=final)

    def mix_step(self, q_t: Tensor, k_t: Tensor, v_t: Tensor, gate_t: Tensor, state: Any) -> tuple[Tensor, Tensor]:
        return gated_linear_attention_step(q_t, k_t, v_t, gate_t, state)

    def neutral(self, gate: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        """No decay at a padded token (``keep`` (B, 1, N) False)."""
        return gate * (keep if gate.dim() == 3 else keep.unsqueeze(-1)).to(gate.dtype)
