"""Mobile-Attention's core without autograd, in fewer passes over memory: the speed-only twin of
:func:`attnbook.mobile._mobile` from the sigmoid features on.

The plain form writes each flow as ``((x + eps) * (Y + eps)).sum(-1)``, Y the sum over the heads: a new
(B, H, N, D) tensor for ``x + eps`` and one for the product, and one more for each conserved flow's weighted keys or
queries and for ``v * c``: eleven tensors of the inputs' size made, written and read once per call. Here one
(B, H, N, D) workspace takes each of those products in turn, and each flow is split as

    (x + eps) . (Y + eps) = x . (Y + eps) + eps sum_d (Y_d + eps)

so ``x + eps`` is never formed. The sums are the same; only their rounding differs (the tests compare both forms
and :mod:`attnbook.reference`). Without autograd only: the workspace is overwritten, which autograd forbids.
"""

from __future__ import annotations

import torch

from .._runtime import reciprocal


def mobile_core(
    qs: torch.Tensor,
    ks: torch.Tensor,
    v: torch.Tensor,
    eps: float,
    keep: torch.Tensor | None,
    m: float | torch.Tensor,
) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    """q~, k~ (B, H, N, D) (0 at padding), v (B, H, N, Dv), ``keep`` (B, 1, N) or None, m the real positions ->
    out (B, H, N, Dv) and the fields of :class:`attnbook.FlowStats` (B, H, N), before padding is zeroed in them."""
    work = torch.empty_like(qs)  # (B, H, N, D): every product of the inputs' size, in turn

    def flow(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:  # (x + eps) . (sum_h y + eps), (B, H, N)
        total = y.sum(1, keepdim=True).add_(eps)  # (B, 1, N, D); y may be the workspace: summed before it is reused
        return torch.mul(x, total, out=work).sum(-1).add_(total.sum(-1), alpha=eps)

    incoming = flow(qs, ks)  # I_hi
    outgoing = flow(ks, qs)  # O_hj
    conserved_incoming = flow(qs, torch.mul(ks, reciprocal(outgoing, keep).unsqueeze(-1), out=work))  # I^_hi
    conserved_outgoing_raw = flow(ks, torch.mul(qs, reciprocal(incoming, keep).unsqueeze(-1), out=work))  # O^_hj
    conserved_outgoing = conserved_outgoing_raw.clamp(-1.0, 1.0)
    allocation = torch.sigmoid(conserved_incoming)  # a_hi (N / M = 1)
    scores = conserved_outgoing if keep is None else conserved_outgoing.masked_fill(~keep, float("-inf"))
    competition = torch.softmax(scores, dim=-1) * m  # c_hj
    if keep is not None:
        competition, allocation = torch.where(keep, competition, 0.0), torch.where(keep, allocation, 0.0)
    weighted = work if v.shape == work.shape else None  # c_j v_j (B, H, N, Dv): in the workspace where it fits
    kv = ks.transpose(-2, -1) @ torch.mul(v, competition.unsqueeze(-1), out=weighted)  # (B, H, D, Dv)
    out = (qs @ kv).mul_((allocation * reciprocal(incoming, keep)).unsqueeze(-1))  # (B, H, N, Dv)
    flows = incoming, outgoing, conserved_incoming, conserved_outgoing, competition, allocation
    return out, (*flows, conserved_outgoing_raw)
