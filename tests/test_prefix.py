"""causal_dot_product: the chunked prefix product shared by causal linear and flow attention."""

import functools

import pytest
import torch
from support import assert_matches_reference, tol

from attnbook import _prefix
from attnbook._prefix import causal_dot_product
from attnbook.lab.profiling import peak_memory


def masked_product(q, k, v):
    """The definition: the N x N matrix of q_i . k_j, zero above the diagonal, times v (float64)."""
    q, k, v = (x.double() for x in (q, k, v))
    scores = (q @ k.transpose(-2, -1)).tril()  # (B, H, N, N)
    return scores @ v  # (B, H, N, Dv)


def inputs(N, D=5, Dv=3, dtype=torch.float64, B=2, H=3):
    return (
        torch.randn(B, H, N, D, dtype=dtype),
        torch.randn(B, H, N, D, dtype=dtype),
        torch.randn(B, H, N, Dv, dtype=dtype),
    )


@pytest.mark.parametrize("chunk_size", [1, 3, 8, 64, 200], ids=lambda c: f"chunk{c}")
@pytest.mark.parametrize("N", [1, 7, 63, 100])
def test_outputs_and_gradients_equal_the_masked_matrix_for_any_chunk_size(N, chunk_size):
    product = functools.partial(causal_dot_product, chunk_size=chunk_size)
    assert_matches_reference(product, masked_product, list(inputs(N)), dtype=torch.float64)


@pytest.mark.parametrize("in_place", [1, 1000], ids=["states_in_place", "states_copied"])
@pytest.mark.parametrize("N", [36, 37], ids=["whole_chunks", "partial_chunk"])
@pytest.mark.parametrize("block_numbers", [50, 200, 1000, 1 << 22], ids=lambda b: f"block{b}")
def test_blocks_of_chunks_do_not_change_the_result(monkeypatch, block_numbers, N, in_place):
    """One chunk per block, several, whole rows, several rows at once (their chunk states read in place or
    from a shifted copy), forwards and (in the backward pass) backwards in time: the same numbers."""
    monkeypatch.setattr(_prefix, "_BLOCK_NUMBERS", block_numbers)
    monkeypatch.setattr(_prefix, "_IN_PLACE_CHUNKS", in_place)
    q, k, v = (x.requires_grad_() for x in inputs(N))
    out = causal_dot_product(q, k, v, 3)
    torch.testing.assert_close(out, masked_product(q, k, v), **tol(torch.float64))
    upstream = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), upstream)
    ref_grads = torch.autograd.grad(masked_product(q, k, v), (q, k, v), upstream)
    for g, r in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(g, r, **tol(torch.float64))


def test_gradcheck():
    q, k, v = (x.requires_grad_() for x in inputs(6, D=2, Dv=3, B=1, H=2))
    assert torch.autograd.gradcheck(lambda q, k, v: causal_dot_product(q, k, v, 4), (q, k, v))


def test_only_requested_gradients_and_partial_requires_grad():
    q, k, v = inputs(9)
    v.requires_grad_()
    out = causal_dot_product(q, k, v, 4)
    (dv,) = torch.autograd.grad(out, (v,), torch.ones_like(out))
    expected = torch.autograd.grad(masked_product(q, k, v), (v,), torch.ones_like(out))[0]
    torch.testing.assert_close(dv, expected, **tol(torch.float64))


@pytest.mark.parametrize(
    "dtype",
    [torch.float16, torch.bfloat16, torch.float32, torch.float64],
    ids=["float16", "bfloat16", "float32", "float64"],
)
def test_returns_the_accumulation_dtype(dtype):
    q, k, v = inputs(5, dtype=dtype)
    out = causal_dot_product(q, k, v, 2)
    assert out.dtype == torch.promote_types(dtype, torch.float32)
    torch.testing.assert_close(out.double(), masked_product(q, k, v), **tol(torch.float32))


def test_half_inputs_do_not_overflow():
    """Prefix sums of 2048 products of size ~ 10 x 10 x 100 exceed float16's 65504; float32 holds them."""
    q, k, v = (torch.full((1, 1, 2048, 4), x, dtype=torch.float16) for x in (1.0, 1.0, 100.0))
    out = causal_dot_product(q, k, v, 64)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out[0, 0, :, 0], 400.0 * torch.arange(1, 2049, dtype=torch.float32))


def test_memory_is_far_below_an_n_by_n_matrix():
    """Forward and backward need a few copies of q at most, not the N x N matrix (16x more here)."""
    N = 4096
    q, k, v = inputs(N, D=64, Dv=64, dtype=torch.float32, B=1, H=1)
    qkv_bytes = 3 * q.numel() * 4
    peak = peak_memory(lambda: causal_dot_product(q, k, v, 64), existing=(q, k, v))
    assert peak < 1.5 * qkv_bytes < N * N * 4, peak
    q.requires_grad_()
    out = causal_dot_product(q, k, v, 64)
    grad = torch.ones_like(out)
    peak_backward = peak_memory(lambda: out.backward(grad), existing=(q, k, v, out, grad))
    assert peak_backward < 2.5 * qkv_bytes, peak_backward


def test_bad_chunk_size_raises_a_clear_error():
    q, k, v = inputs(4)
    for bad in (0, -1):
        with pytest.raises(ValueError, match="chunk_size must be an int >= 1"):
            causal_dot_product(q, k, v, bad)
    for bad in (2.5, True, "64"):  # a wrong type is a TypeError
        with pytest.raises(TypeError, match="chunk_size must be an int, got"):
            causal_dot_product(q, k, v, bad)


@pytest.mark.parametrize("N, chunk_size", [(5, 2), (4, 4)], ids=["partial_chunk", "one_chunk"])
def test_second_derivatives_are_exact(N, chunk_size):
    """The backward is made of the same products (forwards and backwards in time), so it differentiates again;
    before, it was once_differentiable and causal linear attention's second derivative silently lost a term."""
    q, k, v = (x.requires_grad_() for x in inputs(N, D=2, Dv=2, B=1, H=1))
    assert torch.autograd.gradgradcheck(lambda q, k, v: causal_dot_product(q, k, v, chunk_size), (q, k, v))


def test_runs_with_autocast_on_and_accumulates_in_float32():
    q, k, v = inputs(9, dtype=torch.float32)
    for dtype in (torch.bfloat16, torch.float16):
        with torch.autocast("cpu", dtype=dtype):
            out = causal_dot_product(q, k, v, 4)
        assert out.dtype == torch.float32
        torch.testing.assert_close(out.double(), masked_product(q, k, v), **tol(torch.float32))


@pytest.mark.parametrize("reverse", [False, True], ids=["forwards", "backwards"])
@pytest.mark.parametrize("loop", [True, False, None], ids=["loop_cpu", "cumsum", "default"])
def test_both_scans_of_the_chunk_states_are_cumulative_sums(loop, reverse):
    """The loop of in-place additions (the CPU's default) and the cumsum agree."""
    x = torch.randn(2, 7, 3, 4, dtype=torch.float64)
    expected = x.flip(1).cumsum(1).flip(1) if reverse else x.cumsum(1)
    torch.testing.assert_close(_prefix._scan(x.clone(), reverse, loop), expected, **tol(torch.float64))
