"""The annex's causal linear attention for the CPU without autograd: features, numerator and normaliser tile by tile.

Speed only: the mathematics is :func:`attnbook.linear_attention`'s chunked form (chapter 2), whose numbers this
gives to rounding. It runs on one thread only, and stays because ``benchmarks/bench_annex.py`` measures it at
least 1.3 times faster than that plain form there in every condition (quiet, after other work, beside busy
processes); the table is in ``benchmarks/results/PERFORMANCE.md``.

    out_i = sum_{j <= i} (phi(q_i) . phi(k_j)) v_j / (sum_{j <= i} phi(q_i) . phi(k_j) + eps)

Chunked as in Katharopoulos et al., "Transformers are RNNs" (ICML 2020, Sec. 3.3), in the chunked form of
e.g. Hua et al., "Transformer Quality in Linear Time" (ICML 2022): inside a chunk of ell positions the masked
ell x ell product, between chunks the carried state S = sum_j phi(k_j) v_j^T (R, Dv) and z = sum_j phi(k_j) (R).

A *tile* is a run of whole chunks of one row of (B H), or several whole rows (:func:`_tiles`). For the
built-in feature maps (elementwise: ``kind`` "elu" or "relu") each tile's features are made into small
buffers just before its products read them, so no (B, H, N, R) tensor of features is ever made, and a tile's
work stays in the caches (:data:`CPU_TILE` positions). The chunk states of a tile are *slots* of one buffer,
the carry from the tiles before in the first slot, so one running sum over the slots gives every chunk's state
and the next tile's carry (:class:`_Workspace`).

Only inference takes this path (no gradient is needed): under autograd the plain form runs, differentiated by
autograd. A tiled backward written by hand was here until ``benchmarks/bench_annex.py`` measured it 1.25 times the
plain form beside busy processes (the rule is 1.3 in every condition; ``benchmarks/results/annex_16a7ffc.json``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

__all__ = ["causal_linear_attention", "forward", "CPU_TILE"]

# Positions per tile: its inputs, features, scores and states (about 300 numbers a position at R = Dv = 64) stay
# in a core's caches, and each of a tile's few dozen operations has enough work that its microsecond or two of
# dispatch does not dominate. benchmarks/bench_annex.py also times tiles of half and twice this size: the
# annex's lead over the plain form does not hinge on it.
CPU_TILE = 2048

# A plan of tiles (:func:`_tiles`): row groups (r0, nr, spans), nr rows from row r0, each span (s0, m, c) a run
# of m chunks of c positions.
_Plan = list[tuple[int, int, list[tuple[int, int, int]]]]


def _tiles(rows: int, N: int, ell: int, positions: int) -> _Plan:
    """The tiles of a (rows, N) problem in chunks of ell <= N: a list of row groups (r0, nr, spans), each span
    (s0, m, c) a run of m chunks of c positions from position s0, in forward time order.

    Several whole rows per tile when a row is at most half a tile and holds whole chunks only (then the rows
    of a tile are contiguous in memory and its chunks form one batch); else one row per tile, its whole
    chunks in runs of ``positions // ell``, and the partial chunk that remains (N % ell positions) last."""
    n, p = divmod(N, ell)
    if p == 0 and 2 * N <= positions:
        nr = positions // N
        return [(r0, min(nr, rows - r0), [(0, n, ell)]) for r0 in range(0, rows, nr)]
    per_run = max(1, positions // ell)
    spans = [(c0 * ell, min(per_run, n - c0), ell) for c0 in range(0, n, per_run)]
    if p:
        spans.append((n * ell, 1, p))
    return [(r, 1, spans) for r in range(rows)]


def _tiler(
    tensors: Sequence[torch.Tensor | None], rows: int, N: int, ell: int
) -> Callable[[int, int, int, int, int], list[Any]]:
    """A function of a tile (r0, nr, s0, m, c) that gives each of ``tensors`` ((rows, N, .), or None) as the
    tile's batch of chunks (nr m, c, .): when every chunk is whole, one slice of a view made once (a tile's
    chunks are consecutive in memory), else a slice and a view (:func:`_tile`).

    The tiles are typed Any: each is a tensor, or None where its tensor is None (the optional mask), which the
    caller knows position by position."""
    if N % ell:
        return lambda r0, nr, s0, m, c: [None if x is None else _tile(x, r0, nr, s0, m, c) for x in tensors]
    n = N // ell
    chunks = [None if x is None else x.view(rows * n, ell, x.shape[-1]) for x in tensors]

    def tile(r0: int, nr: int, s0: int, m: int, c: int) -> list[Any]:
        a = r0 * n + s0 // ell
        return [None if x is None else x[a : a + nr * m] for x in chunks]

    return tile


def _tile(x: torch.Tensor, r0: int, nr: int, s0: int, m: int, c: int) -> torch.Tensor:
    """Rows r0 .. r0 + nr of x (rows, N, E), positions s0 .. s0 + m c, as a batch of chunks (nr m, c, E): a view
    (the rows of a tile of several rows are whole)."""
    return x[r0 : r0 + nr, s0 : s0 + m * c].view(nr * m, c, x.shape[-1])


def _rows(x: torch.Tensor, nr: int) -> tuple[torch.Tensor, ...]:
    """A tile's batch of chunks (nr m, ...) as its nr rows' batches (m, ...)."""
    return (x,) if nr == 1 else x.view(nr, -1, *x.shape[1:]).unbind(0)


class _Workspace:
    """The scratch memory of one call and the views of it that every tile reuses: one allocation (flat, q's
    dtype and device), made once per call. On the CPU a fresh tensor of a few MiB costs a page fault per 4 KiB
    on every call (B=1, H=2, N=1024: separate buffers took 480 faults a call and 1.7x the time), and making a
    view costs about a microsecond, as much as a small operation: tiles of 2,048 positions once spent a tenth
    of their time making the same views again (B=2 H=8 N=1024, one thread: 8.4 -> 7.5 ms a forward).

    ``S`` (nr, m + 1, D, Dv) holds, per row of a tile, m + 1 *slots* of chunk states; ``Z`` (nr, m + 1, D) the
    same for the sums of features. The carry (the sum over the tiles done) is in slot 0 and chunk j's own sum in
    slot j + 1; a running sum over the slots, in place, leaves in slot j the state *before* chunk j for every
    chunk, and in slot m the next tile's carry. m is the most chunks of a tile of the call; a tile with fewer
    uses the first slots."""

    def __init__(self, q: torch.Tensor, plan: _Plan, D: int, Dv: int):
        self.nr = max(nr for _, nr, _ in plan)
        self.m = max(m for _, _, spans in plan for _, m, _ in spans)
        most = max(nr * m * c for _, nr, spans in plan for _, m, c in spans)  # positions of the largest tile
        ell = max(c for _, _, spans in plan for _, _, c in spans)
        slots = self.nr * (self.m + 1)
        sizes = {
            "fq": most * D,
            "fk": most * D,
            "scores": most * ell,  # the masked ell x ell matrices
            "den": most,  # the normaliser
            "S": slots * D * Dv,
            "Z": slots * D,
        }
        self.flat: dict[str, torch.Tensor] = {}
        block, start = q.new_empty(sum(sizes.values())), 0
        for name, size in sizes.items():
            self.flat[name] = block[start : start + size]
            start += size
        self.S = self.flat["S"].view(self.nr, self.m + 1, D, Dv)
        self.Z = self.flat["Z"].view(self.nr, self.m + 1, D)
        self.slots, self.zslots = self.S.unbind(1), self.Z.unbind(1)  # (nr, D, Dv) and (nr, D) each
        self._views: dict[tuple[int, int, int], _TileViews] = {}
        self.D = D

    def views(self, nr: int, m: int, c: int) -> _TileViews:
        """The views of a tile of nr rows of m chunks of c positions (a namespace), made once per shape."""
        key = (nr, m, c)
        if key not in self._views:
            self._views[key] = self._make_views(nr, m, c)
        return self._views[key]

    def _make_views(self, nr: int, m: int, c: int) -> _TileViews:
        t, D, w = nr * m, self.D, _TileViews()

        def take(name: str, *shape: int) -> torch.Tensor:
            n = 1
            for size in shape:
                n *= size
            return self.flat[name][:n].view(*shape)

        w.fq, w.fk = take("fq", t, c, D), take("fk", t, c, D)
        w.fkT = w.fk.transpose(1, 2)
        w.fq_rows, w.fkT_rows = _rows(w.fq, nr), _rows(w.fkT, nr)
        w.scores = take("scores", t, c, c)
        w.den = take("den", t, c, 1)  # a column per chunk
        w.denT_rows = _rows(w.den.view(t, 1, c), nr)  # and as a row per chunk
        S, Z = self.S, self.Z
        w.hi, w.lo = [S[i, 1 : m + 1] for i in range(nr)], [S[i, :m] for i in range(nr)]  # (m, D, Dv)
        w.zhi, w.zlo = [Z[i, 1 : m + 1] for i in range(nr)], [Z[i, :m] for i in range(nr)]  # (m, D)
        w.zlo_row = [x.unsqueeze(1) for x in w.zlo]  # (m, 1, D)
        w.Z_run = Z[:, : m + 1]  # the sums' slots a running sum covers
        return w


class _TileViews:
    """Views of a :class:`_Workspace` for one tile shape (attributes set by :meth:`_Workspace._make_views`)."""

    # the features' buffers and their views
    fq: torch.Tensor
    fk: torch.Tensor
    fq_rows: tuple[torch.Tensor, ...]
    fkT: torch.Tensor
    fkT_rows: tuple[torch.Tensor, ...]
    # the masked ell x ell matrices, the normaliser (a column, and a row, per chunk)
    scores: torch.Tensor
    den: torch.Tensor
    denT_rows: tuple[torch.Tensor, ...]
    # per row of the tile: the state slots after and before each chunk, and the sums' slots
    hi: list[torch.Tensor]
    lo: list[torch.Tensor]
    zhi: list[torch.Tensor]
    zlo: list[torch.Tensor]
    zlo_row: list[torch.Tensor]
    Z_run: torch.Tensor


def _features(kind: str, w: _TileViews, qt: torch.Tensor, kt: torch.Tensor, dt: torch.Tensor | None) -> None:
    """A tile's features made into ``w``'s buffers (padded keys', marked by ``dt``, zeroed)."""
    for x, f in ((qt, w.fq), (kt, w.fk)):
        if kind == "elu":
            torch.ops.aten.elu.out(x, out=f).add_(1.0)  # elu(x) + 1, into the buffer
        else:
            torch.clamp(x, min=0.0, out=f)  # relu
    if dt is not None:
        w.fk.masked_fill_(dt, 0.0)


def _carry(ws: _Workspace, source: int | None) -> None:
    """Puts the carry into slot 0 of ``ws``'s states: from slot ``source`` (where the tile before left it), or
    zero for a row group's first tile (``source`` None)."""
    for slots in (ws.slots, ws.zslots):
        if source is None:
            slots[0].zero_()
        else:
            slots[0].copy_(slots[source])


def _running_sum(ws: _Workspace, w: _TileViews, m: int) -> None:
    """The running sum over slots 0 .. m of the states (``S`` and ``Z``), in place. For ``S``, one in-place
    addition per slot on views made once: torch's CPU cumsum over a middle dimension walks each number down the
    slots with the slots' stride (16 KiB at R = Dv = 64), several times slower; for the small ``Z``, one cumsum."""
    for j in range(1, m + 1):
        ws.slots[j].add_(ws.slots[j - 1])
    w.Z_run.cumsum_(1)


def forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kind: str,
    drop: torch.Tensor | None,
    ell: int,
    eps: float,
    out: torch.Tensor,
) -> torch.Tensor:
    """Causal linear attention without autograd, written into ``out`` (rows, N, Dv), contiguous.

    q, k (rows, N, D): the inputs of the feature map ``kind`` ("elu", "relu"); v (rows, N, Dv); contiguous, one
    dtype. ``drop`` (rows, N, 1) bool marks padded keys (their features are zeroed)."""
    rows, N, D = q.shape
    Dv = v.shape[-1]
    ell = min(ell, N)
    plan = _tiles(rows, N, ell, CPU_TILE)
    ws = _Workspace(q, plan, D, Dv)
    tiles = _tiler([q, k, v, out, drop], rows, N, ell)
    for r0, nr, spans in plan:
        last = None  # the slot that holds the carry: none for a row group's first tile (zero)
        for s0, m, c in spans:
            qt, kt, vt, ot, dt = tiles(r0, nr, s0, m, c)
            w = ws.views(nr, m, c)
            _carry(ws, last)
            _features(kind, w, qt, kt, dt)
            scores = torch.bmm(w.fq, w.fkT, out=w.scores).tril_()  # (t, c, c)
            torch.sum(scores, -1, keepdim=True, out=w.den)  # (t, c, 1): the normaliser inside each chunk
            torch.bmm(scores, vt, out=ot)  # the numerator inside each chunk
            for i, v_i in enumerate(_rows(vt, nr)):  # each chunk's own sums, into slots 1 .. m
                torch.bmm(w.fkT_rows[i], v_i, out=w.hi[i])
                torch.sum(w.fkT_rows[i], -1, out=w.zhi[i])
            _running_sum(ws, w, m)
            for i, o_i in enumerate(_rows(ot, nr)):  # + phi(q) S and + phi(q) . z, with each chunk's states
                o_i.baddbmm_(w.fq_rows[i], w.lo[i])
                w.denT_rows[i].baddbmm_(w.zlo_row[i], w.fq_rows[i].transpose(1, 2))  # a product with one row
            r = w.den.add_(eps)  # (t, c, 1)
            if eps == 0:  # no weight at all (keys all padding): the numerator is 0 too, and the output 0
                r.masked_fill_(r == 0, 1.0)
            ot.mul_(r.reciprocal_())  # times the reciprocal, as in fast-transformers
            last = m
    return out


def causal_linear_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kind: str, keep: torch.Tensor | None, ell: int, eps: float
) -> torch.Tensor:
    """Causal linear attention without autograd on q, k (B, H, N, D), v (B, H, N, Dv) of one (accumulation) dtype,
    validated, with padded keys' q and v already zero: phi = the built-in ``kind``, ``keep`` (B, 1, N, 1) True = a
    real key."""
    B, H, N, _ = q.shape
    rows = B * H
    drop = None if keep is None else keep.logical_not().expand(B, H, N, 1).reshape(rows, N, 1).contiguous()
    q3, k3, v3 = (x.reshape(rows, N, x.shape[-1]).contiguous() for x in (q, k, v))
    return forward(q3, k3, v3, kind, drop, ell, eps, torch.empty_like(v3)).view(B, H, N, -1)
