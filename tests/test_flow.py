"""flow_attention, flow_attention_step and FlowAttention against the float64 definitions (Wu et al., 2022)."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from published import PublishedFlowAttention
from support import DEVICES, FLOAT_DTYPES, assert_matches_reference, qkv, tol

import attnbook
from attnbook import reference
from attnbook.lab.profiling import peak_memory

SHAPES = {  # (B, H, N, M, D, Dv)
    "square": (2, 3, 7, 7, 8, 8),
    "more_keys": (1, 2, 5, 11, 4, 6),
    "more_queries": (2, 1, 9, 4, 4, 3),
    "single_token": (1, 1, 1, 1, 3, 2),
    "long_odd": (1, 2, 63, 63, 5, 7),
}
SQUARE = {name: s for name, s in SHAPES.items() if s[2] == s[3]}


# ----------------------------------------------------------------------------------------------------
# Against the literal float64 definition


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
def test_non_causal_matches_reference_outputs_and_gradients(shape, dtype, device):
    assert_matches_reference(
        attnbook.flow_attention, reference.flow_attention, list(qkv(*shape, device=device)), dtype=dtype
    )


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("chunk_size", [1, 5, 64], ids=lambda c: f"chunk{c}")
@pytest.mark.parametrize("shape", SQUARE.values(), ids=SQUARE.keys())
def test_causal_matches_reference_outputs_and_gradients(shape, chunk_size, dtype, device):
    assert_matches_reference(
        lambda q, k, v: attnbook.flow_attention(q, k, v, is_causal=True, chunk_size=chunk_size),
        lambda q, k, v: reference.flow_attention(q, k, v, is_causal=True),
        list(qkv(*shape, device=device)),
        dtype=dtype,
    )


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("eps", [1e-6, 0.1], ids=["eps1e-6", "eps0.1"])
def test_flow_statistics_match_reference(causal, eps):
    q, k, v = qkv(2, 3, 7, 7, 4, 5, dtype=torch.float64, scale=3.0)
    out, stats = attnbook.flow_attention(q, k, v, is_causal=causal, eps=eps, return_flows=True)
    ref_out, ref_stats = reference.flow_attention(q, k, v, is_causal=causal, eps=eps, return_flows=True)
    assert isinstance(stats, attnbook.FlowStats)
    torch.testing.assert_close(out, ref_out, **tol(torch.float64))
    for name in attnbook.FlowStats._fields:
        got, want = getattr(stats, name), getattr(ref_stats, name)
        assert got.shape == (2, 3, 7), name
        torch.testing.assert_close(got, want, **tol(torch.float64), msg=lambda m, n=name: f"{n}: {m}")


def test_statistics_follow_their_definitions():
    """Flows, not reciprocals; clamp of the raw value; competition sums to M; allocation in (0, 1)."""
    q, k, v = qkv(2, 2, 6, 9, 4, 3, dtype=torch.float64)
    _, s = attnbook.flow_attention(q, k, v, return_flows=True)
    qs, ks = torch.sigmoid(q), torch.sigmoid(k)
    eps = 1e-6
    torch.testing.assert_close(s.incoming, ((qs + eps) * (ks.sum(-2, keepdim=True) + eps)).sum(-1))
    torch.testing.assert_close(s.conserved_outgoing, s.conserved_outgoing_raw.clamp(-1, 1))
    torch.testing.assert_close(s.competition.sum(-1), torch.full((2, 2), 9.0, dtype=torch.float64))
    torch.testing.assert_close(s.allocation, torch.sigmoid(s.conserved_incoming * 6 / 9))
    assert ((s.allocation > 0) & (s.allocation < 1)).all()
    # with return_flows=False the output is the same tensor value
    torch.testing.assert_close(attnbook.flow_attention(q, k, v), attnbook.flow_attention(q, k, v, return_flows=True)[0])


# ----------------------------------------------------------------------------------------------------
# Conservation: what holds exactly given where eps sits


@settings(max_examples=30, deadline=None)
@given(
    n=st.integers(1, 12),
    m=st.integers(1, 12),
    d=st.integers(1, 6),
    scale=st.floats(0.1, 4.0),
    seed=st.integers(0, 2**16),
)
def test_conservation_is_exact_without_eps(n, m, d, scale, seed):
    """eps = 0: sum_j O^_j = n (every sink takes one unit) and sum_i I^_i = m (every source emits one)."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (scale * torch.randn(1, 2, x, d, generator=g, dtype=torch.float64) for x in (n, m, m))
    _, s = attnbook.flow_attention(q, k, v, eps=0.0, return_flows=True)
    torch.testing.assert_close(s.conserved_outgoing_raw.sum(-1), torch.full((1, 2), float(n), dtype=torch.float64))
    torch.testing.assert_close(s.conserved_incoming.sum(-1), torch.full((1, 2), float(m), dtype=torch.float64))


@pytest.mark.parametrize("eps", [1e-6, 1e-2, 0.5], ids=lambda e: f"eps{e}")
def test_conservation_deviation_with_eps_is_exactly_the_eps_terms(eps):
    """With eps > 0 (added to every component of both vectors), expanding the dot products gives exactly

        sum_j O^_j - n = eps [ sum_i ((M - 1) q~_i . 1 - K . 1 - D eps) / I_i + K . 1 + M D eps ]

    with K = sum_j k~_j, and the mirror image for sum_i I^_i - m; at eps = 1e-6 both are tiny relative
    to n and m.
    """
    B, H, N, M, D = 2, 3, 11, 8, 5
    q, k, v = qkv(B, H, N, M, D, 4, dtype=torch.float64, scale=2.0)
    _, s = attnbook.flow_attention(q, k, v, eps=eps, return_flows=True)
    qs, ks = torch.sigmoid(q), torch.sigmoid(k)
    K1, Q1 = ks.sum((-2, -1)), qs.sum((-2, -1))  # (B, H): K . 1 and Q . 1
    dev_out = eps * (((M - 1) * qs.sum(-1) - K1[..., None] - D * eps) / s.incoming).sum(-1) + eps * (K1 + M * D * eps)
    dev_in = eps * (((N - 1) * ks.sum(-1) - Q1[..., None] - D * eps) / s.outgoing).sum(-1) + eps * (Q1 + N * D * eps)
    torch.testing.assert_close(s.conserved_outgoing_raw.sum(-1) - N, dev_out, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(s.conserved_incoming.sum(-1) - M, dev_in, rtol=1e-9, atol=1e-12)
    if eps == 1e-6:
        assert (dev_out.abs() < 1e-3 * N).all() and (dev_in.abs() < 1e-3 * M).all()
    else:
        assert (dev_out.abs() > 1e-6).all()  # the eps terms are real: the identity is not exact with eps


@pytest.mark.parametrize("x", [-46.0, -60.0])
def test_eps_zero_with_saturated_sigmoids_is_right_in_float64_as_the_docstring_advises(x):
    """eps = 0 and inputs of -46 or -60: float32's flows fall under its smallest normal number (inf or 0 out, as
    the docstring says); float64 inputs, its advice, give the reference's sigmoid(1) for both mechanisms."""
    q, k = (torch.full((1, 1, 2, 1), x, dtype=torch.float64) for _ in range(2))
    v = torch.ones(1, 1, 2, 1, dtype=torch.float64)
    out32 = attnbook.flow_attention(q.float(), k.float(), v.float(), eps=0.0)
    assert not torch.isclose(out32.double(), reference.flow_attention(q, k, v, eps=0.0)).any()
    torch.testing.assert_close(attnbook.flow_attention(q, k, v, eps=0.0), reference.flow_attention(q, k, v, eps=0.0))
    torch.testing.assert_close(attnbook.flow_attention(q, k, v, eps=0.0), torch.sigmoid(torch.ones_like(v)))
    torch.testing.assert_close(
        attnbook.mobile_attention(q, k, v, eps=0.0), reference.mobile_attention(q, k, v, eps=0.0)
    )


def test_clamp_clips_sources_in_self_attention():
    """In self-attention (N == M) the O^_j average 1, so the clamp at 1 changes many of them."""
    x = torch.randn(1, 4, 64, 16, dtype=torch.float64)
    _, s = attnbook.flow_attention(x, x, x, return_flows=True)
    clipped = (s.conserved_outgoing_raw > 1).double().mean()
    assert 0.05 < clipped < 0.95
    assert (s.conserved_outgoing <= 1).all()


# ----------------------------------------------------------------------------------------------------
# Causal: the prefix algorithm, causality, chunking, recurrence


@settings(max_examples=15, deadline=None)
@given(n=st.integers(2, 12), cut=st.integers(0, 11), chunk=st.integers(1, 6), seed=st.integers(0, 2**16))
def test_causal_output_ignores_the_future(n, cut, chunk, seed):
    cut = min(cut, n - 2)
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, 2, n, 3, generator=g, dtype=torch.float64) for _ in range(3))
    q2, k2, v2 = q.clone(), k.clone(), v.clone()
    q2[..., cut + 1 :, :] += 2.0
    k2[..., cut + 1 :, :] -= 3.0
    v2[..., cut + 1 :, :] *= 5.0
    a, sa = attnbook.flow_attention(q, k, v, is_causal=True, chunk_size=chunk, return_flows=True)
    b, sb = attnbook.flow_attention(q2, k2, v2, is_causal=True, chunk_size=chunk, return_flows=True)
    torch.testing.assert_close(a[..., : cut + 1, :], b[..., : cut + 1, :])
    for x, y in zip(sa, sb, strict=True):
        torch.testing.assert_close(x[..., : cut + 1], y[..., : cut + 1])
    assert not torch.allclose(a[..., cut + 1 :, :], b[..., cut + 1 :, :])  # the change did reach the future


@pytest.mark.parametrize("n", [1, 7, 63, 130])
def test_chunk_size_does_not_change_the_result(n):
    q, k, v = qkv(2, 2, n, n, 4, 3)
    base = attnbook.flow_attention(q, k, v, is_causal=True, chunk_size=n)
    for c in (1, 3, 64, 1000):
        torch.testing.assert_close(
            attnbook.flow_attention(q, k, v, is_causal=True, chunk_size=c), base, **tol(torch.float32)
        )


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("n", [1, 7, 63])
def test_recurrent_steps_equal_parallel_causal(n, dtype):
    q, k, v = qkv(2, 3, n, n, 4, 5, dtype=dtype)
    parallel = attnbook.flow_attention(q, k, v, is_causal=True, chunk_size=5)
    state, outs = None, []
    for i in range(n):
        out, state = attnbook.flow_attention_step(q[:, :, i], k[:, :, i], v[:, :, i], state)
        outs.append(out)
        assert out.dtype == dtype and out.shape == (2, 3, 5)
    torch.testing.assert_close(torch.stack(outs, dim=2), parallel, **tol(dtype))
    assert isinstance(state, attnbook.FlowState) and state.t.tolist() == [n, n]
    qs, ks = torch.sigmoid(q.double()), torch.sigmoid(k.double())
    torch.testing.assert_close(state.key_sum.double(), ks.sum(2), **tol(dtype))
    torch.testing.assert_close(state.query_sum.double(), qs.sum(2), **tol(dtype))
    assert ((state.exp_mean >= math.exp(-1) - 1e-6) & (state.exp_mean <= math.e + 1e-6)).all()


def test_recurrent_gradients_match_reference():
    """Stepping token by token gives the reference's outputs and gradients: they flow through the state."""
    q, k, v = (x.double().requires_grad_() for x in qkv(1, 2, 9, 9, 3, 4))
    state, outs = None, []
    for i in range(9):
        o, state = attnbook.flow_attention_step(q[:, :, i], k[:, :, i], v[:, :, i], state)
        outs.append(o)
    torch.testing.assert_close(torch.stack(outs, 2), reference.flow_attention(q, k, v, is_causal=True))
    w = torch.randn(1, 2, 9, 4, dtype=torch.float64)
    grads = torch.autograd.grad((torch.stack(outs, 2) * w).sum(), (q, k, v))
    ref_grads = torch.autograd.grad((reference.flow_attention(q, k, v, is_causal=True) * w).sum(), (q, k, v))
    for g, r in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(g, r)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["float16", "bfloat16"])
def test_recurrent_half_precision_keeps_a_float32_state(dtype):
    q, k, v = (x.to(dtype) for x in qkv(1, 2, 40, 40, 8, 4))
    state, outs = None, []
    for i in range(40):
        o, state = attnbook.flow_attention_step(q[:, :, i], k[:, :, i], v[:, :, i], state)
        outs.append(o)
    assert outs[-1].dtype == dtype
    assert state.kv.dtype == torch.float32 and state.exp_mean.dtype == torch.float32
    torch.testing.assert_close(
        torch.stack(outs, 2).double(), reference.flow_attention(q, k, v, is_causal=True), **tol(dtype)
    )


def test_causal_never_builds_a_quadratic_tensor():
    """Peak extra memory stays O(N (D + Dv)): far below one N x N matrix per head, let alone N x D x Dv."""
    B, H, N, D = 1, 2, 4096, 4
    q, k, v = qkv(B, H, N, N, D, D)
    with torch.no_grad():
        peak = peak_memory(lambda: attnbook.flow_attention(q, k, v, is_causal=True, chunk_size=32))
    one_nxn = B * H * N * N * 4
    assert peak < one_nxn / 20, (peak, one_nxn)


# ----------------------------------------------------------------------------------------------------
# Precision, gradcheck, invariances


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["float16", "bfloat16"])
def test_half_precision_accumulates_in_float32(dtype, causal):
    q, k, v = qkv(2, 2, 33, 33, 8, 8)
    out = attnbook.flow_attention(q.to(dtype), k.to(dtype), v.to(dtype), is_causal=causal)
    assert out.dtype == dtype
    ref = reference.flow_attention(q.to(dtype), k.to(dtype), v.to(dtype), is_causal=causal)
    torch.testing.assert_close(out.double(), ref, **tol(dtype))


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_float16_long_sequence_stays_finite(causal):
    """I_i grows like N D / 4 (~1e5 here), beyond float16's 65504: the flows must live in float32."""
    N, D = 4096, 64
    q, k, v = (x.half() for x in qkv(1, 1, N, N, D, 8, scale=3.0))
    out, stats = attnbook.flow_attention(q, k, v, is_causal=causal, return_flows=True)
    assert stats.incoming.dtype == torch.float32 and stats.incoming.max() > 65504 * (0 if causal else 1)
    assert torch.isfinite(out).all()
    ref = attnbook.flow_attention(q.float(), k.float(), v.float(), is_causal=causal)
    torch.testing.assert_close(out.float(), ref, **tol(torch.float16))


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_gradcheck_tiny(causal):
    q, k, v = (x.double().requires_grad_() for x in qkv(1, 2, 4, 4 if causal else 5, 3, 2))
    assert torch.autograd.gradcheck(
        lambda q, k, v: attnbook.flow_attention(q, k, v, is_causal=causal, chunk_size=3), (q, k, v)
    )


def test_gradcheck_recurrent_step():
    q, k, v = (x.double().requires_grad_() for x in qkv(1, 2, 3, 3, 3, 2))

    def run(q, k, v):
        state, outs = None, []
        for i in range(3):
            o, state = attnbook.flow_attention_step(q[:, :, i], k[:, :, i], v[:, :, i], state)
            outs.append(o)
        return torch.stack(outs, 2)

    assert torch.autograd.gradcheck(run, (q, k, v))


def test_permuting_keys_and_values_together_changes_nothing_and_queries_are_equivariant():
    q, k, v = qkv(2, 2, 6, 8, 4, 4, dtype=torch.float64)
    pk, pq = torch.randperm(8), torch.randperm(6)
    out = attnbook.flow_attention(q, k, v)
    torch.testing.assert_close(attnbook.flow_attention(q, k[:, :, pk], v[:, :, pk]), out)
    torch.testing.assert_close(attnbook.flow_attention(q[:, :, pq], k, v), out[:, :, pq])


# ----------------------------------------------------------------------------------------------------
# Bad input


@pytest.mark.parametrize(
    "kwargs, shapes, message",
    [
        (
            {"is_causal": True},
            ((1, 2, 4, 3), (1, 2, 5, 3), (1, 2, 5, 3)),
            r"N == M.*\(1, 2, 4, 3\).*\(1, 2, 5, 3\)",
        ),
        ({"eps": -1.0}, ((1, 1, 2, 2),) * 3, r"eps must be a finite number >= 0, got -1.0"),
        ({"is_causal": True, "chunk_size": 0}, ((1, 1, 2, 2),) * 3, r"chunk_size must be an int >= 1, got 0"),
    ],
    ids=["causal_lengths", "negative_eps", "chunk_size"],
)
def test_bad_input_raises_value_error_naming_it(kwargs, shapes, message):
    q, k, v = (torch.randn(*s) for s in shapes)
    with pytest.raises(ValueError, match=message):
        attnbook.flow_attention(q, k, v, **kwargs)


# ----------------------------------------------------------------------------------------------------
# The module and the published checkpoint layout


class TestModule:
    def test_parameter_names_and_shapes_match_the_published_module(self):
        ours = attnbook.FlowAttention(12, 16, 10, 4)
        theirs = PublishedFlowAttention(12, 16, 10, 4)
        assert {n: p.shape for n, p in ours.named_parameters()} == {n: p.shape for n, p in theirs.named_parameters()}
        assert ours.dropout.p == 0.05 and ours.eps == 1e-6 and not ours.causal

    @pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
    def test_published_checkpoint_loads_and_gives_the_same_outputs(self, causal):
        theirs = PublishedFlowAttention(6, 8, 5, 2, causal=causal).double().eval()
        ours = attnbook.FlowAttention(6, 8, 5, 2, causal=causal).double()
        ours.load_state_dict(theirs.state_dict())  # strict: same names, same shapes
        ours.eval()
        x, y = torch.randn(3, 7, 6, dtype=torch.float64), torch.randn(3, 7, 6, dtype=torch.float64)
        torch.testing.assert_close(ours(x, y, y), theirs(x, y, y), **tol(torch.float64))
        if not causal:
            y = torch.randn(3, 10, 6, dtype=torch.float64)  # cross-attention, M != N
            torch.testing.assert_close(ours(x, y, y), theirs(x, y, y), **tol(torch.float64))

    def test_causal_module_rejects_different_lengths(self):
        m = attnbook.FlowAttention(4, 4, 4, 2, causal=True)
        with pytest.raises(
            ValueError, match=r"FlowAttention: keys must have the same length as queries \(L == S\) \(causal"
        ):
            m(torch.randn(1, 3, 4), torch.randn(1, 5, 4), torch.randn(1, 5, 4))

    def test_dropout_is_active_in_training_only(self):
        m = attnbook.FlowAttention(4, 4, 4, 1, drop_out=0.5).train()
        x = torch.randn(1, 50, 4)
        assert (m(x, x, x) == 0).float().mean() > 0.3
        m.eval()
        assert (m(x, x, x) != 0).all()

    def test_bad_construction(self):
        with pytest.raises(ValueError, match="eps must be a finite number >= 0"):
            attnbook.FlowAttention(4, 4, 4, 2, eps=-1e-3)
        with pytest.raises(ValueError, match="d_model must be a multiple of n_heads, got d_model=6, n_heads=4"):
            attnbook.FlowAttention(4, 6, 4, 4)
        with pytest.raises(TypeError, match="causal must be True or False, got 'False'"):
            attnbook.FlowAttention(4, 4, 4, 2, causal="False")
        with pytest.raises(TypeError, match="drop_out must be a number, got None"):
            attnbook.FlowAttention(4, 4, 4, 2, drop_out=None)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_nan_in_padding_gives_zero_gradients(causal):
    """A padded position holding NaN contributes nothing forwards and gets a zero gradient (0.2.0 gave NaN:
    the features were zeroed after the sigmoid, whose derivative at NaN is NaN)."""
    q, k, v = (x.requires_grad_() for x in qkv(2, 3, 7, 7, 4, 4))
    padding = torch.zeros(2, 7, dtype=torch.bool)
    padding[0, 5:] = True
    with torch.no_grad():
        for x in (q, k, v):
            x[0, :, 5:] = float("nan")
    kwargs = {"key_padding_mask": padding, "is_causal": causal, "chunk_size": 3}
    if not causal:
        kwargs["query_padding_mask"] = padding
    out = attnbook.flow_attention(q, k, v, **kwargs)
    assert torch.isfinite(out).all()
    out.sum().backward()
    for x in (q, k, v):
        assert torch.isfinite(x.grad).all() and (x.grad[0, :, 5:] == 0).all()


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_a_query_whose_keys_are_all_padding_gets_zeros_with_eps_zero(causal):
    """With eps = 0 a sink with no source at all has no incoming flow: its output is 0, not 0/0 = NaN."""
    q, k, v = qkv(2, 2, 5, 5, 3, 3)
    padding = torch.zeros(2, 5, dtype=torch.bool)
    padding[1] = True  # the second sequence has no real key
    out = attnbook.flow_attention(q, k, v, key_padding_mask=padding, is_causal=causal, eps=0.0)
    assert torch.isfinite(out).all() and (out[1] == 0).all()


def test_a_state_with_a_negative_count_is_refused():
    q, k, v = qkv(2, 2, 5, 5, 3, 3)
    _, state = attnbook.flow_attention(q, k, v, is_causal=True, output_final_state=True)
    bad = state._replace(t=torch.tensor([5, -1]))
    with pytest.raises(ValueError, match=r"flow_attention: initial_state.t must hold token counts >= 0, got \[5, -1\]"):
        attnbook.flow_attention(q, k, v, is_causal=True, initial_state=bad)
    with pytest.raises(ValueError, match=r"flow_attention_step: state.t must hold token counts >= 0"):
        attnbook.flow_attention_step(q[:, :, 0], k[:, :, 0], v[:, :, 0], bad)
