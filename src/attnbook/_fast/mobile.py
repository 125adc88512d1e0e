"""The annex's Mobile-Attention flows: every flow of a position from one H x H Gram matrix.

Speed only: :func:`attnbook.mobile.head_flows` computes the same four flows (to rounding) as the paper writes
them, each a dot product of a head's (x + eps) with the sum over the heads of (y + eps), four passes over
(B, H, N, D) tensors that each make a new tensor of that size. Expanding the dot products,

    (x_h + eps) . (sum_g y_g + eps) = sum_g x_h . y_g + eps sum(x_h) + eps sum_g sum(y_g) + D eps^2,

every flow of a position follows from the Gram matrix G[h, g] = q~_h . k~_g of its H queries and H keys and from
the row sums of the features: I_h is row h of G summed, O_g column g, I^ and O^ the same sums weighted by 1 / O
and 1 / I. The features are read once, for G; everything after is (B, N, H) or (B, N, H, H).
"""

from __future__ import annotations

import torch

__all__ = ["head_flows"]

#: The four flows (I, O, I^, O^ before the clamp), each (B, H, N).
Flows = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def _reciprocal(x: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
    """1 / x, and 0 where ``keep`` (broadcastable, True = a real position) is False or x is 0 (no flow)."""
    some = x != 0 if keep is None else (x != 0) & keep
    return torch.where(some, torch.where(some, x, 1.0).reciprocal(), 0.0)


def head_flows(qs: torch.Tensor, ks: torch.Tensor, eps: float, keep: torch.Tensor | None) -> Flows:
    """:func:`attnbook.mobile.head_flows` from the Gram matrices: q~, k~ (B, H, N, D) (0 at padding, ``keep``
    (B, 1, N) False) -> I, O, I^, O^ (B, H, N)."""
    D = qs.shape[-1]
    gram = torch.einsum("bhnd,bgnd->bnhg", qs, ks)  # (B, N, H, H): q~_h . k~_g at each position
    q_rows, k_rows = qs.sum(-1).transpose(1, 2), ks.sum(-1).transpose(1, 2)  # (B, N, H): each head's sum
    at = None if keep is None else keep.transpose(1, 2)  # (B, N, 1)
    e, de2 = eps, D * eps * eps
    incoming = gram.sum(-1) + e * q_rows + e * k_rows.sum(-1, keepdim=True) + de2  # (B, N, H)
    outgoing = gram.sum(-2) + e * k_rows + e * q_rows.sum(-1, keepdim=True) + de2  # (B, N, H)
    r_out, r_in = _reciprocal(outgoing, at), _reciprocal(incoming, at)  # (B, N, H)
    conserved_incoming = (gram @ r_out.unsqueeze(-1)).squeeze(-1) + e * q_rows + e * (k_rows * r_out).sum(-1, True)
    conserved_outgoing = (
        (gram.transpose(-2, -1) @ r_in.unsqueeze(-1)).squeeze(-1) + e * k_rows + e * (q_rows * r_in).sum(-1, True)
    )
    flows = (incoming, outgoing, conserved_incoming + de2, conserved_outgoing + de2)
    return tuple(x.transpose(1, 2) for x in flows)  # type: ignore[return-value]  # four (B, H, N)
