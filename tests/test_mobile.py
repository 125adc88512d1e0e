"""mobile_attention and MobileAttention against the float64 definition and the published module."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from published import PublishedMobileAttention
from support import DEVICES, FLOAT_DTYPES, assert_matches_reference, qkv, tol

import attnbook
from attnbook import reference

SHAPES = {  # (B, H, N, M, D, Dv), M = N: the heads compete for each position
    "square": (2, 3, 7, 7, 8, 8),
    "one_head": (2, 1, 5, 5, 4, 3),
    "many_small_heads": (1, 8, 9, 9, 2, 3),
    "single_token": (1, 2, 1, 1, 3, 2),
    "long_odd": (1, 4, 63, 63, 5, 7),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
def test_matches_reference_outputs_and_gradients(shape, dtype, device):
    assert_matches_reference(
        attnbook.mobile_attention, reference.mobile_attention, list(qkv(*shape, device=device)), dtype=dtype
    )


@pytest.mark.parametrize("eps", [1e-6, 0.1], ids=["eps1e-6", "eps0.1"])
def test_flow_statistics_match_reference(eps):
    q, k, v = qkv(2, 4, 7, 7, 3, 5, dtype=torch.float64, scale=3.0)
    out, stats = attnbook.mobile_attention(q, k, v, eps=eps, return_flows=True)
    ref_out, ref_stats = reference.mobile_attention(q, k, v, eps=eps, return_flows=True)
    assert isinstance(stats, attnbook.FlowStats)
    torch.testing.assert_close(out, ref_out, **tol(torch.float64))
    for name in attnbook.FlowStats._fields:
        got, want = getattr(stats, name), getattr(ref_stats, name)
        assert got.shape == (2, 4, 7), name
        torch.testing.assert_close(got, want, **tol(torch.float64), msg=lambda m, n=name: f"{n}: {m}")


def test_flows_are_summed_over_heads_not_over_the_sequence():
    """I_hi uses the head total of the keys at position i; the competition sums to M over the sequence."""
    q, k, v = qkv(1, 3, 5, 5, 4, 2, dtype=torch.float64)
    _, s = attnbook.mobile_attention(q, k, v, return_flows=True)
    qs, ks, eps = torch.sigmoid(q), torch.sigmoid(k), 1e-6
    torch.testing.assert_close(s.incoming, ((qs + eps) * (ks.sum(1, keepdim=True) + eps)).sum(-1))
    torch.testing.assert_close(s.competition.sum(-1), torch.full((1, 3), 5.0, dtype=torch.float64))
    _, flow_stats = attnbook.flow_attention(q, k, v, return_flows=True)
    assert not torch.allclose(s.incoming, flow_stats.incoming)


@settings(max_examples=30, deadline=None)
@given(
    h=st.integers(1, 8),
    n=st.integers(1, 9),
    d=st.integers(1, 6),
    scale=st.floats(0.1, 4.0),
    seed=st.integers(0, 2**16),
)
def test_heads_conserve_the_flow_of_each_token_without_eps(h, n, d, scale, seed):
    """eps = 0: at every position, sum_h O^_hj = H and sum_h I^_hi = H (before the clamp)."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (scale * torch.randn(2, h, n, d, generator=g, dtype=torch.float64) for _ in range(3))
    _, s = attnbook.mobile_attention(q, k, v, eps=0.0, return_flows=True)
    full = torch.full((2, n), float(h), dtype=torch.float64)
    torch.testing.assert_close(s.conserved_outgoing_raw.sum(1), full)
    torch.testing.assert_close(s.conserved_incoming.sum(1), full)


@pytest.mark.parametrize("eps", [1e-6, 0.1], ids=lambda e: f"eps{e}")
def test_head_conservation_deviation_with_eps_is_exactly_the_eps_terms(eps):
    """As for Flow-Attention with the head axis in place of the sequence (H sinks, H sources per token):

        sum_h O^_hj - H = eps [ sum_h ((H - 1) q~_hj . 1 - K_j . 1 - D eps) / I_hj + K_j . 1 + H D eps ],
    K_j = sum_h k~_hj, and the mirror image for I^.
    """
    B, H, N, D = 2, 5, 6, 4
    q, k, v = qkv(B, H, N, N, D, 3, dtype=torch.float64, scale=2.0)
    _, s = attnbook.mobile_attention(q, k, v, eps=eps, return_flows=True)
    qs, ks = torch.sigmoid(q), torch.sigmoid(k)
    K1, Q1 = ks.sum((1, -1)), qs.sum((1, -1))  # (B, N)
    dev_out = eps * (((H - 1) * qs.sum(-1) - K1[:, None] - D * eps) / s.incoming).sum(1) + eps * (K1 + H * D * eps)
    dev_in = eps * (((H - 1) * ks.sum(-1) - Q1[:, None] - D * eps) / s.outgoing).sum(1) + eps * (Q1 + H * D * eps)
    torch.testing.assert_close(s.conserved_outgoing_raw.sum(1) - H, dev_out, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(s.conserved_incoming.sum(1) - H, dev_in, rtol=1e-9, atol=1e-12)
    assert (dev_out.abs() > 0).all()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["float16", "bfloat16"])
def test_half_precision_accumulates_in_float32(dtype):
    q, k, v = (x.to(dtype) for x in qkv(2, 4, 33, 33, 8, 8))
    out, stats = attnbook.mobile_attention(q, k, v, return_flows=True)
    assert out.dtype == dtype and stats.incoming.dtype == torch.float32
    torch.testing.assert_close(out.double(), reference.mobile_attention(q, k, v), **tol(dtype))


def test_gradcheck_tiny():
    q, k, v = (x.double().requires_grad_() for x in qkv(1, 3, 4, 4, 2, 2))
    assert torch.autograd.gradcheck(attnbook.mobile_attention, (q, k, v))


def test_equivariant_to_permuting_heads_and_positions():
    q, k, v = qkv(2, 4, 6, 6, 3, 3, dtype=torch.float64)
    out = attnbook.mobile_attention(q, k, v)
    ph, pn = torch.randperm(4), torch.randperm(6)
    torch.testing.assert_close(attnbook.mobile_attention(q[:, ph], k[:, ph], v[:, ph]), out[:, ph])
    torch.testing.assert_close(attnbook.mobile_attention(q[:, :, pn], k[:, :, pn], v[:, :, pn]), out[:, :, pn])


@pytest.mark.parametrize(
    "kwargs, shapes, message",
    [
        ({}, ((1, 2, 4, 3), (1, 2, 5, 3), (1, 2, 5, 3)), r"N == M.*q \(1, 2, 4, 3\), k \(1, 2, 5, 3\)"),
        ({}, ((1, 2, 1, 3), (1, 2, 5, 3), (1, 2, 5, 3)), r"N == M"),  # the published code broadcasts this
        ({"eps": -0.5}, ((1, 1, 2, 2),) * 3, r"eps must be a finite number >= 0, got -0.5"),
    ],
    ids=["lengths", "length_one_query", "negative_eps"],
)
def test_bad_input_raises_value_error_naming_it(kwargs, shapes, message):
    q, k, v = (torch.randn(*s) for s in shapes)
    with pytest.raises(ValueError, match=message):
        attnbook.mobile_attention(q, k, v, **kwargs)


class TestModule:
    def test_parameter_names_and_shapes_match_the_published_module(self):
        ours = attnbook.MobileAttention(12, 16, 10, 4)
        theirs = PublishedMobileAttention(12, 16, 10, 4)
        assert {n: p.shape for n, p in ours.named_parameters()} == {n: p.shape for n, p in theirs.named_parameters()}
        assert ours.dropout.p == 0.05 and ours.eps == 1e-6

    @pytest.mark.parametrize("dtype", FLOAT_DTYPES)
    def test_published_checkpoint_loads_and_gives_the_same_outputs(self, dtype):
        theirs = PublishedMobileAttention(32, 32, 32, 16).to(dtype).eval()  # the seed's own smoke-test sizes
        ours = attnbook.MobileAttention(32, 32, 32, 16).to(dtype)
        ours.load_state_dict(theirs.state_dict())  # strict: same names, same shapes
        ours.eval()
        q, k, v = (torch.randn(2, 7, 32, dtype=dtype) for _ in range(3))
        torch.testing.assert_close(ours(q, k, v), theirs(q, k, v), **tol(dtype))

    def test_different_query_and_key_lengths_raise(self):
        m = attnbook.MobileAttention(4, 4, 4, 2)
        with pytest.raises(
            ValueError, match=r"the same length as queries \(L == S\) \(the heads compete.*\(1, 3, 4\).*\(1, 5, 4\)"
        ):
            m(torch.randn(1, 3, 4), torch.randn(1, 5, 4), torch.randn(1, 5, 4))
        with pytest.raises(ValueError, match=r"L == S"):  # length-1 queries would broadcast in the published code
            m(torch.randn(1, 1, 4), torch.randn(1, 5, 4), torch.randn(1, 5, 4))

    def test_dropout_is_active_in_training_only(self):
        m = attnbook.MobileAttention(4, 4, 4, 2, drop_out=0.5).train()
        x = torch.randn(1, 50, 4)
        assert (m(x, x, x) == 0).float().mean() > 0.3
        m.eval()
        assert (m(x, x, x) != 0).all()


def test_float16_module_output_is_finite_where_float64_says_it_is_representable():
    """With small D and long sequences the attention output grows like N |v| and passes float16's 65504,
    while the out-projection brings it back into range: the float32 attention output must reach the
    projection unrounded (before, the module returned inf)."""
    torch.manual_seed(0)
    layer = attnbook.MobileAttention(8, 8, 8, 1, drop_out=0.0).double().eval()
    with torch.no_grad():
        layer.out_projection.weight.mul_(1e-3)
    x = torch.randn(2, 2048, 8, dtype=torch.float64) * 10
    expected = layer(x)
    assert expected.abs().max() < 65504  # representable in float16
    heads = attnbook.mobile_attention(
        *(
            p(x).view(2, 2048, 1, 8).transpose(1, 2)
            for p in (layer.query_projection, layer.key_projection, layer.value_projection)
        )
    )
    assert heads.abs().max() > 65504  # ... although the attention output itself is not
    out = layer.half()(x.half())
    assert out.dtype == torch.float16 and torch.isfinite(out).all()
    torch.testing.assert_close(
        out.double() / expected.abs().max(), expected / expected.abs().max(), **tol(torch.float16)
    )


def test_float16_function_keeps_a_large_output_when_asked_for_float32():
    q, k, v = qkv(1, 1, 2048, 2048, 4, 4, scale=10.0)
    v = v * 10
    expected = reference.mobile_attention(q, k, v)
    assert expected.abs().max() > 65504
    out = attnbook.mobile_attention(q.half(), k.half(), v.half(), out_dtype=torch.float32)
    assert out.dtype == torch.float32 and torch.isfinite(out).all()
    ref16 = reference.mobile_attention(q.half(), k.half(), v.half())  # the same rounded inputs
    torch.testing.assert_close(out.double() / ref16.abs().max(), ref16 / ref16.abs().max(), **tol(torch.float32))


@pytest.mark.parametrize("seed", [2, 4])
def test_float16_inputs_of_magnitude_1e4_give_finite_gradients(seed):
    """0.2.0's float16 output projection took its gradient through the rows' scale (up to 2^16): a finite forward,
    an entirely non-finite gradient. The float64 output fits float16 here, and so must both results."""
    torch.manual_seed(seed)
    layer = attnbook.MobileAttention(16, 16, 16, 2, drop_out=0.0)
    x = torch.randn(2, 8, 16) * 1e4
    assert layer.double()(x.double()).abs().max() < 65504  # the case is one float16 can hold
    x16 = x.half().requires_grad_()
    y = layer.half()(x16)
    y.sum().backward()
    assert torch.isfinite(y).all() and torch.isfinite(x16.grad).all()


def test_nan_in_padding_gives_zero_gradients():
    """A padded position holding NaN contributes nothing forwards and gets a zero gradient (0.2.0 gave NaN:
    the features were zeroed after the sigmoid, whose derivative at NaN is NaN)."""
    q, k, v = (x.requires_grad_() for x in qkv(2, 4, 6, 6, 3, 3))
    padding = torch.zeros(2, 6, dtype=torch.bool)
    padding[0, 4:] = True
    with torch.no_grad():
        for x in (q, k, v):
            x[0, :, 4:] = float("nan")
    out = attnbook.mobile_attention(q, k, v, key_padding_mask=padding)
    assert torch.isfinite(out).all()
    out.sum().backward()
    for x in (q, k, v):
        assert torch.isfinite(x.grad).all() and (x.grad[0, :, 4:] == 0).all()
