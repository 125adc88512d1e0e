"""attnbook._causal: causal linear attention tile by tile (features, numerator, normaliser, gradients)."""

import functools

import pytest
import torch
from support import assert_matches_reference, feature_map, qkv, tol

import attnbook
from attnbook import _causal, _prefix, reference


@pytest.mark.parametrize(
    "rows, N, C, positions",
    [(6, 36, 3, 12), (6, 36, 3, 72), (6, 36, 3, 1000), (6, 37, 3, 12), (6, 37, 3, 1000), (1, 5, 5, 4), (7, 8, 4, 64)],
)
def test_tiles_cover_every_position_once_in_time_order(rows, N, C, positions):
    """Every (row, position) belongs to exactly one chunk of one tile; a tile of several rows spans whole
    rows; within a row the spans follow each other in time; no tile exceeds its positions but by one chunk."""
    seen = torch.zeros(rows, N, dtype=torch.int64)
    for r0, R, spans in _causal._tiles(rows, N, C, positions):
        assert R == 1 or spans == [(0, N // C, C)], "several rows per tile only for whole rows of whole chunks"
        end = 0
        for s0, m, c in spans:
            assert s0 == end and c <= C and m >= 1
            assert R * m * c <= max(positions, C)
            seen[r0 : r0 + R, s0 : s0 + m * c] += 1
            end = s0 + m * c
        assert end == N
    assert (seen == 1).all()


LAYOUTS = [  # positions per tile
    pytest.param(3, id="one_chunk_per_tile"),  # tiles of one row, one chunk: the carry alone
    pytest.param(10, id="chunks_per_tile"),  # one row, several runs of chunks (the last run shorter)
    pytest.param(80, id="rows_per_tile"),  # several whole rows (N = 36), or one row a tile (N = 37)
    pytest.param(10_000, id="all_rows"),
]


@pytest.mark.parametrize("mask", [False, True], ids=["no_mask", "padded"])
@pytest.mark.parametrize("fmap", ["elu", "relu", "performer"])
@pytest.mark.parametrize("N", [36, 37], ids=["whole_chunks", "partial_chunk"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_tile_layout_gives_the_reference_outputs_and_gradients(monkeypatch, layout, N, fmap, mask):
    """With and without autograd, for features made in the tiles (elu, relu) or before (Performer), with padded
    keys: the float64 definition's output and the gradients autograd takes through it."""
    monkeypatch.setattr(_causal, "CPU_TILE", layout)
    B, H, D, Dv = 2, 3, 4, 5
    q, k, v = qkv(B, H, N, N, D, Dv, dtype=torch.float64)
    pad = None
    if mask:
        pad = torch.rand(B, N, generator=torch.Generator().manual_seed(1)) > 0.3
        pad[:, 0] = True
    phi = feature_map(fmap, D)
    padding = None if pad is None else ~pad  # pad marks the real tokens; key_padding_mask the padded ones
    kwargs = {"is_causal": True, "feature_map": phi, "key_padding_mask": padding, "chunk_size": 3}
    expected = functools.partial(reference.linear_attention, is_causal=True, feature_map=phi, key_padding_mask=padding)
    assert_matches_reference(
        lambda q, k, v: attnbook.linear_attention(q, k, v, **kwargs), expected, [q, k, v], dtype=torch.float64
    )
    with torch.no_grad():
        out = attnbook.linear_attention(q, k, v, **kwargs)
    torch.testing.assert_close(out, expected(q, k, v), **tol(torch.float64))


@pytest.mark.parametrize("N", [36, 37], ids=["whole_chunks", "partial_chunk"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_running_sum_as_one_cumsum_gives_the_same_outputs_and_gradients(monkeypatch, layout, N):
    """Off the CPU the chunk states' running sums are one cumsum over the slots, forwards and backwards in
    time (no GPU here: forced on the CPU), carried between tiles as on the CPU: the float64 definition's
    output and gradients."""
    monkeypatch.setattr(_causal, "CPU_TILE", layout)
    monkeypatch.setattr(_prefix, "by_additions", lambda device: False)
    q, k, v = qkv(2, 3, N, N, 4, 5, dtype=torch.float64)
    fast = functools.partial(attnbook.linear_attention, is_causal=True, chunk_size=3)
    assert_matches_reference(
        fast, functools.partial(reference.linear_attention, is_causal=True), [q, k, v], dtype=torch.float64
    )
    with torch.no_grad():
        out = fast(q, k, v)
    torch.testing.assert_close(out, reference.linear_attention(q, k, v, is_causal=True), **tol(torch.float64))


@pytest.mark.parametrize("mask", [False, True], ids=["no_mask", "padded"])
@pytest.mark.parametrize("fmap", ["elu", "relu", "performer"])
def test_second_derivatives_are_exact(monkeypatch, fmap, mask):
    """A backward with create_graph differentiates a recomputation through differentiable products, so
    gradgradcheck passes for every kind of feature map, padded keys included, across tiles."""
    monkeypatch.setattr(_causal, "CPU_TILE", 4)
    q, k, v = (x.requires_grad_() for x in qkv(1, 2, 7, 7, 3, 2, dtype=torch.float64))
    pad = torch.tensor([[True, True, False, True, True, False, True]]) if mask else None
    phi = feature_map(fmap, 3)

    def attend(q, k, v):
        padding = None if pad is None else ~pad
        return attnbook.linear_attention(
            q, k, v, is_causal=True, feature_map=phi, key_padding_mask=padding, chunk_size=2
        )

    assert torch.autograd.gradcheck(attend, (q, k, v))
    assert torch.autograd.gradgradcheck(attend, (q, k, v))


def test_only_the_requested_gradients_are_returned():
    q, k, v = qkv(1, 2, 9, 9, 3, 2, dtype=torch.float64)
    v.requires_grad_()
    out = attnbook.linear_attention(q, k, v, is_causal=True, chunk_size=4)
    (dv,) = torch.autograd.grad(out, (v,), torch.ones_like(out))
    expected = reference.linear_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(dv, torch.autograd.grad(expected, (v,), torch.ones_like(out))[0], **tol(torch.float64))


def test_non_contiguous_inputs_and_upstream_gradients():
    """q, k, v as a layer makes them (a transposed view of (B, L, H, D)) and a non-contiguous upstream."""
    B, L, H, D = 2, 40, 3, 4
    x = torch.randn(B, L, H, 3 * D, dtype=torch.float64, requires_grad=True)
    q, k, v = (t.transpose(1, 2) for t in x.split(D, dim=-1))  # (B, H, L, D), non-contiguous
    out = attnbook.linear_attention(q, k, v, is_causal=True, chunk_size=8)
    expected = reference.linear_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(out, expected, **tol(torch.float64))
    upstream = torch.randn(B, L, H, D, dtype=torch.float64).transpose(1, 2)
    (g,) = torch.autograd.grad(out, x, upstream)
    (r,) = torch.autograd.grad(expected, x, upstream)
    torch.testing.assert_close(g, r, **tol(torch.float64))


def test_inputs_that_are_column_slices_without_autograd():
    """One row of (B H) whose q, k, v are column slices of a wider tensor (reshaped to rows, they stay
    non-contiguous views): the inference path gives the reference."""
    x = torch.randn(1, 1, 50, 12, dtype=torch.float64)
    q, k, v = x.split(4, dim=-1)  # (1, 1, 50, 4) each, rows 12 numbers apart
    with torch.no_grad():
        out = attnbook.linear_attention(q, k, v, is_causal=True, chunk_size=8)
    torch.testing.assert_close(out, reference.linear_attention(q, k, v, is_causal=True), **tol(torch.float64))
