"""linear_attention, linear_attention_step and LinearAttention against the float64 definitions."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from published import fast_transformers_linear_attention
from support import DEVICES, FEATURE_MAP_IDS, FLOAT_DTYPES, assert_matches_reference, feature_map, paths, qkv, tol

import attnbook
from attnbook import reference
from attnbook.feature_maps import PerformerFeatures
from attnbook.lab.profiling import peak_memory
from attnbook.linear import chunked_causal_product
from attnbook.mechanisms import MECHANISMS

SHAPES = {  # (B, H, N, M, D, Dv)
    "square": (2, 3, 7, 7, 8, 8),
    "more_keys": (1, 2, 5, 11, 4, 6),
    "more_queries": (2, 1, 9, 4, 4, 3),
    "single_token": (1, 1, 1, 1, 3, 2),
    "long_odd": (1, 2, 63, 63, 5, 7),
}
SQUARE = {name: s for name, s in SHAPES.items() if s[2] == s[3]}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("fmap", FEATURE_MAP_IDS)
@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
def test_non_causal_matches_reference_outputs_and_gradients(shape, fmap, dtype, device):
    phi = feature_map(fmap, shape[4])
    if isinstance(phi, PerformerFeatures):
        phi = phi.to(device)
    assert_matches_reference(
        lambda q, k, v: attnbook.linear_attention(q, k, v, feature_map=phi),
        lambda q, k, v: reference.linear_attention(q, k, v, feature_map=phi),
        list(qkv(*shape, device=device)),
        dtype=dtype,
    )


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("chunk_size", [1, 3, 64], ids=lambda c: f"chunk{c}")
@pytest.mark.parametrize("fmap", FEATURE_MAP_IDS)
@pytest.mark.parametrize("shape", SQUARE.values(), ids=SQUARE.keys())
def test_causal_matches_reference_outputs_and_gradients(shape, fmap, chunk_size, dtype, device, request):
    if device == "cuda" and fmap == "relu" and dtype == torch.float32:
        # On an H200 (torch 2.11) long_odd at chunk 64 missed the bar below: a gradient error of 2.8e-5 against
        # the float32 definition's 2.6e-6, both about 3e-7 of the ~80-sized terms whose difference it is. The
        # bar is one draw of summation order (cuBLAS's differs from the CPU's), so there it may miss.
        request.applymarker(pytest.mark.xfail(reason="ill-conditioned relu gradient; summation order", strict=False))
    phi = feature_map(fmap, shape[4])
    if isinstance(phi, PerformerFeatures):
        phi = phi.to(device)
    # relu features are 0 for about half of the inputs. A row of q with a single positive entry makes its
    # output independent of that entry's size but for eps, so the true gradient (~1e-3) is a difference of
    # terms ~1e5 times larger (~80): float32 cannot meet the table's tolerance there however it sums (the
    # masked matrix computed in float32 misses it by as much), so that computation sets the bar.
    literal = None
    if fmap == "relu" and dtype == torch.float32:
        literal = lambda q, k, v: _masked_relu_attention(q, k, v)  # noqa: E731
    assert_matches_reference(
        lambda q, k, v: attnbook.linear_attention(q, k, v, is_causal=True, feature_map=phi, chunk_size=chunk_size),
        lambda q, k, v: reference.linear_attention(q, k, v, is_causal=True, feature_map=phi),
        list(qkv(*shape, device=device)),
        dtype=dtype,
        baseline=literal,
    )


def _masked_relu_attention(q, k, v, eps=1e-6):
    """Causal linear attention with relu features as the masked N x N matrix, in the inputs' dtype."""
    a = (torch.relu(q) @ torch.relu(k).transpose(-1, -2)).tril()  # (B, H, N, N)
    return (a / (a.sum(-1, keepdim=True) + eps)) @ v


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_key_padding_mask_matches_reference_outputs_and_gradients(causal):
    B, H, N, D, Dv = 3, 2, 9, 4, 5
    real = torch.ones(B, N, dtype=torch.bool)
    real[1, 6:] = False
    real[2, ::2] = False
    for dtype in (torch.float32, torch.float64):
        assert_matches_reference(
            lambda q, k, v: attnbook.linear_attention(q, k, v, is_causal=causal, key_padding_mask=~real, chunk_size=4),
            lambda q, k, v: reference.linear_attention(q, k, v, is_causal=causal, key_padding_mask=~real),
            list(qkv(B, H, N, N, D, Dv)),
            dtype=dtype,
        )


def masked_product(q, k, v):
    """The definition of the causal product: the N x N matrix of q_i . k_j, zero above the diagonal, times v."""
    q, k, v = (x.double() for x in (q, k, v))
    return (q @ k.transpose(-2, -1)).tril() @ v  # (B, H, N, Dv)


@pytest.mark.parametrize("chunk_size", [1, 3, 8, 64, 200], ids=lambda c: f"chunk{c}")
@pytest.mark.parametrize("N", [1, 7, 63, 100])
def test_the_chunked_causal_product_is_the_masked_matrix_for_any_chunk(N, chunk_size):
    """chunked_causal_product, chapter 2's one causal product (linear and Flow-Attention use it): outputs and
    gradients of the masked N x N product, for chunks that divide N or not, and longer than N; with a carried
    state S_0 the output gains q_i^T S_0 and the final state is S_0 + sum_j k_j v_j^T."""
    q, k, v = qkv(2, 3, N, N, 5, 3, dtype=torch.float64)
    assert_matches_reference(
        lambda q, k, v: chunked_causal_product(q, k, v, chunk_size)[0], masked_product, [q, k, v], dtype=torch.float64
    )
    S0 = torch.randn(2, 3, 5, 3, dtype=torch.float64)
    out, final = chunked_causal_product(q, k, v, chunk_size, S0)
    torch.testing.assert_close(out, masked_product(q, k, v) + q @ S0, **tol(torch.float64))
    torch.testing.assert_close(final, S0 + k.transpose(-2, -1) @ v, **tol(torch.float64))


@pytest.mark.parametrize("mechanism", ["linear", "flow", "decay", "gated", "delta"])
def test_a_chunk_longer_than_the_sequence_is_the_sequence(mechanism):
    """chunk_size = 10**12 on 9 tokens: the chunk was padded to 10**12 positions (a failed allocation; 20,000 took
    seconds and 1.6 GB for 10 tokens, 10**30 a TypeError in F.pad); it is now cut to the sequence."""
    q, k, v = qkv(1, 2, 9, 9, 4, 4)
    if mechanism in ("linear", "flow"):
        fn = getattr(attnbook, f"{mechanism}_attention")
        huge, small = (fn(q, k, v, is_causal=True, chunk_size=c) for c in (10**12, 4))
    else:
        fn = MECHANISMS[mechanism].function
        extra = (
            -torch.rand(1, 2, 9, 4)
            if mechanism == "gated"
            else torch.rand(1, 2, 9) * (-1 if mechanism == "decay" else 1)
        )
        huge, small = (fn(q, k, v, extra, chunk_size=c) for c in (10**12, 4))
    torch.testing.assert_close(huge, small)


def test_bfloat16_products_accumulate_and_carry_their_state_in_float32():
    """For bfloat16 inputs the chunked form's products take bfloat16 (a GPU's matrix units, as
    flash-linear-attention's chunked kernels do) and their results and the carried states are float32: the
    error is that of rounding the inputs once, not of a bfloat16 running sum over N."""
    q, k, v = qkv(1, 2, 4096, 4096, 16, 16, dtype=torch.bfloat16)
    out, state = attnbook.linear_attention(q, k, v, is_causal=True, output_final_state=True)
    assert out.dtype == torch.bfloat16 and state.S.dtype == torch.float32
    ref = reference.linear_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(out.double(), ref, **tol(torch.bfloat16))
    acc = attnbook.linear_attention(q.float(), k.float(), v.float(), is_causal=True)
    assert (out.float() - acc).abs().max() < 0.05 * acc.abs().max()


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("eps", [1e-6, 0.5], ids=["eps_default", "eps_large"])
def test_non_causal_equals_the_fast_transformers_numbers(eps, dtype):
    q, k, v = qkv(2, 3, 6, 10, 4, 5, dtype=dtype)
    q = q * 3  # rows whose elu + 1 features are tiny make eps visible
    ours = attnbook.linear_attention(q, k, v, eps=eps)  # (B, H, N, Dv)
    seed = fast_transformers_linear_attention(*(x.transpose(1, 2) for x in (q, k, v)), eps).transpose(1, 2)
    torch.testing.assert_close(ours, seed, **tol(dtype))
    torch.testing.assert_close(reference.linear_attention(q, k, v, eps=eps), seed.double(), **tol(dtype))


@pytest.mark.parametrize("fmap", ["elu", "performer"])
@pytest.mark.parametrize("N", [1, 7, 63, 100])
def test_chunked_equals_one_chunk_equals_recurrent_equals_loop(N, fmap):
    """The causal result does not depend on the chunk size (dividing N or not) and equals the RNN form."""
    phi = feature_map(fmap, 6)
    q, k, v = qkv(2, 3, N, N, 6, 5, dtype=torch.float64)
    one_chunk = attnbook.linear_attention(q, k, v, is_causal=True, feature_map=phi, chunk_size=N)
    for c in (1, 5, 16, 64, 1000):
        torch.testing.assert_close(
            attnbook.linear_attention(q, k, v, is_causal=True, feature_map=phi, chunk_size=c),
            one_chunk,
            **tol(torch.float64),
            msg=lambda m, c=c: f"chunk_size={c}: {m}",
        )
    state, outs = None, []
    for t in range(N):
        out_t, state = attnbook.linear_attention_step(q[:, :, t], k[:, :, t], v[:, :, t], state, feature_map=phi)
        outs.append(out_t)
    torch.testing.assert_close(torch.stack(outs, dim=2), one_chunk, **tol(torch.float64))
    torch.testing.assert_close(
        reference.linear_attention_loop(q, k, v, feature_map=phi),
        reference.linear_attention(q, k, v, is_causal=True, feature_map=phi),
        **tol(torch.float64),
    )
    torch.testing.assert_close(
        one_chunk, reference.linear_attention_loop(q, k, v, feature_map=phi), **tol(torch.float64)
    )


def test_recurrent_state_is_the_sum_of_outer_products_in_float32():
    q, k, v = qkv(2, 2, 5, 5, 3, 4, dtype=torch.bfloat16)
    state = None
    for t in range(5):
        out_t, state = attnbook.linear_attention_step(q[:, :, t], k[:, :, t], v[:, :, t], state)
        assert out_t.dtype == torch.bfloat16 and out_t.shape == (2, 2, 4)
    assert isinstance(state, attnbook.LinearState)
    assert state.S.dtype == state.z.dtype == torch.float32
    fk = torch.nn.functional.elu(k.float()) + 1  # (B, H, N, D)
    torch.testing.assert_close(state.S, torch.einsum("bhnr,bhnv->bhrv", fk, v.float()), **tol(torch.float32))
    torch.testing.assert_close(state.z, fk.sum(dim=2), **tol(torch.float32))


def test_recurrent_step_gradients_match_the_loop_reference():
    q, k, v = (x.requires_grad_() for x in qkv(1, 2, 6, 6, 3, 4, dtype=torch.float64))
    state, outs = None, []
    for t in range(6):
        out_t, state = attnbook.linear_attention_step(q[:, :, t], k[:, :, t], v[:, :, t], state)
        outs.append(out_t)
    upstream = torch.randn(1, 2, 6, 4, dtype=torch.float64)
    grads = torch.autograd.grad(torch.stack(outs, 2), (q, k, v), upstream)
    ref_grads = torch.autograd.grad(reference.linear_attention_loop(q, k, v), (q, k, v), upstream)
    for g, r in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(g, r, **tol(torch.float64))


def test_gradcheck_tiny():
    q, k, v = (x.double().requires_grad_() for x in qkv(1, 2, 5, 5, 3, 2))
    real = torch.tensor([[True, True, False, True, False]])
    phi = PerformerFeatures(4, 3, seed=0)
    assert torch.autograd.gradcheck(lambda q, k, v: attnbook.linear_attention(q, k, v), (q, k, v))
    assert torch.autograd.gradcheck(
        lambda q, k, v: attnbook.linear_attention(q, k, v, key_padding_mask=~real, feature_map=phi), (q, k, v)
    )
    assert torch.autograd.gradcheck(
        lambda q, k, v: attnbook.linear_attention(q, k, v, is_causal=True, chunk_size=2), (q, k, v)
    )
    assert torch.autograd.gradcheck(
        lambda q, k, v: attnbook.linear_attention(
            q, k, v, is_causal=True, feature_map=phi, key_padding_mask=~real, chunk_size=3
        ),
        (q, k, v),
    )
    step = attnbook.linear_attention_step
    assert torch.autograd.gradcheck(lambda q, k, v: step(q[:, :, 0], k[:, :, 0], v[:, :, 0])[0], (q, k, v))


@pytest.mark.parametrize("fmap", ["elu", "relu", "performer"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_padded_keys_set_to_1e9_change_nothing(causal, fmap):
    phi = feature_map(fmap, 4)
    B, H, N, D = 2, 3, 10, 4
    q, k, v = qkv(B, H, N, N, D, D)
    real = torch.ones(B, N, dtype=torch.bool)
    real[0, 7:] = False
    real[1, 2] = False
    out = attnbook.linear_attention(q, k, v, is_causal=causal, feature_map=phi, key_padding_mask=~real, chunk_size=3)
    k2, v2 = k.clone(), v.clone()
    k2[~real[:, None, :, None].expand_as(k)] = 1e9
    v2[~real[:, None, :, None].expand_as(v)] = -1e9
    k2.requires_grad_()
    v2.requires_grad_()
    out2 = attnbook.linear_attention(q, k2, v2, is_causal=causal, feature_map=phi, key_padding_mask=~real, chunk_size=3)
    torch.testing.assert_close(out2, out, **tol(torch.float32))
    out2.backward(torch.randn_like(out2))
    for g in (k2.grad, v2.grad):
        assert torch.isfinite(g).all()
        assert (g.transpose(1, 2)[~real] == 0).all(), "padded keys and values must get zero gradient"
    # ... and masking equals dropping the padded keys (non-causal: batch 0 has 7 real keys)
    if not causal:
        torch.testing.assert_close(
            out[:1], attnbook.linear_attention(q[:1], k[:1, :, :7], v[:1, :, :7], feature_map=phi), **tol(torch.float32)
        )


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["float16", "bfloat16"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_half_inputs_accumulate_in_float32_without_overflow(causal, dtype):
    """Sums over 4096 keys with values ~100 exceed float16's range (65504); float32 accumulation keeps them."""
    B, H, N, D = 1, 2, 4096, 8
    q, k = torch.randn(B, H, N, D) * 3, torch.randn(B, H, N, D) * 3
    v = torch.randn(B, H, N, D) * 100
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    out = attnbook.linear_attention(q, k, v, is_causal=causal, chunk_size=100)
    assert out.dtype == dtype
    assert torch.isfinite(out).all()
    expected = attnbook.linear_attention(q.float(), k.float(), v.float(), is_causal=causal)
    # the output's own rounding dominates: compare relative to the values' scale (100)
    torch.testing.assert_close(out.float() / 100, expected / 100, **tol(dtype))
    qs, ks, vs = (x.detach().clone().requires_grad_() for x in (q, k, v))
    attnbook.linear_attention(qs, ks, vs, is_causal=causal).sum().backward()
    for g in (qs.grad, ks.grad, vs.grad):
        assert g.dtype == dtype and torch.isfinite(g).all()


@pytest.mark.parametrize("plain", [False, True], ids=["annex", "plain"])
@pytest.mark.parametrize("grad", [False, True], ids=["inference", "training"])
def test_causal_memory_is_a_few_copies_of_the_inputs_not_n_by_n(grad, plain):
    """Causal forward (and backward) extra memory is a few copies of q, k, v and out, for the plain chunked form
    (O(N (R + ell) + N R Dv / ell) beside them) and the annex's tiles alike: far from one N x N matrix."""
    N, D = 4096, 64
    q, k, v = qkv(1, 1, N, N, D, D)
    io_bytes = 4 * q.numel() * q.element_size()  # q, k, v and the output
    with paths(plain):
        if not grad:
            with torch.no_grad():
                peak = peak_memory(lambda: attnbook.linear_attention(q, k, v, is_causal=True), existing=(q, k, v))
        else:
            q.requires_grad_()

            def forward_backward():
                out = attnbook.linear_attention(q, k, v, is_causal=True)
                out.backward(torch.ones_like(out))

            peak = peak_memory(forward_backward, existing=(q, k, v))
    assert peak < 3 * io_bytes < N * N * 4, f"peak {peak} bytes for q, k, v, out of {io_bytes} bytes"


@pytest.mark.parametrize("B, H, N", [(1, 4, 16384), (2, 4, 8192)], ids=["long", "batched"])
def test_the_annex_needs_at_most_twice_the_output_for_causal_inference(B, H, N):
    """Without autograd the annex's causal tiles allocate at most twice their output in all (the output
    included): the features of one tile at a time, never the (B, H, N, R) features, key prefix sums or per-chunk
    states of the whole batch (the plain form holds N / ell chunk states: about 9 outputs at N = 16384)."""
    q, k, v = qkv(B, H, N, N, 64, 64)
    with paths(plain=False), torch.no_grad():
        peak = peak_memory(lambda: attnbook.linear_attention(q, k, v, is_causal=True), existing=(q, k, v))
    out_bytes = v.numel() * v.element_size()
    assert peak <= 2 * out_bytes, f"peak {peak / 2**20:.1f} MiB for an output of {out_bytes / 2**20:.1f} MiB"


@settings(max_examples=20, deadline=None)
@given(n=st.integers(2, 12), cut=st.integers(0, 11), chunk=st.integers(1, 8), seed=st.integers(0, 2**16))
def test_causal_output_ignores_the_future(n, cut, chunk, seed):
    cut = min(cut, n - 2)  # at least one future position
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, 2, n, 3, generator=g, dtype=torch.float64) for _ in range(3))
    k2, v2 = k.clone(), v.clone()
    k2[..., cut + 1 :, :] += 5.0
    v2[..., cut + 1 :, :] -= 3.0
    a = attnbook.linear_attention(q, k, v, is_causal=True, chunk_size=chunk)
    b = attnbook.linear_attention(q, k2, v2, is_causal=True, chunk_size=chunk)
    torch.testing.assert_close(a[..., : cut + 1, :], b[..., : cut + 1, :])
    assert not torch.allclose(a[..., cut + 1 :, :], b[..., cut + 1 :, :])  # the future does matter later on


@settings(max_examples=20, deadline=None)
@given(n=st.integers(1, 9), m=st.integers(1, 9), seed=st.integers(0, 2**16))
def test_non_causal_is_permutation_equivariant(n, m, seed):
    """Permuting queries permutes the output; permuting keys and values together changes nothing."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, 2, n, 3, generator=g, dtype=torch.float64)
    k = torch.randn(2, 2, m, 3, generator=g, dtype=torch.float64)
    v = torch.randn(2, 2, m, 4, generator=g, dtype=torch.float64)
    pq, pk = torch.randperm(n, generator=g), torch.randperm(m, generator=g)
    out = attnbook.linear_attention(q, k, v)
    torch.testing.assert_close(attnbook.linear_attention(q[:, :, pq], k, v), out[:, :, pq])
    torch.testing.assert_close(attnbook.linear_attention(q, k[:, :, pk], v[:, :, pk]), out)


@settings(max_examples=20, deadline=None)
@given(n=st.integers(1, 9), m=st.integers(1, 9), seed=st.integers(0, 2**16))
def test_weights_are_non_negative_and_rows_sum_to_almost_one(n, m, seed):
    """With positive features the output is a convex combination of the values (up to eps)."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, 1, x, 3, generator=g, dtype=torch.float64) for x in (n, m, m))
    out, weights = reference.linear_attention(q, k, v, eps=0.0, return_weights=True)
    assert (weights >= 0).all()
    torch.testing.assert_close(weights.sum(-1), torch.ones(1, 1, n, dtype=torch.float64))
    fast = attnbook.linear_attention(q, k, v, eps=0.0)
    torch.testing.assert_close(fast, out)
    assert (fast <= v.amax(dim=-2, keepdim=True) + 1e-9).all()
    assert (fast >= v.amin(dim=-2, keepdim=True) - 1e-9).all()


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_a_learnable_feature_map_gets_gradients(causal):
    """A feature map with parameters is trained through linear_attention even if q, k, v need no gradient."""

    class Scaled(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.scale = torch.nn.Parameter(torch.tensor(0.7, dtype=torch.float64))

        def forward(self, x):
            return torch.nn.functional.elu(self.scale * x) + 1

    phi = Scaled()
    q, k, v = qkv(1, 2, 6, 6, 3, 4, dtype=torch.float64)
    out = attnbook.linear_attention(q, k, v, is_causal=causal, feature_map=phi, chunk_size=4)
    (grad,) = torch.autograd.grad(out.sum(), phi.scale)
    ref = reference.linear_attention(q, k, v, is_causal=causal, feature_map=phi)
    (ref_grad,) = torch.autograd.grad(ref.sum(), phi.scale)
    torch.testing.assert_close(grad, ref_grad)
    assert grad != 0


def test_relu_row_without_features_is_zero_not_nan():
    q = -torch.ones(1, 1, 2, 3)  # relu(q) = 0: nothing to attend with
    k, v = torch.randn(1, 1, 4, 3), torch.randn(1, 1, 4, 2)
    out = attnbook.linear_attention(q, k, v, feature_map="relu")
    assert torch.equal(out, torch.zeros_like(out))


def test_bad_arguments_raise_value_error():
    q, k, v = qkv(2, 3, 4, 5, 2, 2)
    with pytest.raises(ValueError, match=r"N == M.*q \(2, 3, 4, 2\), k \(2, 3, 5, 2\)"):
        attnbook.linear_attention(q, k, v, is_causal=True)
    with pytest.raises(ValueError, match="feature_map must be 'elu', 'relu', .*got 'softmax'"):
        attnbook.linear_attention(q, k, v, feature_map="softmax")
    with pytest.raises(TypeError, match="linear_attention: feature_map must be 'elu', 'relu'"):
        attnbook.linear_attention(q, k, v, feature_map=3)
    with pytest.raises(ValueError, match=r"keep the leading dimensions of q \(2, 3, 4, 2\)"):
        attnbook.linear_attention(q, k, v, feature_map=lambda x: x.sum(-1))

    def wider_keys(x):  # q (..., 4, 2) -> (..., 4, 2), k (..., 5, 2) -> (..., 5, 3)
        return x if x.shape[-2] == 4 else torch.cat([x, x[..., :1]], -1)

    with pytest.raises(ValueError, match=r"one width R, got q features \(2, 3, 4, 2\) but k features \(2, 3, 5, 3\)"):
        attnbook.linear_attention(q, k, v, feature_map=wider_keys)
    with pytest.raises(ValueError, match=r"drawn for D=3, got q \(2, 3, 4, 2\), k \(2, 3, 5, 2\)"):
        attnbook.linear_attention(q, k, v, feature_map=PerformerFeatures(8, 3, seed=0))
    with pytest.raises(ValueError, match=r"key_padding_mask must have shape \(B, M\) = \(2, 5\), got .*\(2, 4\)"):
        attnbook.linear_attention(q, k, v, key_padding_mask=torch.ones(2, 4, dtype=torch.bool))
    with pytest.raises(TypeError, match="key_padding_mask must be a bool tensor"):
        attnbook.linear_attention(q, k, v, key_padding_mask=torch.ones(2, 5))
    with pytest.raises(ValueError, match="chunk_size must be an int >= 1"):
        attnbook.linear_attention(q, k[:, :, :4], v[:, :, :4], is_causal=True, chunk_size=0)
    with pytest.raises(ValueError, match="eps must be a finite number >= 0"):
        attnbook.linear_attention(q, k, v, eps=-1.0)
    with pytest.raises(ValueError, match="share a dtype"):
        attnbook.linear_attention(q.double(), k, v)


def test_bad_step_arguments_raise_value_error():
    q, k, v = torch.randn(2, 3, 4), torch.randn(2, 3, 4), torch.randn(2, 3, 5)
    _, state = attnbook.linear_attention_step(q, k, v)
    assert state.S.shape == (2, 3, 4, 5) and state.z.shape == (2, 3, 4)
    with pytest.raises(
        ValueError, match=r"q_t must have 3 dimensions \(B, H, D\), got a float32 tensor of shape \(2, 3, 1, 4\)"
    ):
        attnbook.linear_attention_step(q[:, :, None], k, v)
    with pytest.raises(ValueError, match=r"q_t \(2, 3, 4\), k_t \(2, 3, 6\)"):
        attnbook.linear_attention_step(q, torch.randn(2, 3, 6), v)
    with pytest.raises(
        ValueError, match=r"state.S must have shape \(2, 3, 4, 6\) for these inputs, got .*\(2, 3, 4, 5\)"
    ):
        attnbook.linear_attention_step(q, k, torch.randn(2, 3, 6), state)
    with pytest.raises(TypeError, match="state must be a LinearState .*, got a float32 tensor"):
        attnbook.linear_attention_step(q, k, v, state.S)
    with pytest.raises(TypeError, match="state must be a LinearState .*, got a tuple of length 2"):
        attnbook.linear_attention_step(q, k, v, tuple(state))
    with pytest.raises(ValueError, match="state.z must be in the accumulation dtype torch.float32 .*float64"):
        attnbook.linear_attention_step(q, k, v, state._replace(z=state.z.double()))
    with pytest.raises(TypeError, match="state.S must be a floating-point tensor, got a int64"):
        attnbook.linear_attention_step(q, k, v, state._replace(S=state.S.long()))
    with pytest.raises(ValueError, match="feature_map must be 'elu', 'relu', .*got 'nope'"):
        attnbook.linear_attention_step(q, k, v, feature_map="nope")


class TestModule:
    def test_parameter_names_and_shapes(self):
        m = attnbook.LinearAttention(12, 16, 10, 4)
        assert isinstance(m, attnbook.ProjectedAttention)
        shapes = {n: tuple(p.shape) for n, p in m.named_parameters()}
        assert shapes == {
            "query_projection.weight": (16, 12),
            "query_projection.bias": (16,),
            "key_projection.weight": (16, 12),
            "key_projection.bias": (16,),
            "value_projection.weight": (16, 12),
            "value_projection.bias": (16,),
            "out_projection.weight": (10, 16),
            "out_projection.bias": (10,),
        }
        state = attnbook.LinearAttention(12, 16, 10, 4, feature_map=PerformerFeatures(8, 4, seed=0)).state_dict()
        assert tuple(state["feature_map.projection"].shape) == (8, 4)  # the draw is saved with the model

    @pytest.mark.parametrize("fmap", ["elu", "performer"])
    @pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
    def test_equals_literal_multi_head_computation(self, causal, fmap):
        phi = feature_map(fmap, 4)
        m = attnbook.LinearAttention(6, 8, 5, 2, feature_map=phi, causal=causal).double().eval()
        x = torch.randn(3, 7, 6, dtype=torch.float64)
        y = torch.randn(3, 7, 6, dtype=torch.float64)
        real = torch.ones(3, 7, dtype=torch.bool)
        real[1, 5:] = False
        heads = []
        for h in range(2):
            sl = slice(4 * h, 4 * h + 4)
            q = m.query_projection(x)[..., sl]
            k = m.key_projection(y)[..., sl]
            v = m.value_projection(y)[..., sl]
            heads.append(
                reference.linear_attention(
                    q[:, None], k[:, None], v[:, None], is_causal=causal, feature_map=phi, key_padding_mask=~real
                )[:, 0]
            )
        expected = m.out_projection(torch.cat(heads, dim=-1))
        torch.testing.assert_close(m(x, y, y, key_padding_mask=~real), expected)

    def test_cross_attention_lengths(self):
        m = attnbook.LinearAttention(6, 8, 5, 2)
        assert m(torch.randn(2, 3, 6), torch.randn(2, 9, 6), torch.randn(2, 9, 6)).shape == (2, 3, 5)
        with pytest.raises(ValueError, match=r"keys must have the same length as queries \(L == S\) \(causal"):
            attnbook.LinearAttention(6, 8, 5, 2, causal=True)(
                torch.randn(2, 3, 6), torch.randn(2, 9, 6), torch.randn(2, 9, 6)
            )

    @pytest.mark.parametrize(
        "kwargs, error, message",
        [
            (dict(feature_map="softmax"), ValueError, "feature_map must be 'elu', 'relu'"),
            (dict(feature_map=PerformerFeatures(8, 3, seed=0)), ValueError, r"drawn for D=3.*= 4"),
            (dict(eps=-1.0), ValueError, "eps must be a finite number >= 0"),
            (dict(eps=float("inf")), ValueError, "eps must be a finite number >= 0, got inf"),
            (dict(n_heads=3), ValueError, "d_model must be a multiple of n_heads, got d_model=8, n_heads=3"),
            (dict(n_heads=True), TypeError, "n_heads must be an int, got True"),
            (dict(d_model=True), TypeError, "d_model must be an int, got True"),
            (dict(chunk_size=0), ValueError, "chunk_size must be an int >= 1, got 0"),
            (dict(chunk_size="64"), TypeError, "chunk_size must be an int, got '64'"),
            (dict(causal="False"), TypeError, "causal must be True or False, got 'False'"),
            (dict(drop_out="0.1"), TypeError, "drop_out must be a number, got '0.1'"),
            (dict(drop_out=torch.tensor(0.1)), TypeError, "drop_out must be a number, got a float32 tensor"),
        ],
        ids=[
            "feature_map",
            "performer_width",
            "eps",
            "infinite_eps",
            "heads",
            "bool_heads",
            "bool_width",
            "zero_chunk",
            "string_chunk",
            "string_causal",
            "string_drop_out",
            "tensor_drop_out",
        ],
    )
    def test_bad_construction(self, kwargs, error, message):
        args = dict(d_input=4, d_model=8, d_output=4, n_heads=2) | kwargs
        with pytest.raises(error, match=message):
            attnbook.LinearAttention(**args)


@pytest.mark.parametrize("plain", [False, True], ids=["annex", "plain"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_a_query_whose_keys_are_all_padding_gets_zeros_with_eps_zero(causal, plain):
    """With eps = 0 a query with no weight at all (every key padding) returns zeros and zero gradients, not
    0/0 = NaN, in the plain form and in the annex."""
    q, k, v = (x.requires_grad_() for x in qkv(2, 2, 6, 6, 3, 3))
    padding = torch.zeros(2, 6, dtype=torch.bool)
    padding[1] = True
    with paths(plain):
        out = attnbook.linear_attention(q, k, v, key_padding_mask=padding, is_causal=causal, eps=0.0, chunk_size=4)
        out.sum().backward()
    assert torch.isfinite(out).all() and (out[1] == 0).all()
    assert all(torch.isfinite(x.grad).all() for x in (q, k, v)) and (q.grad[1] == 0).all()
