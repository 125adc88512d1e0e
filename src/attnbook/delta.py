"""The delta rule: linear attention whose write first corrects what the state already predicts (chapter 8).

One head carries a matrix state S (D x Dv), a fast-weight memory that maps a key to a value (Schlag, Irie and
Schmidhuber, "Linear Transformers Are Secretly Fast Weight Programmers", ICML 2021). Linear attention only adds
k_t v_t^T; the delta rule first reads what the state predicts for k_t, S_{t-1}^T k_t, and writes the error, a
share beta_t of it::

    u_t = beta_t (v_t - S_{t-1}^T k_t),      S_t = S_{t-1} + k_t u_t^T,      o_t = S_t^T (scale q_t)

With a unit key (||k_t|| = 1) and beta_t = 1 the write replaces the value stored under k_t instead of adding to
it: S_t^T k_t = v_t. ``beta`` (B, H, N) is usually a sigmoid of the input (DeltaNet); the L2 normalisation of q and
k belongs to the layer (:class:`DeltaRuleAttention`), not to this function.

Conventions are flash-linear-attention's (``delta_rule_recurrence``): ``scale`` D^-1/2 by default, S of shape
(B, H, D, Dv), ``initial_state=`` / ``output_final_state=``. DeltaNet (Yang et al., "Parallelizing Linear
Transformers with the Delta Rule over Sequence Length", NeurIPS 2024) adds SiLU features, L2-normalised q and k
and short convolutions in its layer; :class:`DeltaRuleAttention` keeps the first two.

The chunked form (:func:`chunked_delta_product`, Yang et al. 2024, Sec. 3): inside a chunk of ell positions that
starts from S, every u_r depends on the u_s before it; in matrices (rows r of K, V, U; B = diag(beta)),

    (I + tril(B K K^T, -1)) U = B V - B K S,   so   U = W' - W S,   W' = T B V,   W = T B K

with T = (I + tril(B K K^T, -1))^-1 (the WY representation; T B V and T B K by one triangular solve, the UT
transform). Then the chunk's outputs and the next state:

    O = Q S + tril(Q K^T) U,      S' = S + K^T U

W' and W of every chunk are computed at once; U, O and S' go from chunk to chunk in a loop. Cost: O(N ell (D + Dv)
+ N D Dv) time and O(N ell) memory beside the inputs.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ._checks import check_bool, check_gated, check_int
from ._module import RecurrentAttention
from ._runtime import accumulation_dtype, autocast_disabled, chunk_count, chunk_length

__all__ = ["delta_rule_attention", "delta_rule_step", "chunked_delta_product", "DeltaRuleAttention"]


def chunked_delta_product(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, chunk_size: int, state: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The chunked form of the module docstring: q (already scaled), k (B, H, N, D), v (B, H, N, Dv), beta (B, H, N)
    and S (B, H, D, Dv), in one dtype -> (o (B, H, N, Dv), the state after the last token)."""
    N = q.shape[-2]
    ell = chunk_length(N, chunk_size)
    n = chunk_count(N, ell)  # chunks; the last one padded with beta = 0: no write
    qc, kc, vc, bc = (
        F.pad(x, (0, 0, 0, n * ell - N)).reshape(*x.shape[:-2], n, ell, x.shape[-1])
        for x in (q, k, v, beta.unsqueeze(-1))
    )  # (B, H, n, ell, .)
    eye = torch.eye(ell, dtype=q.dtype, device=q.device)
    A = eye + ((bc * kc) @ kc.transpose(-2, -1)).tril(-1)  # (B, H, n, ell, ell): I + tril(B K K^T, -1)
    TBKV = torch.linalg.solve_triangular(A, torch.cat([bc * kc, bc * vc], -1), upper=False, unitriangular=True)
    W, Wv = TBKV.split([k.shape[-1], v.shape[-1]], dim=-1)  # (B, H, n, ell, D), (B, H, n, ell, Dv)
    scores = (qc @ kc.transpose(-2, -1)).tril()  # (B, H, n, ell, ell): q_r . k_s, s <= r
    outs = []
    for q_c, k_c, W_c, Wv_c, scores_c in zip(*(x.unbind(2) for x in (qc, kc, W, Wv, scores)), strict=True):
        U = Wv_c - W_c @ state  # (B, H, ell, Dv): the chunk's writes, corrected by what the state predicts
        outs.append(q_c @ state + scores_c @ U)  # (B, H, ell, Dv)
        state = state + k_c.transpose(-2, -1) @ U  # (B, H, D, Dv): carried to the next chunk
    return torch.cat(outs, dim=-2)[:, :, :N], state  # (B, H, N, Dv), (B, H, D, Dv)


def delta_rule_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor,
    *,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    chunk_size: int = 32,
) -> Any:
    """Causal delta rule: u_t = beta_t (v_t - S_{t-1}^T k_t), S_t = S_{t-1} + k_t u_t^T, o_t = S_t^T (scale q_t).

    ``beta`` (B, H, N) is the share of the error written (with unit keys the state stays bounded for beta in [0, 2]);
    the keys are not normalised here (the layer does it). The rest as in :func:`attnbook.gated_linear_attention`.

    Example:
        >>> import torch, torch.nn.functional as F, attnbook
        >>> k = F.normalize(torch.randn(1, 1, 1, 8), dim=-1)  # one unit key
        >>> v1, v2 = torch.randn(1, 1, 1, 8), torch.randn(1, 1, 1, 8)
        >>> ones = torch.ones(1, 1, 2)
        >>> _, S = attnbook.delta_rule_attention(k.repeat(1, 1, 2, 1), k.repeat(1, 1, 2, 1), torch.cat([v1, v2], 2),
        ...                                      ones, output_final_state=True)
        >>> torch.allclose(S[0, 0].T @ k[0, 0, 0], v2[0, 0, 0], atol=1e-5)  # the second write replaced the first
        True
    """
    name = "delta_rule_attention"
    beta, s, state, dtype = check_gated(q, k, v, beta, initial_state, name=name, arg="beta", vector=False, scale=scale)
    final = check_bool(output_final_state, "output_final_state", name=name)
    ell = check_int(chunk_size, "chunk_size", name=name, minimum=1)
    with autocast_disabled(q.device):
        acc = state.dtype
        out, S = chunked_delta_product(q.to(acc) * s, k.to(acc), v.to(acc), beta.to(acc), ell, state)
    return (out.to(dtype), S) if final else out.to(dtype)


def delta_rule_step(
    q_t: torch.Tensor,
    k_t: torch.Tensor,
    v_t: torch.Tensor,
    beta_t: torch.Tensor,
    state: torch.Tensor | None = None,
    *,
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token of the delta rule, the recurrence itself: q_t, k_t (B, H, D), v_t (B, H, Dv), beta_t (B, H), and S
    (B, H, D, Dv) before it (None: zeros). Returns (o_t (B, H, Dv), S after it).

    Example:
        >>> import torch, attnbook
        >>> q, k, v = (torch.randn(1, 2, 5, 4) for _ in range(3))
        >>> beta = torch.full((1, 2, 5), 0.5)  # write half of each error
        >>> S = None
        >>> for t in range(5):
        ...     o_t, S = attnbook.delta_rule_step(q[:, :, t], k[:, :, t], v[:, :, t], beta[:, :, t], S)
        >>> torch.allclose(o_t, attnbook.delta_rule_attention(q, k, v, beta)[:, :, -1], atol=1e-5)
        True
    """
    beta_t, s, S, dtype = check_gated(
        q_t, k_t, v_t, beta_t, state, name="delta_rule_step", arg="beta_t", vector=False, scale=scale, step=True
    )
    acc = S.dtype
    with autocast_disabled(q_t.device):
        k, v = k_t.to(acc), v_t.to(acc)
        predicted = (k.unsqueeze(-1) * S).sum(-2)  # (B, H, Dv): S^T k, what the state holds for k
        u = beta_t.to(acc).unsqueeze(-1) * (v - predicted)  # (B, H, Dv): the share of the error written
        S = S + k.unsqueeze(-1) * u.unsqueeze(-2)  # (B, H, D, Dv)
        o_t = ((q_t.to(acc) * s).unsqueeze(-1) * S).sum(-2)  # (B, H, Dv)
    return o_t.to(dtype), S


class DeltaRuleAttention(RecurrentAttention):
    """Causal self-attention by :func:`delta_rule_attention`: DeltaNet's layer without its short convolutions.

    Queries and keys are SiLU'd and L2-normalised per head (unit keys: a write with beta = 1 replaces what is
    stored under its key), beta = sigmoid(x W_beta + b) per head and token (0 at a padded token).
    ``DeltaRuleAttention(dim, num_heads)``; shapes and calls as :class:`attnbook.RecurrentAttention`.

    Example:
        >>> import torch, attnbook
        >>> layer = attnbook.DeltaRuleAttention(32, num_heads=4)
        >>> x = torch.randn(2, 10, 32)
        >>> y, S = layer(x[:, :9], output_final_state=True)
        >>> y_t, S = layer.step(x[:, 9], S)
        >>> torch.allclose(y_t, layer(x)[:, 9], atol=1e-5)
        True
    """

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
        super().__init__(dim, num_heads, n_heads=n_heads, qkv_bias=qkv_bias, proj_bias=proj_bias, device=device,
                         dtype=dtype)  # fmt: skip
        self.beta_projection = nn.Linear(dim, self.n_heads, device=device, dtype=dtype)  # one beta per head

    def qk(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return F.normalize(F.silu(q), dim=-1), F.normalize(F.silu(k), dim=-1)  # unit vectors per head

    def gates(self, x: torch.Tensor) -> torch.Tensor:
        beta = torch.sigmoid(self.beta_projection(x).to(accumulation_dtype(x.dtype)))  # (B, [N,] H)
        return beta if x.dim() == 2 else beta.transpose(1, 2)  # (B, H[, N])

    def mix(self, q: Tensor, k: Tensor, v: Tensor, gate: Tensor, state: Any, final: bool) -> Any:
        return delta_rule_attention(q, k, v, gate, initial_state=state, output_final_state=final)

    def mix_step(self, q_t: Tensor, k_t: Tensor, v_t: Tensor, gate_t: Tensor, state: Any) -> tuple[Tensor, Tensor]:
        return delta_rule_step(q_t, k_t, v_t, gate_t, state)

    def neutral(self, gate: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        """beta = 0 at a padded token (``keep`` (B, 1, N) False): nothing written."""
        return gate * keep.to(gate.dtype)
