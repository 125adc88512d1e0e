"""softmax_attention and SoftmaxAttention against the float64 definition and torch's SDPA."""

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from support import DEVICES, FLOAT_DTYPES, assert_matches_reference, qkv, tol

import attnbook
from attnbook import reference

SHAPES = {  # (B, H, N, M, D, Dv)
    "square": (2, 3, 7, 7, 8, 8),
    "more_keys": (1, 2, 5, 11, 4, 6),
    "more_queries": (2, 1, 9, 4, 4, 3),
    "single_token": (1, 1, 1, 1, 3, 2),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
def test_matches_reference_outputs_and_gradients(shape, causal, dtype, device):
    inputs = list(qkv(*shape, device=device))
    assert_matches_reference(
        lambda q, k, v: attnbook.softmax_attention(q, k, v, is_causal=causal),
        lambda q, k, v: reference.softmax_attention(q, k, v, is_causal=causal),
        inputs,
        dtype=dtype,
    )


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_mask_with_fully_masked_rows_matches_reference(causal, dtype, device):
    B, H, N, M, D, Dv = 2, 3, 6, 9, 4, 5
    inputs = list(qkv(B, H, N, M, D, Dv, device=device))
    mask = torch.rand(B, 1, N, M, device=device) > 0.4
    mask[0, 0, 2] = False  # a query with nothing to attend to
    mask[1, 0, :, 0] = False  # under causal masking, row 0 of batch 1 is now empty too
    assert_matches_reference(
        lambda q, k, v: attnbook.softmax_attention(q, k, v, is_causal=causal, attn_mask=mask),
        lambda q, k, v: reference.softmax_attention(q, k, v, is_causal=causal, attn_mask=mask),
        inputs,
        dtype=dtype,
    )


def test_fully_masked_rows_are_zero_with_zero_gradient_never_nan():
    q, k, v = (x.requires_grad_() for x in qkv(1, 2, 4, 5, 3, 3))
    mask = torch.ones(1, 2, 4, 5, dtype=torch.bool)
    mask[0, 1, 3] = False
    out = attnbook.softmax_attention(q, k, v, attn_mask=mask)
    assert torch.equal(out[0, 1, 3], torch.zeros(3))
    out.sum().backward()
    for g in (q.grad, k.grad, v.grad):
        assert torch.isfinite(g).all()
    assert torch.equal(q.grad[0, 1, 3], torch.zeros(3))


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
def test_equals_torch_sdpa(shape, causal):
    q, k, v = qkv(*shape)
    mask = torch.rand(shape[0], shape[1], shape[2], shape[3]) > 0.3
    mask[..., 0] = True  # SDPA itself returns NaN on empty rows; compare where it is defined
    for m in (None, mask):
        ours = attnbook.softmax_attention(q, k, v, is_causal=causal, attn_mask=m)
        if m is None:
            theirs = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        else:
            full = m & torch.ones(shape[2], shape[3], dtype=torch.bool).tril() if causal else m
            theirs = F.scaled_dot_product_attention(q, k, v, attn_mask=full)
        torch.testing.assert_close(ours, theirs, **tol(torch.float32))


def test_custom_scale():
    q, k, v = qkv(1, 2, 5, 5, 4, 4)
    torch.testing.assert_close(
        attnbook.softmax_attention(q, k, v, scale=0.3).double(),
        reference.softmax_attention(q, k, v, scale=0.3),
        **tol(torch.float32),
    )
    # scale s on q.k is the default scale on (s * sqrt(D)) q
    torch.testing.assert_close(
        attnbook.softmax_attention(q, k, v, scale=0.3),
        attnbook.softmax_attention(q * 0.3 * math.sqrt(4), k, v),
        **tol(torch.float32),
    )


def test_gradcheck_tiny():
    q, k, v = (x.double().requires_grad_() for x in qkv(1, 2, 3, 4, 2, 3))
    mask = torch.tensor([[True, False, True, True], [False, False, False, False], [True, True, False, True]])
    assert torch.autograd.gradcheck(lambda q, k, v: attnbook.softmax_attention(q, k, v, attn_mask=mask), (q, k, v))
    assert torch.autograd.gradcheck(lambda q, k, v: attnbook.softmax_attention(q, k, v, is_causal=True), (q, k, v))


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 9), m=st.integers(1, 9), d=st.integers(1, 5), seed=st.integers(0, 2**16))
def test_weights_rows_sum_to_one_and_output_is_convex_combination(n, m, d, seed):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, 1, x, d, generator=g, dtype=torch.float64) for x in (n, m, m))
    out, weights = reference.softmax_attention(q, k, v, return_weights=True)
    torch.testing.assert_close(weights.sum(-1), torch.ones(1, 1, n, dtype=torch.float64))
    fast = attnbook.softmax_attention(q, k, v)
    torch.testing.assert_close(fast, out)
    assert (fast <= v.amax(dim=-2, keepdim=True) + 1e-9).all()
    assert (fast >= v.amin(dim=-2, keepdim=True) - 1e-9).all()


@settings(max_examples=15, deadline=None)
@given(n=st.integers(2, 9), cut=st.integers(0, 8), seed=st.integers(0, 2**16))
def test_causal_output_ignores_the_future(n, cut, seed):
    cut = min(cut, n - 1)
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, 2, n, 3, generator=g) for _ in range(3))
    k2, v2 = k.clone(), v.clone()
    k2[..., cut + 1 :, :] += 5.0
    v2[..., cut + 1 :, :] -= 3.0
    a = attnbook.softmax_attention(q, k, v, is_causal=True)
    b = attnbook.softmax_attention(q, k2, v2, is_causal=True)
    torch.testing.assert_close(a[..., : cut + 1, :], b[..., : cut + 1, :])


def test_permuting_keys_and_values_together_changes_nothing():
    q, k, v = qkv(2, 2, 5, 8, 4, 4)
    perm = torch.randperm(8)
    torch.testing.assert_close(
        attnbook.softmax_attention(q, k, v), attnbook.softmax_attention(q, k[:, :, perm], v[:, :, perm])
    )


def test_bad_masks_raise_value_error():
    q, k, v = qkv(2, 3, 4, 5, 2, 2)
    with pytest.raises(ValueError, match=r"mask must broadcast to \(B, H, N, M\) = \(2, 3, 4, 5\), got .*\(4, 4\)"):
        attnbook.softmax_attention(q, k, v, attn_mask=torch.ones(4, 4, dtype=torch.bool))
    with pytest.raises(TypeError, match="attn_mask must be a bool tensor .* or a floating one"):
        attnbook.softmax_attention(q, k, v, attn_mask=torch.ones(4, 5, dtype=torch.long))
    with pytest.raises(ValueError, match="share a dtype"):
        attnbook.softmax_attention(q.double(), k, v)
    with pytest.raises(ValueError, match="scale must be a finite number > 0"):
        attnbook.softmax_attention(q, k, v, scale=-1.0)


class TestModule:
    def test_parameter_names_and_shapes(self):
        m = attnbook.SoftmaxAttention(12, 16, 10, 4)
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

    @pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
    def test_equals_literal_multi_head_computation(self, causal):
        m = attnbook.SoftmaxAttention(6, 8, 5, 2, causal=causal).double().eval()
        x = torch.randn(3, 7, 6, dtype=torch.float64)
        y = torch.randn(3, 7, 6, dtype=torch.float64)
        heads = []
        for h in range(2):
            sl = slice(4 * h, 4 * h + 4)
            q = m.query_projection(x)[..., sl]
            k = m.key_projection(y)[..., sl]
            v = m.value_projection(y)[..., sl]
            heads.append(reference.softmax_attention(q[:, None], k[:, None], v[:, None], is_causal=causal)[:, 0])
        expected = m.out_projection(torch.cat(heads, dim=-1))
        torch.testing.assert_close(m(x, y, y), expected)

    def test_cross_attention_lengths_and_padding_mask(self):
        m = attnbook.SoftmaxAttention(6, 8, 5, 2)
        x, y = torch.randn(2, 3, 6), torch.randn(2, 9, 6)
        pad = torch.ones(2, 1, 1, 9, dtype=torch.bool)
        pad[1, ..., 6:] = False
        out = m(x, y, y, attn_mask=pad)
        assert out.shape == (2, 3, 5)
        y2 = y.clone()
        y2[1, 6:] = 1e4  # padded tokens must not matter whatever their values
        torch.testing.assert_close(m(x, y2, y2, attn_mask=pad), out)

    def test_dropout_after_output_projection(self):
        m = attnbook.SoftmaxAttention(4, 4, 4, 1, drop_out=0.5).train()
        out = m(*(torch.randn(1, 50, 4) for _ in range(3)))
        assert (out == 0).float().mean() > 0.3  # whole output entries are dropped
        m.eval()
        assert (m(*(torch.randn(1, 50, 4) for _ in range(3))) != 0).all()

    @pytest.mark.parametrize(
        "args, message",
        [
            ((4, 6, 4, 4), "d_model must be a multiple of n_heads, got d_model=6, n_heads=4"),
            ((4, 4, 4, 0), "n_heads must be an int >= 1"),
        ],
    )
    def test_bad_construction(self, args, message):
        with pytest.raises(ValueError, match=message):
            attnbook.SoftmaxAttention(*args)

    def test_bad_forward_shapes(self):
        m = attnbook.SoftmaxAttention(4, 4, 4, 2)
        with pytest.raises(ValueError, match=r"queries must have the last dimension d_input = 4"):
            m(torch.randn(1, 3, 5), torch.randn(1, 3, 5), torch.randn(1, 3, 5))
        with pytest.raises(ValueError, match="values must have the length S = 3 of keys"):
            m(torch.randn(1, 3, 4), torch.randn(1, 3, 4), torch.randn(1, 2, 4))


def test_masked_rule_for_keys_some_queries_see():
    """A key masked for some queries but visible to others cannot be zeroed: its NaN value reaches the queries
    that see it (never hidden), and rows that see nothing are zeros whatever they hold."""
    q, k, v = qkv(1, 1, 4, 5, 3, 2)
    mask = torch.ones(4, 5, dtype=torch.bool)
    mask[:2, 4] = False  # key 4: hidden from queries 0 and 1, visible to 2 and 3
    mask[3] = False  # query 3 sees nothing
    v[..., 4, 0] = float("nan")
    q[..., 3, :] = float("nan")
    out = attnbook.softmax_attention(q, k, v, attn_mask=mask)
    assert out[0, 0, 2, 0].isnan()  # query 2 sees the NaN value
    assert torch.equal(out[0, 0, 3], torch.zeros(2))  # query 3 sees nothing: zeros, its NaN is irrelevant
    assert torch.isfinite(out[0, 0, :3, 1]).all()  # the NaN is in value channel 0 only


@pytest.mark.parametrize(
    "scale, error",
    [
        (float("inf"), ValueError),
        (float("nan"), ValueError),
        (1e-300, ValueError),
        (1e39, ValueError),
        (0.0, ValueError),
        ("0.5", TypeError),
        (True, TypeError),
        (torch.tensor(0.5), TypeError),
    ],
    ids=["inf", "nan", "underflows_float32", "overflows_float32", "zero", "string", "bool", "tensor"],
)
def test_scales_that_would_give_nan_are_refused(scale, error):
    q, k, v = qkv(1, 1, 3, 3, 2, 2)
    with pytest.raises(error, match="softmax_attention: scale must be"):
        attnbook.softmax_attention(q, k, v, scale=scale, is_causal=True)


def test_the_reference_is_finite_where_the_answer_is():
    """0.2.0's literal softmax formed exp of every score before masking: a causal row whose future keys score
    far above its visible ones, or a row whose visible scores all carry a -1e30 float mask, gave inf * 0 = NaN."""
    q = torch.randn(1, 1, 6, 4, dtype=torch.float64) * 30
    v = torch.randn(1, 1, 6, 4, dtype=torch.float64)
    out = reference.softmax_attention(q, q.flip(2), v, is_causal=True)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, q.flip(2), v, is_causal=True))
    mask = torch.full((6, 6), -1e30, dtype=torch.float64)
    out = reference.softmax_attention(q, q, v, is_causal=True, attn_mask=mask)
    expected = F.scaled_dot_product_attention(
        q, q, v, attn_mask=mask.masked_fill(~torch.ones(6, 6).tril().bool(), -torch.inf)
    )
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, expected)


def test_the_references_warn_that_mask_is_deprecated():
    """The changelog of 0.2.0 promised a FutureWarning for mask=; the references gave none."""
    q, k, v = qkv(1, 2, 4, 4, 3, 3)
    allowed = torch.ones(4, 4, dtype=torch.bool).tril()
    with pytest.warns(FutureWarning, match="reference.softmax_attention: mask= is deprecated"):
        old = reference.softmax_attention(q, k, v, mask=allowed)
    torch.testing.assert_close(old, reference.softmax_attention(q, k, v, attn_mask=allowed))
    layer = attnbook.MoHAttention(8, num_heads=2)
    x = torch.randn(1, 4, 8)
    with pytest.warns(FutureWarning, match="reference.moh_layer: mask= is deprecated"):
        reference.moh_layer(layer, x, mask=allowed)
