"""Mobile-Attention: Flow-Attention whose flow budget is shared by the heads at each position (chapter 4).

Yao et al., "Mobile Attention" (ICML 2024), the head-competing variant of Flow-Attention (Wu et al.,
ICML 2022); the numbers are those of the published ``Mobile_Attention`` core code. With q~ = sigmoid(q),
k~ = sigmoid(k) per head, eps = 1e-6, and every flow sum taken over the H heads at the *same position*
(hence N == M):

    incoming flow       I_hi  = (q~_hi + eps) . (sum_h' k~_h'i + eps)
    outgoing flow       O_hj  = (k~_hj + eps) . (sum_h' q~_h'j + eps)
    conserved incoming  I^_hi = (q~_hi + eps) . (sum_h' k~_h'i / O_h'i + eps)
    conserved outgoing  O^_hj = clamp((k~_hj + eps) . (sum_h' q~_h'j / I_h'j + eps), -1, 1)
    allocation          a_hi  = sigmoid(I^_hi N / M)   (N / M = 1)
    competition         c_hj  = softmax over the sequence j of O^_hj, times M
    output              out_hi = a_hi (q~_hi / I_hi) . sum_j k~_hj (c_hj v_hj)^T

The heads at one token now compete for that token's flow: with eps = 0, sum_h O^_hj = H and sum_h I^_hi = H
(before the clamp), whereas in Flow-Attention the budget is spread over the sequence. Queries and keys
must have the same length: the head sums pair query i with key i (the published code does not check this
and silently broadcasts when one length is 1). :class:`attnbook.FlowStats` holds the flows themselves
(I, not 1 / I).

Cost: O(B H N D Dv) time, O(B H N (D + Dv)) memory, like linear attention.
"""

from __future__ import annotations

import torch

from ._checks import accumulation_dtype, check_eps, check_qkv
from ._module import ProjectedAttention
from .flow import FlowStats, needs_autograd, rows_per_group

__all__ = ["mobile_attention", "MobileAttention"]


def _head_gram(qs: torch.Tensor, ks: torch.Tensor) -> torch.Tensor:
    """G[b, n, h, g] = q~_hn . k~_gn: every head's query against every head's key at the same position.

    (B, H, N, D), (B, H, N, D) -> (B, N, H, H). One batched product per batch element on strided views, so the
    features are read once and never copied into a head-last layout.
    """
    grams = [q_b.transpose(0, 1) @ k_b.permute(1, 2, 0) for q_b, k_b in zip(qs, ks, strict=True)]  # (N, H, H)
    return torch.stack(grams)  # (B, N, H, H)


def mobile_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    eps: float = 1e-6,
    return_flows: bool = False,
):
    """Mobile-Attention (Yao et al., ICML 2024): Flow-Attention with the heads competing for each token.

    ``out_hi = a_hi (q~_hi / I_hi) . sum_j k~_hj (c_hj v_hj)^T``, the flows I, O, I^, O^ summed over the heads
    at one position (module docstring), competition c = softmax over the sequence of clamp(O^, -1, 1) times M,
    allocation a = sigmoid(I^).

    Cost: O(B H N D Dv) time, O(B H N (D + Dv)) memory.

    Args:
        q: queries (B, H, N, D).
        k: keys (B, H, M, D), with M == N.
        v: values (B, H, M, Dv).
        eps: added to every component of the flow vectors, as in the published code (>= 0).
        return_flows: also return the :class:`attnbook.FlowStats` (every field (B, H, N)).

    Returns:
        out (B, H, N, Dv) in the dtype of the inputs (float16/bfloat16 computed in float32), or
        ``(out, FlowStats)``; the statistics are in the accumulation dtype.

    Raises:
        ValueError: bad shapes, including N != M.
    """
    check_qkv(q, k, v, name="mobile_attention", same_length=True)
    eps = check_eps(eps, name="mobile_attention")
    acc = accumulation_dtype(q.dtype)
    if needs_autograd(q, k, v):
        out, stats = _mobile(q, k, v, eps, acc)
    else:
        # Without autograd, a few batch elements at a time (they are independent; the heads of one element
        # are not): the temporaries of a group stay small enough to remain in cache and be recycled.
        B, H, N, _ = q.shape
        out = q.new_empty(B, H, N, v.shape[-1], dtype=acc)  # (B, H, N, Dv)
        parts = []
        step = rows_per_group(q, H * N, B)
        for b0 in range(0, B, step):
            b = slice(b0, b0 + step)
            _, stats = _mobile(q[b], k[b], v[b], eps, acc, out=out[b])
            if return_flows:
                parts.append(stats)
        out = out.to(q.dtype)
        stats = FlowStats(*(torch.cat(p) for p in zip(*parts, strict=True))) if return_flows else None
    return (out, stats) if return_flows else out


def _mobile(q, k, v, eps, acc, out=None):
    """Mobile-Attention on q, k (B, H, N, D), v (B, H, N, Dv); returns (out, FlowStats), out written to
    ``out`` (in the accumulation dtype, no autograd) when given, else in the input dtype."""
    qs = torch.sigmoid(q.to(acc))  # (B, H, N, D)
    ks = torch.sigmoid(k.to(acc))  # (B, H, M, D)
    N, M, D = qs.shape[-2], ks.shape[-2], qs.shape[-1]
    # Every flow is a head-axis contraction at one position, so all four follow from the H x H Gram matrix
    # of each token and the row sums of the features, expanding (x + eps) . (y + eps) =
    # x . y + eps sum(x) + eps sum(y) + D eps^2. Layout (B, N, H) until the competition.
    gram = _head_gram(qs, ks)  # (B, N, H, H)
    q_rows = qs.sum(-1).transpose(1, 2)  # (B, N, H): q~_hn . 1
    k_rows = ks.sum(-1).transpose(1, 2)  # (B, N, H): k~_hn . 1
    e, de2 = eps, D * eps * eps
    incoming = gram.sum(-1) + e * q_rows + e * k_rows.sum(-1, keepdim=True) + de2  # (B, N, H)
    outgoing = gram.sum(-2) + e * k_rows + e * q_rows.sum(-1, keepdim=True) + de2  # (B, N, H)
    r_out, r_in = outgoing.reciprocal(), incoming.reciprocal()  # (B, N, H)
    conserved_incoming = (
        (gram @ r_out.unsqueeze(-1)).squeeze(-1) + e * q_rows + e * (k_rows * r_out).sum(-1, keepdim=True) + de2
    )  # (B, N, H)
    conserved_outgoing_raw = (
        (gram.transpose(-2, -1) @ r_in.unsqueeze(-1)).squeeze(-1)
        + e * k_rows
        + e * (q_rows * r_in).sum(-1, keepdim=True)
        + de2
    )  # (B, N, H)
    incoming, outgoing, conserved_incoming, conserved_outgoing_raw = (
        x.transpose(1, 2) for x in (incoming, outgoing, conserved_incoming, conserved_outgoing_raw)
    )  # each (B, H, N)
    conserved_outgoing = conserved_outgoing_raw.clamp(-1.0, 1.0)  # for stability, as published
    allocation = torch.sigmoid(conserved_incoming * (N / M))  # (B, H, N)
    competition = torch.softmax(conserved_outgoing, dim=-1) * M  # (B, H, M), over the sequence
    kv = ks.transpose(-2, -1) @ (v.to(acc) * competition.unsqueeze(-1))  # (B, H, D, Dv)
    scale = (allocation / incoming).unsqueeze(-1)  # (B, H, N, 1)
    if out is None:
        out = ((qs @ kv) * scale).to(q.dtype)  # (B, H, N, Dv)
    else:
        torch.matmul(qs, kv, out=out).mul_(scale)  # (B, H, N, Dv), in place: no autograd here
    stats = (
        incoming,
        outgoing,
        conserved_incoming,
        conserved_outgoing,
        competition,
        allocation,
        conserved_outgoing_raw,
    )
    return out, FlowStats(*(x.contiguous() for x in stats))


class MobileAttention(ProjectedAttention):
    """Multi-head Mobile-Attention with the module family's projections (Yao et al., ICML 2024).

    Parameter names and shapes are those of the published ``Mobile_Attention`` module, so its checkpoints load
    unchanged and give the same outputs.

    Args:
        d_input, d_model, d_output, n_heads, drop_out: see :class:`attnbook.ProjectedAttention`.
        eps: see :func:`mobile_attention`.

    Shape:
        queries (B, L, d_input), keys (B, L, d_input), values (B, L, d_input) -> (B, L, d_output); queries and
        keys of different lengths raise ``ValueError``.
    """

    def __init__(
        self,
        d_input: int,
        d_model: int,
        d_output: int,
        n_heads: int,
        drop_out: float = 0.05,
        eps: float = 1e-6,
    ):
        super().__init__(d_input, d_model, d_output, n_heads, drop_out)
        self.eps = check_eps(eps, name=type(self).__name__)

    def extra_repr(self) -> str:
        return f"n_heads={self.n_heads}, eps={self.eps}"

    def _check_inputs(self, queries, keys, values):
        super()._check_inputs(queries, keys, values)
        if queries.shape[1] != keys.shape[1]:
            raise ValueError(
                f"{type(self).__name__}: the heads compete for each position, so queries and keys "
                f"need the same length (L == S), got queries {tuple(queries.shape)}, keys "
                f"{tuple(keys.shape)}"
            )

    def attend(self, q, k, v):
        return mobile_attention(q, k, v, eps=self.eps)
