"""Causal linear attention tile by tile: features, numerator, normaliser and gradients in cache-sized pieces.

    out_i = sum_{j <= i} (phi(q_i) . phi(k_j)) v_j / (sum_{j <= i} phi(q_i) . phi(k_j) + eps)

Chunked as in Katharopoulos et al., "Transformers are RNNs" (ICML 2020, Sec. 3.3), in the chunked form of
e.g. Hua et al., "Transformer Quality in Linear Time" (ICML 2022): inside a chunk of C positions the masked
C x C product, between chunks the carried state S = sum_j phi(k_j) v_j^T (R, Dv) and z = sum_j phi(k_j) (R).

A *tile* is a run of whole chunks of one row of (B H), or several whole rows (:func:`_tiles`). For the
built-in feature maps (elementwise: ``kind`` "elu" or "relu") each tile's features are made into small
buffers just before its products read them, so no (B, H, N, R) tensor of features is ever made, and on a
CPU a tile's work stays in the caches (:data:`CPU_TILE` positions). Other feature maps pass their features
as q and k (``kind`` None).

Backward, with g = dL/dout, r_i = 1 / (den_i + eps), gn_i = g_i r_i and gd_i = -(g_i . out_i) r_i:

    dphi(q)_i = sum_{j <= i} (gn_i . v_j + gd_i) phi(k)_j
    dphi(k)_j = sum_{i >= j} (gn_i . v_j + gd_i) phi(q)_i
    dv_j      = sum_{i >= j} (phi(q)_i . phi(k)_j) gn_i

Inside a chunk the first two share one masked matrix M = tril(gn v^T + gd 1^T): dphi(q) = M phi(k) and
dphi(k) = M^T phi(q); dv takes P^T gn with P = tril(phi(q) phi(k)^T). Between chunks dphi(q) needs the
forward state S (gn_i S^T + gd_i z), the other two share one state U = sum_{i later} phi(q)_i gn_i^T
(dphi(k)_j gets U v_j + w with w = sum_{i later} gd_i phi(q)_i, dv_j gets U^T phi(k)_j). So the backward
is two passes over the tiles, forwards then backwards in time, with ten products of a chunk's size per chunk
(three separate prefix products would take twelve) and the feature map's derivative applied tile by tile.
The features are made again in each pass (a few elementwise passes over a tile in the cache) rather than
saved: only q, k, v, the output and r are kept for the backward.

A double backward (``create_graph=True``) recomputes the output through the differentiable composition of
:mod:`attnbook._prefix` (:func:`attnbook._prefix.normalised_attention`) and differentiates that, so every
derivative order is exact.
"""

from __future__ import annotations

import torch

from . import _prefix
from ._runtime import autocast_disabled
from .feature_maps import FEATURE_MAPS, elu_plus_one

__all__ = ["attention", "forward", "tile_positions"]

# Positions per tile on the CPU. Its inputs, features, scores and states stay in the caches, and each of a
# tile's hundred or so operations has enough work that its few microseconds of dispatch do not dominate.
# B=2 H=8 N=1024, D=64, C=32, one thread, no autograd: tiles of 2048 positions 8.9 ms a call, 1024 9.9 ms (twice
# the operations), 4096 12.5 ms (their 7 MiB of buffers came from the kernel afresh on every call: 2,000 page
# faults); forward and backward: 2048 and 4096 alike, 1024 5 % and 8192 10-14 % slower.
CPU_TILE = 2048
# Elsewhere (a GPU) the operations are launched, not run, by Python: tiles as large as the memory allows.
DEVICE_TILE = 1 << 15


def tile_positions(device: torch.device) -> int:
    """Positions per tile on ``device``."""
    return CPU_TILE if device.type == "cpu" else DEVICE_TILE


def _tiles(rows: int, N: int, C: int, positions: int):
    """The tiles of a (rows, N) problem in chunks of C <= N: a list of row groups (r0, R, spans), each span
    (s0, m, c) a run of m chunks of c positions from position s0, in forward time order.

    Several whole rows per tile when a row is at most half a tile and holds whole chunks only (then the rows
    of a tile are contiguous in memory and its chunks form one batch); else one row per tile, its whole
    chunks in runs of ``positions // C``, and the partial chunk that remains (N % C positions) last."""
    n, p = divmod(N, C)
    if p == 0 and 2 * N <= positions:
        R = positions // N
        return [(r0, min(R, rows - r0), [(0, n, C)]) for r0 in range(0, rows, R)]
    G = max(1, positions // C)
    spans = [(c0 * C, min(G, n - c0), C) for c0 in range(0, n, G)]
    if p:
        spans.append((n * C, 1, p))
    return [(r, 1, spans) for r in range(rows)]


def _tile(x: torch.Tensor, r0: int, R: int, s0: int, m: int, c: int) -> torch.Tensor:
    """Rows r0 .. r0 + R of x (rows, N, E), positions s0 .. s0 + m c, as a batch of chunks (R m, c, E): a view
    (the rows of a tile of several rows are whole)."""
    return x[r0 : r0 + R, s0 : s0 + m * c].view(R * m, c, x.shape[-1])


def _features(kind: str | None, x: torch.Tensor, into: torch.Tensor | None, tmp: torch.Tensor | None) -> torch.Tensor:
    """phi(x) of a tile into the flat buffer ``into`` (x itself when ``kind`` is None: x holds features);
    ``tmp``, another flat buffer at least as large, holds elu + 1's x + 1."""
    if kind is None:
        return x
    out = into[: x.numel()].view(x.shape)
    if kind == "elu":
        return elu_plus_one(x, out=out, tmp=tmp[: x.numel()].view(x.shape))
    return torch.clamp(x, min=0.0, out=out)


def _slope_(kind: str, phi: torch.Tensor) -> torch.Tensor:
    """phi'(x) from phi(x), in place: min(phi, 1) for elu + 1, [phi > 0] for relu."""
    if kind == "elu":
        return phi.clamp_(max=1.0)
    return phi.sign_()  # relu's features are >= 0: sign is 1 where phi > 0, 0 elsewhere


def _add_state_products(pairs, x: torch.Tensor, carry, R: int, m: int, reverse: bool, spare):
    """:func:`attnbook._prefix._add_state_products` for a tile: x (R m, D, E) each chunk's own sum, carry
    (R, 1, D, E) or None (the row group's first tile); the states of short rows in the flat buffer ``spare``."""
    return _prefix._add_state_products(pairs, x.view(R, m, *x.shape[1:]), carry, reverse, spare)


def _vector_states(x: torch.Tensor, carry, R: int, m: int, reverse: bool):
    """The states of vectors x (R m, E), each chunk's own sum (:func:`attnbook._prefix._states`, one cumsum):
    as rows (R m, 1, E), and the new carry (R, 1, E); ``carry`` None for the row group's first tile."""
    states, carry = _prefix._states(x.view(R, m, x.shape[-1]), carry, reverse, loop=False)
    return states.view(R * m, 1, x.shape[-1]), carry


class _Buffers:
    """The scratch memory of one call, allocated once for its largest tile (flat, q's dtype and device): a
    tile's C x C matrices, or its states, or before them elu's x + 1 and other temporaries (``work``), its
    features (``fq``, ``fk``), dL/dnum (``gn``), and the states of a tile of several short rows (``spare``).
    The loop over the tiles allocates only a few numbers per chunk: on the CPU a fresh tensor of a few MiB
    costs a page fault per 4 KiB on every call (malloc maps it anew), as much time as the tile's products."""

    def __init__(self, q: torch.Tensor, plan, D: int, Dv: int, kind: str | None, grad: bool):
        most = max(R * m * c for _, R, spans in plan for _, m, c in spans)  # positions of the largest tile
        chunks = max(R * m for _, R, spans in plan for _, m, _ in spans)
        C = max(c for _, _, spans in plan for _, _, c in spans)
        sizes = {
            "work": max(most * C, chunks * D * Dv, most * max(D, Dv)),
            "fq": most * D if kind is not None else 0,
            "fk": most * D if kind is not None else 0,
            "gn": most * Dv if grad else 0,
            "spare": chunks * D * Dv
            if any(R > 1 and m < _prefix._IN_PLACE_CHUNKS for _, R, sp in plan for _, m, _ in sp)
            else 0,
        }
        # one allocation: malloc then reuses the same memory on the next call, where several buffers of a few
        # MiB each came partly fresh from the kernel (B=1, H=2, N=1024: 480 page faults a call, 1.7x slower)
        block, start = q.new_empty(sum(sizes.values())), 0
        for name, size in sizes.items():
            setattr(self, name, block[start : start + size] if size else None)
            start += size

    def view(self, t: int, *shape: int) -> torch.Tensor:
        """The first numbers of ``work`` as a (t, *shape) tensor."""
        n = t
        for size in shape:
            n *= size
        return self.work[:n].view(t, *shape)


def forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kind: str | None,
    drop: torch.Tensor | None,
    C: int,
    eps: float,
    out: torch.Tensor,
    recip: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal linear attention without autograd, written into ``out`` (rows, N, Dv), contiguous.

    q, k (rows, N, D): the inputs of the feature map ``kind`` ("elu", "relu"), or features when ``kind`` is
    None; v (rows, N, Dv); contiguous, one dtype. ``drop`` (rows, N, 1) bool marks padded keys (their features
    are zeroed; a built-in kind only: other maps' features come masked). ``recip`` (rows, N, 1), when given,
    receives 1 / (den + eps)."""
    rows, N, D = q.shape
    Dv = v.shape[-1]
    C = min(C, N)
    plan = _tiles(rows, N, C, tile_positions(q.device))
    buf = _Buffers(q, plan, D, Dv, kind, grad=False)
    for r0, R, spans in plan:
        carry = z = None  # (R, 1, D, Dv) sum of phi(k_j) v_j^T, (R, 1, D) sum of phi(k_j), over the tiles done
        for s0, m, c in spans:
            t = R * m
            ot, vt = _tile(out, r0, R, s0, m, c), _tile(v, r0, R, s0, m, c)  # (t, c, Dv)
            fq = _features(kind, _tile(q, r0, R, s0, m, c), buf.fq, buf.work)  # (t, c, D)
            fk = _features(kind, _tile(k, r0, R, s0, m, c), buf.fk, buf.work)
            if drop is not None and kind is not None:
                fk.masked_fill_(_tile(drop, r0, R, s0, m, c), 0.0)
            scores = torch.bmm(fq, fk.transpose(1, 2), out=buf.view(t, c, c)).tril_()  # (t, c, c)
            den = scores.sum(-1, keepdim=True).transpose(1, 2)  # (t, 1, c): the normaliser inside each chunk
            torch.bmm(scores, vt, out=ot)  # the numerator inside each chunk
            kv = torch.bmm(fk.transpose(1, 2), vt, out=buf.view(t, D, Dv))  # (t, D, Dv) each chunk's own sum
            zs, z = _vector_states(fk.sum(1), z, R, m, False)  # (t, 1, D) the keys of earlier chunks
            carry = _add_state_products([(ot, fq, False)], kv, carry, R, m, False, buf.spare)  # + phi(q) S
            den.baddbmm_(zs, fq.transpose(1, 2))  # + phi(q) . z, as a product with one row (t, 1, c)
            r = den.add_(eps).reciprocal_().transpose(1, 2)  # (t, c, 1)
            if recip is not None:
                _tile(recip, r0, R, s0, m, c).copy_(r)
            ot.mul_(r)  # times the reciprocal, as in fast-transformers
    return out


def backward(q, k, v, out, recip, g, kind, drop, C):
    """(dq, dk, dv) of :func:`forward` for the output gradient g (rows, N, Dv): the two passes of the module
    docstring, one row group after the other, each tile's features made again (but for the last tile of a
    group, which the pass back starts with while they are still in the buffers). With a built-in ``kind``
    dq and dk are the gradients of the raw q and k (the feature map's derivative applied), else of the
    features."""
    rows, N, D = q.shape
    Dv = v.shape[-1]
    C = min(C, N)
    plan = _tiles(rows, N, C, tile_positions(q.device))
    buf = _Buffers(q, plan, D, Dv, kind, grad=True)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)

    def tile_inputs(r0, R, s0, m, c):
        fq = _features(kind, _tile(q, r0, R, s0, m, c), buf.fq, buf.work)  # (t, c, D)
        fk = _features(kind, _tile(k, r0, R, s0, m, c), buf.fk, buf.work)
        if drop is not None and kind is not None:
            fk.masked_fill_(_tile(drop, r0, R, s0, m, c), 0.0)
        into = buf.gn[: R * m * c * Dv].view(R * m, c, Dv)
        gn = torch.mul(_tile(g, r0, R, s0, m, c), _tile(recip, r0, R, s0, m, c), out=into)  # dL/dnum
        gd = torch.mul(gn, _tile(out, r0, R, s0, m, c), out=buf.work[: gn.numel()].view(gn.shape))
        gd = gd.sum(-1, keepdim=True).neg_()  # (t, c, 1): dL/dden = -(g . out) r = -(gn . out)
        return fq, fk, gn, gd

    for r0, R, spans in plan:
        carry = z = None
        for i, (s0, m, c) in enumerate(spans):  # forwards in time: dphi(q), the in-chunk parts of dphi(k), dv
            t = R * m
            fq, fk, gn, gd = tile_inputs(r0, R, s0, m, c)
            vt = _tile(v, r0, R, s0, m, c)
            dqt, dkt, dvt = (_tile(x, r0, R, s0, m, c) for x in (dq, dk, dv))
            M = torch.bmm(gn, vt.transpose(1, 2), out=buf.view(t, c, c)).add_(gd).tril_()  # (t, c, c)
            torch.bmm(M, fk, out=dqt)
            torch.bmm(M.transpose(1, 2), fq, out=dkt)
            P = torch.bmm(fq, fk.transpose(1, 2), out=buf.view(t, c, c)).tril_()
            torch.bmm(P.transpose(1, 2), gn, out=dvt)
            kv = torch.bmm(fk.transpose(1, 2), vt, out=buf.view(t, D, Dv))  # each chunk's phi(k)^T v
            carry = _add_state_products([(dqt, gn, True)], kv, carry, R, m, False, buf.spare)  # + gn S^T
            zs, z = _vector_states(fk.sum(1), z, R, m, False)  # (t, 1, D)
            dqt.baddbmm_(gd, zs)  # + gd z^T
            if kind is not None and i < len(spans) - 1:  # the last span's features serve the pass back first
                dqt.mul_(_slope_(kind, fq))
        carry = w = None
        for i, (s0, m, c) in enumerate(reversed(spans)):  # backwards in time: the rest of dphi(k) and dv
            t = R * m
            if i > 0:  # the last span's features, gn and gd are still in the buffers
                fq, fk, gn, gd = tile_inputs(r0, R, s0, m, c)
            vt = _tile(v, r0, R, s0, m, c)
            dkt, dvt = _tile(dk, r0, R, s0, m, c), _tile(dv, r0, R, s0, m, c)
            U = torch.bmm(fq.transpose(1, 2), gn, out=buf.view(t, D, Dv))  # each chunk's phi(q)^T gn
            carry = _add_state_products([(dkt, vt, True), (dvt, fk, False)], U, carry, R, m, True, buf.spare)
            ws, w = _vector_states(torch.bmm(fq.transpose(1, 2), gd).view(t, D), w, R, m, True)
            dkt.add_(ws)  # + w
            if drop is not None and kind is not None:
                dkt.masked_fill_(_tile(drop, r0, R, s0, m, c), 0.0)  # padded keys' features were set to 0
            if kind is not None:
                if i == 0:
                    _tile(dq, r0, R, s0, m, c).mul_(_slope_(kind, fq))
                dkt.mul_(_slope_(kind, fk))
    return dq, dk, dv


class _CausalLinear(torch.autograd.Function):
    """Causal linear attention with the tiled backward of the module docstring; q, k raw inputs of a built-in
    ``kind`` or features (``kind`` None); all (rows, N, .) contiguous, one (accumulation) dtype."""

    @staticmethod
    def forward(ctx, q, k, v, kind, drop, C, eps):
        with autocast_disabled(q.device):
            out, recip = v.new_empty(v.shape), v.new_empty(*v.shape[:-1], 1)
            forward(q, k, v, kind, drop, C, eps, out, recip)
        ctx.save_for_backward(q, k, v, out, recip)
        ctx.kind, ctx.drop, ctx.C, ctx.eps = kind, drop, C, eps
        return out

    @staticmethod
    def backward(ctx, g):
        q, k, v, out, recip = ctx.saved_tensors
        need = ctx.needs_input_grad[:3]
        if torch.is_grad_enabled():  # a graph of the backward is being built: differentiate a recomputation
            return (
                *_differentiable_grads(q, k, v, g, ctx.kind, ctx.drop, ctx.C, ctx.eps, need),
                None,
                None,
                None,
                None,
            )
        with autocast_disabled(q.device):
            grads = backward(q, k, v, out, recip, g.contiguous(), ctx.kind, ctx.drop, ctx.C)
        return (*(x if n else None for x, n in zip(grads, need, strict=True)), None, None, None, None)


def _differentiable_grads(q, k, v, g, kind, drop, C, eps, need):
    """The first derivatives as a graph (for ``create_graph=True``): the output recomputed through
    differentiable operations (:func:`attnbook._prefix.normalised_attention`) and differentiated."""
    fq, fk = (q, k) if kind is None else (FEATURE_MAPS[kind](q), FEATURE_MAPS[kind](k))
    if drop is not None and kind is not None:
        fk = fk.masked_fill(drop, 0.0)
    out = _prefix.normalised_attention(fq, fk, v, C, eps)
    inputs = [x for x, n in zip((q, k, v), need, strict=True) if n]
    grads = iter(torch.autograd.grad(out, inputs, g, create_graph=True, allow_unused=True))
    return tuple(next(grads) if n else None for n in need)


def attention(q, k, v, kind: str | None, drop: torch.Tensor | None, C: int, eps: float) -> torch.Tensor:
    """Causal linear attention on q, k (rows, N, D), v (rows, N, Dv) of one accumulation dtype, validated:
    differentiable any number of times. ``kind`` and ``drop`` as in :func:`forward`."""
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    return _CausalLinear.apply(q, k, v, kind, drop, C, eps)
