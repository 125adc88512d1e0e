"""The annex's causal linear attention for the CPU: features, numerator, normaliser and gradients tile by tile.

Speed only: the mathematics is :func:`attnbook.linear_attention`'s chunked form (chapter 2), whose numbers this
gives to rounding. It stays because ``benchmarks/bench_annex.py`` measures it faster than that plain form in
every condition (quiet, after other work, beside busy processes, one and two threads); the table is in
``benchmarks/results/PERFORMANCE.md``.

    out_i = sum_{j <= i} (phi(q_i) . phi(k_j)) v_j / (sum_{j <= i} phi(q_i) . phi(k_j) + eps)

Chunked as in Katharopoulos et al., "Transformers are RNNs" (ICML 2020, Sec. 3.3), in the chunked form of
e.g. Hua et al., "Transformer Quality in Linear Time" (ICML 2022): inside a chunk of ell positions the masked
ell x ell product, between chunks the carried state S = sum_j phi(k_j) v_j^T (R, Dv) and z = sum_j phi(k_j) (R).

A *tile* is a run of whole chunks of one row of (B H), or several whole rows (:func:`_tiles`). For the
built-in feature maps (elementwise: ``kind`` "elu" or "relu") each tile's features are made into small
buffers just before its products read them, so no (B, H, N, R) tensor of features is ever made, and a tile's
work stays in the caches (:data:`CPU_TILE` positions). The chunk states of a tile are *slots* of one buffer,
the carry from the tiles before in the first (or, backwards in time, the last) slot, so one running sum over
the slots gives every chunk's state and the next tile's carry (:class:`_Workspace`).

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

A double backward (``create_graph=True``) differentiates the plain form, which the caller passes in
(:func:`causal_linear_attention`'s ``plain``), so every derivative order is exact.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

__all__ = ["causal_linear_attention", "forward", "backward", "CPU_TILE"]

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

    The tiles are typed Any: each is a tensor, or None where its tensor is None (the optional masks and
    reciprocals), which the caller knows position by position."""
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


def _slope_(kind: str, phi: torch.Tensor) -> torch.Tensor:
    """phi'(x) from phi(x), in place: min(phi, 1) for elu + 1, [phi > 0] for relu."""
    if kind == "elu":
        return phi.clamp_(max=1.0)
    return phi.sign_()  # relu's features are >= 0: sign is 1 where phi > 0, 0 elsewhere


class _Workspace:
    """The scratch memory of one call and the views of it that every tile reuses: one allocation (flat, q's
    dtype and device), made once per call. On the CPU a fresh tensor of a few MiB costs a page fault per 4 KiB
    on every call (B=1, H=2, N=1024: separate buffers took 480 faults a call and 1.7x the time), and making a
    view costs about a microsecond, as much as a small operation: tiles of 2,048 positions once spent a tenth
    of their time making the same views again (B=2 H=8 N=1024, one thread: 8.4 -> 7.5 ms a forward).

    ``S`` (nr, m + 1, D, Dv) holds, per row of a tile, m + 1 *slots* of chunk states; ``Z`` (nr, m + 1, D) the
    same for the sums of features. Forwards in time the carry (the sum over the tiles done) is in slot 0 and
    chunk j's own sum in slot j + 1; a running sum over the slots, in place, leaves in slot j the state
    *before* chunk j for every chunk, and in slot m the next tile's carry. Backwards in time chunk j's own sum
    is in slot j and the carry in slot m; the running sum from the end leaves chunk j's state (the later
    chunks) in slot j + 1 and the earlier tile's carry in slot 0. m is the most chunks of a tile of the call;
    a tile with fewer uses the first slots, so the carry's slot does not depend on the tile's shape."""

    def __init__(self, q: torch.Tensor, plan: _Plan, D: int, Dv: int, grad: bool):
        self.nr = max(nr for _, nr, _ in plan)
        self.m = max(m for _, _, spans in plan for _, m, _ in spans)
        most = max(nr * m * c for _, nr, spans in plan for _, m, c in spans)  # positions of the largest tile
        ell = max(c for _, _, spans in plan for _, _, c in spans)
        slots = self.nr * (self.m + 1)
        sizes = {
            "fq": most * D,
            "fk": most * D,
            "work": most * Dv if grad else 0,  # gn times out
            "scores": most * ell,  # the masked ell x ell matrices
            "den": most,  # forwards the normaliser, backwards dL/dden
            "gn": most * Dv if grad else 0,  # dL/dnum
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
        self.D, self.Dv, self.grad = D, Dv, grad

    def views(self, nr: int, m: int, c: int) -> _TileViews:
        """The views of a tile of nr rows of m chunks of c positions (a namespace), made once per shape."""
        key = (nr, m, c)
        if key not in self._views:
            self._views[key] = self._make_views(nr, m, c)
        return self._views[key]

    def _make_views(self, nr: int, m: int, c: int) -> _TileViews:
        t, D, Dv, w = nr * m, self.D, self.Dv, _TileViews()

        def take(name: str, *shape: int) -> torch.Tensor:
            n = 1
            for size in shape:
                n *= size
            return self.flat[name][:n].view(*shape)

        w.fq, w.fk = take("fq", t, c, D), take("fk", t, c, D)
        w.fkT = w.fk.transpose(1, 2)
        w.fq_rows, w.fk_rows, w.fkT_rows = _rows(w.fq, nr), _rows(w.fk, nr), _rows(w.fkT, nr)
        w.scores = take("scores", t, c, c)
        w.den = take("den", t, c, 1)  # a column per chunk
        w.den_rows, w.denT_rows = _rows(w.den, nr), _rows(w.den.view(t, 1, c), nr)  # and as a row per chunk
        if self.grad:
            w.gn, w.gn_out = take("gn", t, c, Dv), take("work", t, c, Dv)
            w.gn_rows = _rows(w.gn, nr)
        S, Z = self.S, self.Z
        w.hi, w.lo = [S[i, 1 : m + 1] for i in range(nr)], [S[i, :m] for i in range(nr)]  # (m, D, Dv)
        w.hiT, w.loT = [x.transpose(1, 2) for x in w.hi], [x.transpose(1, 2) for x in w.lo]
        w.zhi, w.zlo = [Z[i, 1 : m + 1] for i in range(nr)], [Z[i, :m] for i in range(nr)]  # (m, D)
        w.zhi_row, w.zlo_row = [x.unsqueeze(1) for x in w.zhi], [x.unsqueeze(1) for x in w.zlo]  # (m, 1, D)
        w.S_run, w.Z_run = S[:, : m + 1], Z[:, : m + 1]  # the slots a running sum covers
        return w


class _TileViews:
    """Views of a :class:`_Workspace` for one tile shape (attributes set by :meth:`_Workspace._make_views`)."""

    # the features' buffers and their views
    fq: torch.Tensor
    fk: torch.Tensor
    fq_rows: tuple[torch.Tensor, ...]
    fk_rows: tuple[torch.Tensor, ...]
    fkT: torch.Tensor
    fkT_rows: tuple[torch.Tensor, ...]
    # the masked ell x ell matrices, the normaliser (a column and a row per chunk), dL/dnum and its product
    scores: torch.Tensor
    den: torch.Tensor
    den_rows: tuple[torch.Tensor, ...]
    denT_rows: tuple[torch.Tensor, ...]
    gn: torch.Tensor
    gn_out: torch.Tensor
    gn_rows: tuple[torch.Tensor, ...]
    # per row of the tile: the state slots after and before each chunk, transposed, and the sums' slots
    hi: list[torch.Tensor]
    lo: list[torch.Tensor]
    hiT: list[torch.Tensor]
    loT: list[torch.Tensor]
    zhi: list[torch.Tensor]
    zlo: list[torch.Tensor]
    zhi_row: list[torch.Tensor]
    zlo_row: list[torch.Tensor]
    S_run: torch.Tensor
    Z_run: torch.Tensor


# A tile's features, then the gradients gn = g r of the numerator and gd = -(gn . out) of the normaliser.
_TileInputs = tuple[
    torch.Tensor,
    torch.Tensor,
    tuple[torch.Tensor, ...],
    tuple[torch.Tensor, ...],
    torch.Tensor,
    tuple[torch.Tensor, ...],
    torch.Tensor,
    torch.Tensor,
]


def _features(kind: str, w: _TileViews, qt: torch.Tensor, kt: torch.Tensor, dt: torch.Tensor | None) -> list[Any]:
    """A tile's features made into ``w``'s buffers (padded keys', marked by ``dt``, zeroed), and their views:
    phi(q), phi(k), phi(q) and phi(k) per row, phi(k)^T, and phi(k)^T per row."""
    for x, f in ((qt, w.fq), (kt, w.fk)):
        if kind == "elu":
            torch.ops.aten.elu.out(x, out=f).add_(1.0)  # elu(x) + 1, into the buffer
        else:
            torch.clamp(x, min=0.0, out=f)  # relu
    if dt is not None:
        w.fk.masked_fill_(dt, 0.0)
    return [w.fq, w.fk, w.fq_rows, w.fk_rows, w.fkT, w.fkT_rows]


def _carry(ws: _Workspace, into: int, source: int | None) -> None:
    """Puts the carry into slot ``into`` of ``ws``'s states: from slot ``source`` (where the tile before left
    it), or zero for a row group's first tile (``source`` None)."""
    for slots in (ws.slots, ws.zslots):
        if source is None:
            slots[into].zero_()
        else:
            slots[into].copy_(slots[source])


def _running_sum(ws: _Workspace, w: _TileViews, m: int, reverse: bool) -> None:
    """The running sum over slots 0 .. m of the states (``S`` and ``Z``), in place: forwards, or from the end
    when ``reverse``. For ``S``, one in-place addition per slot on views made once: torch's CPU cumsum over a
    middle dimension walks each number down the slots with the slots' stride (16 KiB at R = Dv = 64), several
    times slower; for the small ``Z``, one cumsum."""
    pairs = ((j, j + 1) for j in range(m - 1, -1, -1)) if reverse else ((j, j - 1) for j in range(1, m + 1))
    for this, before in pairs:
        ws.slots[this].add_(ws.slots[before])
    if reverse:
        w.Z_run.copy_(w.Z_run.flip(1).cumsum(1).flip(1))
    else:
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
    recip: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal linear attention without autograd, written into ``out`` (rows, N, Dv), contiguous.

    q, k (rows, N, D): the inputs of the feature map ``kind`` ("elu", "relu"); v (rows, N, Dv); contiguous, one
    dtype. ``drop`` (rows, N, 1) bool marks padded keys (their features are zeroed). ``recip`` (rows, N, 1), when
    given, receives 1 / (den + eps)."""
    rows, N, D = q.shape
    Dv = v.shape[-1]
    ell = min(ell, N)
    plan = _tiles(rows, N, ell, CPU_TILE)
    ws = _Workspace(q, plan, D, Dv, grad=False)
    tiles = _tiler([q, k, v, out, drop, recip], rows, N, ell)
    for r0, nr, spans in plan:
        last = None  # the slot that holds the carry: none for a row group's first tile (zero)
        for s0, m, c in spans:
            qt, kt, vt, ot, dt, rt = tiles(r0, nr, s0, m, c)
            w = ws.views(nr, m, c)
            _carry(ws, 0, last)
            fq, fk, fq_rows, _, fkT, fkT_rows = _features(kind, w, qt, kt, dt)
            scores = torch.bmm(fq, fkT, out=w.scores).tril_()  # (t, c, c)
            torch.sum(scores, -1, keepdim=True, out=w.den)  # (t, c, 1): the normaliser inside each chunk
            torch.bmm(scores, vt, out=ot)  # the numerator inside each chunk
            for i, v_i in enumerate(_rows(vt, nr)):  # each chunk's own sums, into slots 1 .. m
                torch.bmm(fkT_rows[i], v_i, out=w.hi[i])
                torch.sum(fkT_rows[i], -1, out=w.zhi[i])
            _running_sum(ws, w, m, False)
            for i, o_i in enumerate(_rows(ot, nr)):  # + phi(q) S and + phi(q) . z, with each chunk's states
                o_i.baddbmm_(fq_rows[i], w.lo[i])
                w.denT_rows[i].baddbmm_(w.zlo_row[i], fq_rows[i].transpose(1, 2))  # a product with one row
            r = w.den.add_(eps)  # (t, c, 1)
            if eps == 0:  # no weight at all (keys all padding): the numerator is 0 too, and the output 0
                r.masked_fill_(r == 0, 1.0)
            r.reciprocal_()
            if rt is not None:
                rt.copy_(r)
            ot.mul_(r)  # times the reciprocal, as in fast-transformers
            last = m
    return out


def backward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    recip: torch.Tensor,
    g: torch.Tensor,
    kind: str,
    drop: torch.Tensor | None,
    ell: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) of :func:`forward` for the output gradient g (rows, N, Dv): the two passes of the module
    docstring, one row group after the other, each tile's features made again (but for the last tile of a
    group, which the pass back starts with while they are still in the buffers). dq and dk are the gradients of
    the raw q and k (the feature map's derivative applied)."""
    rows, N, D = q.shape
    Dv = v.shape[-1]
    ell = min(ell, N)
    plan = _tiles(rows, N, ell, CPU_TILE)
    ws = _Workspace(q, plan, D, Dv, grad=True)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    tiles = _tiler([q, k, v, out, recip, g, drop, dq, dk, dv], rows, N, ell)

    def tile_inputs(
        w: _TileViews,
        qt: torch.Tensor,
        kt: torch.Tensor,
        dt: torch.Tensor | None,
        gt: torch.Tensor,
        rt: torch.Tensor,
        ot: torch.Tensor,
    ) -> _TileInputs:
        features = _features(kind, w, qt, kt, dt)
        gn = torch.mul(gt, rt, out=w.gn)  # dL/dnum
        torch.sum(torch.mul(gn, ot, out=w.gn_out), -1, keepdim=True, out=w.den).neg_()  # dL/dden = -(gn . out)
        return (*features, gn, w.den)

    for r0, nr, spans in plan:
        last = None
        for i, (s0, m, c) in enumerate(spans):  # forwards in time: dphi(q), the in-chunk parts of dphi(k), dv
            qt, kt, vt, ot, rt, gt, dt, dqt, dkt, dvt = tiles(r0, nr, s0, m, c)
            w = ws.views(nr, m, c)
            _carry(ws, 0, last)
            fq, fk, fq_rows, fk_rows, fkT, fkT_rows, gn, gd = tile_inputs(w, qt, kt, dt, gt, rt, ot)
            M = torch.bmm(gn, vt.transpose(1, 2), out=w.scores).add_(gd).tril_()  # (t, c, c)
            torch.bmm(M, fk, out=dqt)
            torch.bmm(M.transpose(1, 2), fq, out=dkt)
            P = torch.bmm(fq, fkT, out=w.scores).tril_()
            torch.bmm(P.transpose(1, 2), gn, out=dvt)
            for j, v_j in enumerate(_rows(vt, nr)):  # each chunk's phi(k)^T v and sum of phi(k), slots 1 .. m
                torch.bmm(fkT_rows[j], v_j, out=w.hi[j])
                torch.sum(fkT_rows[j], -1, out=w.zhi[j])
            _running_sum(ws, w, m, False)
            for j, dq_j in enumerate(_rows(dqt, nr)):  # + gn S^T + gd z^T, with each chunk's states
                dq_j.baddbmm_(w.gn_rows[j], w.loT[j])
                dq_j.addcmul_(w.den_rows[j], w.zlo_row[j])  # (an outer product: elementwise is quicker)
            if i < len(spans) - 1:  # the last span's features serve the pass back first
                dqt.mul_(_slope_(kind, fq))
            last = m
        last = None
        for i, (s0, m, c) in enumerate(reversed(spans)):  # backwards in time: the rest of dphi(k) and dv
            qt, kt, vt, ot, rt, gt, dt, dqt, dkt, dvt = tiles(r0, nr, s0, m, c)
            w = ws.views(nr, m, c)
            if i > 0:  # the last span's features, gn and gd are still in the buffers
                fq, fk, fq_rows, fk_rows, fkT, fkT_rows, gn, gd = tile_inputs(w, qt, kt, dt, gt, rt, ot)
            _carry(ws, m, None if last is None else 0)
            for j in range(nr):  # each chunk's phi(q)^T gn and gd^T phi(q), into slots 0 .. m - 1
                torch.bmm(fq_rows[j].transpose(1, 2), w.gn_rows[j], out=w.lo[j])
                torch.bmm(w.denT_rows[j], fq_rows[j], out=w.zlo_row[j])  # a row: 6x quicker than a column
            _running_sum(ws, w, m, True)
            v_rows, dk_rows, dv_rows = _rows(vt, nr), _rows(dkt, nr), _rows(dvt, nr)
            for j in range(nr):  # + U v and + w for dphi(k), + U^T phi(k) for dv, with each chunk's states
                dk_rows[j].baddbmm_(v_rows[j], w.hiT[j]).add_(w.zhi_row[j])
                dv_rows[j].baddbmm_(fk_rows[j], w.hi[j])
            if dt is not None:
                dkt.masked_fill_(dt, 0.0)  # padded keys' features were set to 0
            if i == 0:
                dqt.mul_(_slope_(kind, fq))
            dkt.mul_(_slope_(kind, fk))
            last = m
    return dq, dk, dv


class _CausalLinear(torch.autograd.Function):
    """Causal linear attention with the tiled backward of the module docstring: q, k the raw inputs of the
    built-in ``kind``, all (rows, N, .) contiguous, one dtype; ``plain`` the plain form, whose derivatives serve
    a double backward."""

    # ctx: torch's FunctionCtx, which also carries this Function's own attributes; torch declares neither those
    # nor the context's type in forward and backward, hence Any.
    @staticmethod
    def forward(
        ctx: Any,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kind: str,
        drop: torch.Tensor | None,
        ell: int,
        eps: float,
        plain: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor],
    ) -> torch.Tensor:
        out, recip = v.new_empty(v.shape), v.new_empty(*v.shape[:-1], 1)
        forward(q, k, v, kind, drop, ell, eps, out, recip)
        ctx.save_for_backward(q, k, v, out, recip)
        ctx.kind, ctx.drop, ctx.ell, ctx.plain = kind, drop, ell, plain
        return out

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        q, k, v, out, recip = ctx.saved_tensors
        need = ctx.needs_input_grad[:3]
        if torch.is_grad_enabled():  # a graph of the backward is being built: differentiate the plain form
            with torch.enable_grad():
                y = ctx.plain(q, k, v)
            wanted = [x for x, n in zip((q, k, v), need, strict=True) if n]
            given = iter(torch.autograd.grad(y, wanted, g, create_graph=True, allow_unused=True))
            return (*(next(given) if n else None for n in need), None, None, None, None, None)
        grads = backward(q, k, v, out, recip, g.contiguous(), ctx.kind, ctx.drop, ctx.ell)
        return (*(x if n else None for x, n in zip(grads, need, strict=True)), None, None, None, None, None)


def causal_linear_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kind: str,
    keep: torch.Tensor | None,
    ell: int,
    eps: float,
    plain: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor],
) -> torch.Tensor:
    """Causal linear attention on q, k (B, H, N, D), v (B, H, N, Dv) of one (accumulation) dtype, validated, with
    padded keys' q and v already zero: phi = the built-in ``kind``, ``keep`` (B, 1, N, 1) True = a real key.
    Differentiable any number of times: a double backward differentiates ``plain`` (the plain form, on the
    same (B, H, N, .) inputs)."""
    B, H, N, _ = q.shape
    rows = B * H
    drop = None if keep is None else keep.logical_not().expand(B, H, N, 1).reshape(rows, N, 1).contiguous()
    q3, k3, v3 = (x.reshape(rows, N, x.shape[-1]).contiguous() for x in (q, k, v))
    if not (torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v))):
        return forward(q3, k3, v3, kind, drop, ell, eps, torch.empty_like(v3)).view(B, H, N, -1)

    def plain_rows(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return plain(*(x.view(B, H, N, x.shape[-1]) for x in (q, k, v))).reshape(rows, N, -1)

    # torch's Function.apply is untyped (no-untyped-call)
    out: torch.Tensor = _CausalLinear.apply(q3, k3, v3, kind, drop, ell, eps, plain_rows)  # type: ignore[no-untyped-call]
    return out.view(B, H, N, -1)
