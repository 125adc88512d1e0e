"""Direct ports of the published code: the baselines the package must reproduce (tests) and beat (benchmarks).

One copy of each, imported by the tests and by ``benchmarks/`` (which put this folder on ``sys.path``); the
package never uses them. Specifications: ``/work/shared/seeds`` and the papers.

* :func:`fast_transformers_linear_attention` -- idiap/fast-transformers' ``LinearAttention`` (Katharopoulos
  et al., ICML 2020), einsum for einsum, in its (B, N, H, D) layout;
* :func:`published_flow_attention`, :func:`published_causal_flow_attention` -- the cores of Flowformer's
  ``Flow_Attention`` and ``Flow_Attention_Causal`` (Wu et al., ICML 2022), after the projections, in the
  (B, H, N, D) layout of attnbook (the published einsum letters, n = batch, l = position);
* :func:`published_mobile_attention` -- the core of thuml's ``Mobile_Attention`` (Yao et al., ICML 2024);
* :class:`PublishedFlowAttention`, :class:`PublishedMobileAttention` -- the published modules around those
  cores (parameter names and layout of the checkpoints);
* :class:`ReferenceCodeMoH` -- SkyworkAI/MoH's attention (Jin et al., 2024), re-typed: same parameters,
  created under the same conditions, the same operations in the same order. timm's ``use_fused_attn()`` is
  the plain flag ``fused``; the class-level loss list is a list on the instance.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def fast_transformers_linear_attention(queries, keys, values, eps=1e-6):
    """fast-transformers' non-causal computation, in its (B, N, H, D) layout, written from its three einsums."""
    Q = F.elu(queries) + 1
    K = F.elu(keys) + 1
    KV = torch.einsum("nshd,nshm->nhmd", K, values)
    Z = 1 / (torch.einsum("nlhd,nhd->nlh", Q, K.sum(dim=1)) + eps)
    return torch.einsum("nlhd,nhmd,nlh->nlhm", Q, KV, Z).contiguous()


def _published_competition_and_allocation(queries, keys, values, sink_incoming, conserved_sink, conserved_source):
    """The end of both published non-causal cores (Mobile-Attention's is Flowformer's, line for line)."""
    conserved_source = torch.clamp(conserved_source, min=-1.0, max=1.0)
    sink_allocation = torch.sigmoid(conserved_sink * (float(queries.shape[2]) / float(keys.shape[2])))
    source_competition = torch.softmax(conserved_source, dim=-1) * float(keys.shape[2])
    kv = torch.einsum("nhld,nhlm->nhdm", keys, values * source_competition[:, :, :, None])
    qkv = torch.einsum("nhld,nhdm->nhlm", queries * sink_incoming[:, :, :, None], kv)
    return qkv * sink_allocation[:, :, :, None]


def published_flow_attention(queries, keys, values, eps=1e-6):
    """DIRECT PORT of the published Flowformer ``Flow_Attention`` core (after the projections)."""
    queries, keys = torch.sigmoid(queries), torch.sigmoid(keys)
    sink_incoming = 1.0 / torch.einsum("nhld,nhd->nhl", queries + eps, keys.sum(dim=2) + eps)
    source_outgoing = 1.0 / torch.einsum("nhld,nhd->nhl", keys + eps, queries.sum(dim=2) + eps)
    conserved_sink = torch.einsum(
        "nhld,nhd->nhl", queries + eps, (keys * source_outgoing[:, :, :, None]).sum(dim=2) + eps
    )
    conserved_source = torch.einsum(
        "nhld,nhd->nhl", keys + eps, (queries * sink_incoming[:, :, :, None]).sum(dim=2) + eps
    )
    return _published_competition_and_allocation(queries, keys, values, sink_incoming, conserved_sink, conserved_source)


def published_causal_flow_attention(queries, keys, values, eps=1e-6):
    """DIRECT PORT of the published ``Flow_Attention_Causal`` core: builds a (B, H, N, D, Dv) tensor."""
    queries, keys = torch.sigmoid(queries), torch.sigmoid(keys)
    sink_incoming = 1.0 / torch.einsum("nhld,nhld->nhl", queries + eps, keys.cumsum(dim=2) + eps)
    source_outgoing = 1.0 / torch.einsum("nhld,nhld->nhl", keys + eps, queries.cumsum(dim=2) + eps)
    normal = (torch.arange(queries.shape[2]).float() + 1.0).to(queries.device)[None, None, :]
    sink_incoming = sink_incoming * normal
    source_outgoing = source_outgoing * normal
    conserved_sink = (
        torch.einsum("nhld,nhld->nhl", queries + eps, (keys * source_outgoing[:, :, :, None]).cumsum(dim=2) + eps)
        / normal
    )
    conserved_source = (
        torch.einsum("nhld,nhld->nhl", keys + eps, (queries * sink_incoming[:, :, :, None]).cumsum(dim=2) + eps)
        / normal
    )
    conserved_source = torch.clamp(conserved_source, min=-1.0, max=1.0)
    sink_allocation = torch.sigmoid(conserved_sink)
    conserved_source = torch.exp(conserved_source)
    source_competition = (conserved_source / conserved_source.cumsum(dim=-1)) * normal
    kv = torch.einsum("nhld,nhlm->nhldm", keys, values * source_competition[:, :, :, None]).cumsum(dim=2)
    qkv = torch.einsum("nhld,nhldm->nhlm", queries * (sink_incoming / normal)[:, :, :, None], kv)
    return qkv * sink_allocation[:, :, :, None]


def published_mobile_attention(queries, keys, values, eps=1e-6):
    """DIRECT PORT of the published ``Mobile_Attention`` core (after the projections)."""
    H = queries.shape[1]
    queries, keys = torch.sigmoid(queries), torch.sigmoid(keys)
    sink_incoming = 1.0 / torch.sum((queries + eps) * (keys.sum(dim=1, keepdim=True).repeat(1, H, 1, 1) + eps), dim=-1)
    source_outgoing = 1.0 / torch.sum(
        (keys + eps) * (queries.sum(dim=1, keepdim=True).repeat(1, H, 1, 1) + eps), dim=-1
    )
    conserved_sink = torch.sum(
        (queries + eps) * ((keys * source_outgoing[:, :, :, None]).sum(dim=1, keepdim=True).repeat(1, H, 1, 1) + eps),
        dim=-1,
    )
    conserved_source = torch.sum(
        (keys + eps) * ((queries * sink_incoming[:, :, :, None]).sum(dim=1, keepdim=True).repeat(1, H, 1, 1) + eps),
        dim=-1,
    )
    return _published_competition_and_allocation(queries, keys, values, sink_incoming, conserved_sink, conserved_source)


class _PublishedModule(nn.Module):
    """The published module layout: four projections, the core on (B, H, L, D) heads, dropout at the end."""

    def __init__(self, d_input, d_model, d_output, n_heads, drop_out=0.05, eps=1e-6):
        super().__init__()
        self.n_heads, self.eps = n_heads, eps
        self.query_projection = nn.Linear(d_input, d_model)
        self.key_projection = nn.Linear(d_input, d_model)
        self.value_projection = nn.Linear(d_input, d_model)
        self.out_projection = nn.Linear(d_model, d_output)
        self.dropout = nn.Dropout(drop_out)

    def core(self, q, k, v):
        raise NotImplementedError

    def forward(self, queries, keys, values):
        B, L, _ = queries.shape
        _, S, _ = keys.shape
        q = self.query_projection(queries).view(B, L, self.n_heads, -1).transpose(1, 2)
        k = self.key_projection(keys).view(B, S, self.n_heads, -1).transpose(1, 2)
        v = self.value_projection(values).view(B, S, self.n_heads, -1).transpose(1, 2)
        x = self.core(q, k, v).transpose(1, 2).reshape(B, L, -1)
        return self.dropout(self.out_projection(x))


class PublishedFlowAttention(_PublishedModule):
    """Flowformer's ``Flow_Attention`` / ``Flow_Attention_Causal`` module (``causal`` picks the core)."""

    def __init__(self, d_input, d_model, d_output, n_heads, drop_out=0.05, eps=1e-6, causal=False):
        super().__init__(d_input, d_model, d_output, n_heads, drop_out, eps)
        self.causal = causal

    def core(self, q, k, v):
        core = published_causal_flow_attention if self.causal else published_flow_attention
        return core(q, k, v, self.eps)


class PublishedMobileAttention(_PublishedModule):
    """thuml's ``Mobile_Attention`` module."""

    def core(self, q, k, v):
        return published_mobile_attention(q, k, v, self.eps)


class ReferenceCodeMoH(nn.Module):
    """SkyworkAI/MoH's mixture-of-head attention (``/work/shared/seeds/moh_attention.txt``), re-typed."""

    def __init__(
        self,
        dim,
        num_heads=8,
        qkv_bias=False,
        qk_norm=False,
        attn_drop=0.0,
        proj_drop=0.0,
        norm_layer=nn.LayerNorm,
        shared_head=0,
        routed_head=0,
        head_dim=None,
        fused=True,
    ):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = dim // num_heads if head_dim is None else head_dim
        self.scale = self.head_dim**-0.5
        self.fused = fused
        inner = self.head_dim * num_heads
        self.qkv = nn.Linear(dim, inner * 3, bias=qkv_bias)
        self.q_norm = norm_layer(self.head_dim) if qk_norm else nn.Identity()
        self.k_norm = norm_layer(self.head_dim) if qk_norm else nn.Identity()
        self.attn_drop = nn.Dropout(attn_drop)
        self.proj = nn.Linear(inner, dim)
        self.proj_drop = nn.Dropout(proj_drop)
        self.shared_head, self.routed_head = shared_head, routed_head
        if routed_head > 0:
            self.wg = nn.Linear(dim, num_heads - shared_head, bias=False)
            if shared_head > 0:
                self.wg_0 = nn.Linear(dim, 2, bias=False)
        if shared_head > 1:
            self.wg_1 = nn.Linear(dim, shared_head, bias=False)
        self.losses = []

    def forward(self, x):
        B, N, C = x.shape
        flat = x.reshape(B * N, C)
        if self.routed_head > 0:
            probs = F.softmax(self.wg(flat), dim=1)
            _, experts = probs.shape
            _, idx = torch.topk(probs, k=self.routed_head, dim=1)
            mask = F.one_hot(idx, num_classes=experts).sum(dim=1)
            if self.training:
                self.losses.append(torch.mean(probs.mean(dim=0) * mask.float().mean(dim=0)) * experts * experts)
            routed = probs * mask
            denom = torch.clamp(routed.sum(dim=1, keepdim=True), min=torch.finfo(probs.dtype).eps)
            routed = (routed / denom).reshape(B, N, -1) * self.routed_head
        q, k, v = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        q, k = self.q_norm(q), self.k_norm(k)
        if self.fused:
            h = F.scaled_dot_product_attention(q, k, v, dropout_p=self.attn_drop.p if self.training else 0.0)
        else:
            h = self.attn_drop((q * self.scale @ k.transpose(-2, -1)).softmax(dim=-1)) @ v
        h = h.transpose(1, 2)
        if self.routed_head > 0 and self.shared_head > 0:
            shared = F.softmax(self.wg_1(flat), dim=1).reshape(B, N, -1) * self.shared_head
            w0 = F.softmax(self.wg_0(flat), dim=1).reshape(B, N, 2) * 2
            gates = torch.cat(
                [torch.einsum("bn,bne->bne", w0[:, :, 0], shared), torch.einsum("bn,bne->bne", w0[:, :, 1], routed)],
                dim=2,
            )
        elif self.routed_head > 0:
            gates = routed
        else:
            gates = F.softmax(self.wg_1(flat), dim=1).reshape(B, N, -1) * self.shared_head
        h = torch.einsum("bne,bned->bned", gates, h).reshape(B, N, self.head_dim * self.num_heads)
        return self.proj_drop(self.proj(h))


# --- flash-linear-attention's naive recurrences (fla-org/flash-linear-attention, fla/ops/*/naive.py) -----------
# Re-typed from their definitions: the loops fla's kernels are tested against, in fla's layouts and in float32.


def fla_naive_recurrent_gla(q, k, v, gk, initial_state=None):
    """fla's ``naive_recurrent_gla``: inputs (B, T, H, K) and (B, T, H, V); h = h * exp(gk_t) + k_t v_t^T,
    o_t = (scale q_t) h, scale = K^-0.5, all in float32. Returns (o (B, T, H, V) in q's dtype, h)."""
    dtype = q.dtype
    q, k, v, gk = (x.transpose(1, 2).float() for x in (q, k, v, gk))
    B, H, T, K = q.shape
    h = torch.zeros(B, H, K, v.shape[-1])
    if initial_state is not None:
        h = h + initial_state.float()
    o = torch.zeros_like(v)
    for i in range(T):
        h = h * gk[:, :, i].exp()[..., None] + k[:, :, i][..., None] * v[:, :, i][..., None, :]
        o[:, :, i] = (q[:, :, i][..., None] * K**-0.5 * h).sum(-2)
    return o.transpose(1, 2).to(dtype), h


def fla_delta_rule_recurrence(q, k, v, beta, initial_state=None):
    """fla's ``delta_rule_recurrence``: inputs (B, H, L, D), beta (B, H, L); the value minus S's prediction for
    k, times beta, is added as k u^T; o = (scale q) S, scale = D^-0.5, in float32. Returns (o, S)."""
    dtype = q.dtype
    q, k, v, beta = (x.float() for x in (q, k, v, beta))
    S = torch.zeros(*q.shape[:2], q.shape[-1], v.shape[-1])
    if initial_state is not None:
        S = S + initial_state
    q = q * q.shape[-1] ** -0.5
    o = torch.zeros_like(v)
    for i in range(q.shape[2]):
        u = (v[:, :, i] - (S * k[:, :, i][..., None]).sum(-2)) * beta[:, :, i][..., None]
        S = S + k[:, :, i].unsqueeze(-1) * u.unsqueeze(-2)
        o[:, :, i] = torch.einsum("bhd,bhdm->bhm", q[:, :, i], S)
    return o.to(dtype), S
