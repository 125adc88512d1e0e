"""One mask convention, torch's, in every function and layer.

* ``attn_mask`` as in ``scaled_dot_product_attention``: bool True = may attend, or a float added to the scores,
  in every shape SDPA broadcasts; checked against SDPA itself on the same inputs.
* ``key_padding_mask`` as in ``nn.MultiheadAttention``: (B, M), True = padding; checked against
  ``nn.MultiheadAttention`` with the same weights and inputs.
* ``is_causal`` per call, also on layers built non-causal.
* Flow- and Mobile-Attention take padding: the real positions equal a run on the unpadded sequence, and
  garbage in the padding (NaN, inf) changes nothing.
* A mechanism that cannot honour an ``attn_mask`` says so.
"""

import pytest
import torch
import torch.nn.functional as F
from support import qkv, tol
from torch import nn

import attnbook
from attnbook import reference
from attnbook.mechanisms import MECHANISMS

B, H, N, M, D = 2, 3, 7, 9, 8


def random_bool(*shape, seed=0, p=0.6):
    return torch.rand(*shape, generator=torch.Generator().manual_seed(seed)) < p


SDPA_MASKS = {  # id -> a mask SDPA broadcasts to (B, H, N, M); every row keeps key 0 so that SDPA has no NaN
    "bool-NM": lambda: random_bool(N, M) | (torch.arange(M) == 0),
    "bool-B1NM": lambda: random_bool(B, 1, N, M, seed=1) | (torch.arange(M) == 0),
    "bool-BHNM": lambda: random_bool(B, H, N, M, seed=2) | (torch.arange(M) == 0),
    "bool-B11M": lambda: random_bool(B, 1, 1, M, seed=3) | (torch.arange(M) == 0),
    "float-NM": lambda: torch.randn(N, M, generator=torch.Generator().manual_seed(4)),
    "float-BHNM": lambda: torch.randn(B, H, N, M, generator=torch.Generator().manual_seed(5)),
    "float-inf": lambda: torch.where(random_bool(B, 1, N, M, seed=6) | (torch.arange(M) == 0), 0.0, float("-inf")),
}


@pytest.mark.parametrize("mask_id", list(SDPA_MASKS))
def test_softmax_attention_takes_sdpas_attn_mask_and_gives_sdpas_numbers(mask_id):
    q, k, v = qkv(B, H, N, M, D, D)
    mask = SDPA_MASKS[mask_id]()
    expected = F.scaled_dot_product_attention(q, k, v, mask)
    torch.testing.assert_close(attnbook.softmax_attention(q, k, v, mask), expected, **tol(torch.float32))
    torch.testing.assert_close(attnbook.softmax_attention(q, k, v, attn_mask=mask), expected, **tol(torch.float32))
    torch.testing.assert_close(
        reference.softmax_attention(q, k, v, attn_mask=mask).float(), expected, **tol(torch.float32)
    )


def test_is_causal_and_scale_as_in_sdpa():
    q, k, v = qkv(B, H, N, N, D, D)
    for kwargs in ({"is_causal": True}, {"scale": 0.3}, {"is_causal": True, "scale": 2.0}):
        torch.testing.assert_close(
            attnbook.softmax_attention(q, k, v, **kwargs),
            F.scaled_dot_product_attention(q, k, v, **kwargs),
            **tol(torch.float32),
        )


def test_a_mask_and_is_causal_together_and_an_empty_row_give_zeros_not_nan():
    """SDPA refuses attn_mask with is_causal, and what it gives for a row with nothing allowed depends on the
    kernel (NaN on some); attnbook combines the two masks and gives zeros on every backend."""
    q, k, v = qkv(B, H, N, N, D, D)
    mask = random_bool(B, 1, N, N)
    mask[0, 0, 3] = False  # query 3 of the first sequence may attend to nothing
    out = attnbook.softmax_attention(q, k, v, mask, is_causal=True)
    expected = reference.softmax_attention(q, k, v, attn_mask=mask, is_causal=True)
    torch.testing.assert_close(out.double(), expected, **tol(torch.float32))
    assert (out[0, :, 3] == 0).all()


@pytest.mark.parametrize(
    "masks",
    [
        {"is_causal": True, "key_padding_mask": torch.tensor([[True, False, False, False]])},
        {"attn_mask": torch.tensor([[False] * 4, [True] * 4, [True] * 4, [True] * 4])},
        {"attn_mask": torch.tensor([[float("-inf")] * 4, [0.0] * 4, [0.0] * 4, [0.0] * 4])},
    ],
    ids=["left-padding", "bool-row", "inf-row"],
)
def test_a_query_with_no_key_that_holds_nan_gets_zeros_and_gives_no_nan_gradient(masks):
    """The docstring's promise, zeros "whatever it holds", for gradients too: the NaN filler of a left-padded
    query (which sees no key) reached SDPA and every key's and value's gradient was NaN."""
    q, k, v = (
        torch.randn(1, 1, 4, 4, generator=torch.Generator().manual_seed(i), requires_grad=True) for i in range(3)
    )
    poisoned = torch.where(torch.arange(4)[:, None] == 0, float("nan"), q)
    out = attnbook.softmax_attention(poisoned, k, v, **masks)
    out.sum().backward()
    assert (out[0, 0, 0] == 0).all() and torch.isfinite(out).all()
    assert (q.grad[0, 0, 0] == 0).all() and torch.isfinite(q.grad).all()
    assert torch.isfinite(k.grad).all() and torch.isfinite(v.grad).all()
    clean = attnbook.softmax_attention(q.detach(), k.detach(), v.detach(), **masks)
    torch.testing.assert_close(out[0, 0, 1:], clean[0, 0, 1:])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_a_float_mask_is_added_in_the_inputs_dtype_where_a_value_beyond_its_range_forbids(dtype):
    """A float mask of -1e5 is -inf in float16 (and -1e39 in bfloat16), as SDPA adds it: a row of such values has
    no key and gets zeros by the package's rule, whatever its query holds (it was judged before the cast: a NaN
    query there gave a NaN row); a row with one such value is the row with that key forbidden."""
    big = 1e5 if dtype == torch.float16 else 1e39
    q, k, v = (torch.randn(1, 2, 3, 4, generator=torch.Generator().manual_seed(i)).to(dtype) for i in range(3))
    mask = torch.zeros(3, 3, dtype=torch.float64)
    mask[2] = -big  # beyond the dtype's range: no key
    mask[1, 0] = -big  # key 0 forbidden for query 1
    out = attnbook.softmax_attention(torch.where(torch.arange(3)[:, None] == 2, float("nan"), q), k, v, attn_mask=mask)
    assert (out[:, :, 2] == 0).all()
    allowed = torch.tensor([[True] * 3, [False, True, True], [True] * 3])  # row 2: any, it is zeroed
    expected = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=allowed)
    torch.testing.assert_close(out[:, :, :2].float(), expected[:, :, :2], atol=1e-2, rtol=1e-2)
    padding = torch.tensor([[0.0, 0.0, -big]], dtype=torch.float64)  # a float key_padding_mask alike
    out = attnbook.softmax_attention(q, k, v, key_padding_mask=padding)
    expected = F.scaled_dot_product_attention(
        q.float(), k.float(), v.float(), attn_mask=torch.tensor([[True, True, False]])
    )
    torch.testing.assert_close(out.float(), expected.expand_as(out), atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("kind", ["bool", "float"])
def test_key_padding_mask_as_in_multihead_attention(kind):
    """SoftmaxAttention with MHA's weights, fed MHA's inputs and mask, gives MHA's output."""
    C, heads = 12, 3
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(C, heads, batch_first=True).eval()
    ours = attnbook.SoftmaxAttention(C, C, C, heads).eval()
    W, b = mha.in_proj_weight.detach(), mha.in_proj_bias.detach()
    with torch.no_grad():
        for i, proj in enumerate((ours.query_projection, ours.key_projection, ours.value_projection)):
            proj.weight.copy_(W[i * C : (i + 1) * C])
            proj.bias.copy_(b[i * C : (i + 1) * C])
        ours.out_projection.weight.copy_(mha.out_proj.weight)
        ours.out_projection.bias.copy_(mha.out_proj.bias)
    x, y = torch.randn(B, N, C), torch.randn(B, M, C)
    padding = torch.zeros(B, M, dtype=torch.bool)
    padding[0, 6:] = True
    padding[1, 2] = True
    mask = padding if kind == "bool" else torch.where(padding, -1e4, 0.0) + torch.randn(B, M) * 0.1
    expected, _ = mha(x, y, y, key_padding_mask=mask, need_weights=False)
    torch.testing.assert_close(ours(x, y, y, key_padding_mask=mask), expected, **tol(torch.float32))
    # and is_causal per call, as MHA's with its causal mask
    causal = nn.Transformer.generate_square_subsequent_mask(N)
    expected, _ = mha(x, x, x, attn_mask=causal, is_causal=True, need_weights=False)
    torch.testing.assert_close(ours(x, is_causal=True), expected, **tol(torch.float32))


def test_moh_takes_timms_attn_mask_and_mhas_key_padding_mask():
    layer = attnbook.MoHAttention(16, num_heads=4, shared_head=1, routed_head=2, qkv_bias=True).double().eval()
    x = torch.randn(B, N, 16, dtype=torch.float64)
    padding = torch.zeros(B, N, dtype=torch.bool)
    padding[0, 5:] = True
    allowed = ~padding[:, None, None, :]  # the same mask as an attn_mask (True = may attend)
    bias = torch.randn(B, 4, N, N, dtype=torch.float64)
    for kwargs, ref in (
        ({"key_padding_mask": padding}, {"key_padding_mask": padding}),
        ({"attn_mask": allowed}, {"attn_mask": allowed}),
        ({"attn_mask": bias, "is_causal": True}, {"attn_mask": bias, "is_causal": True}),
        ({"key_padding_mask": padding, "is_causal": True}, {"key_padding_mask": padding, "is_causal": True}),
    ):
        expected = reference.moh_layer(layer, x, **ref)[0]
        torch.testing.assert_close(layer(x, **kwargs), expected, **tol(torch.float64))
    torch.testing.assert_close(layer(x, key_padding_mask=padding), layer(x, attn_mask=allowed))


POSITION_MECHANISMS = [pytest.param(n, c, id=f"{n}-causal" if c else n) for n in ("softmax", "linear", "flow",
                       "mobile", "moh") for c in ((False, True) if MECHANISMS[n].causal else (False,))]  # fmt: skip


@pytest.mark.parametrize("poison", [None, float("nan"), float("inf")], ids=["clean", "nan", "inf"])
@pytest.mark.parametrize("name, causal", POSITION_MECHANISMS)
def test_a_padded_batch_equals_each_sequence_run_alone(name, causal, poison):
    """Every layer with key_padding_mask: each sequence's real tokens get the outputs of the sequence run on its
    own, without padding, whatever the padding holds. Causal layers are padded on the left as well (batched
    generation): a padded position does not count as a token."""
    torch.manual_seed(0)
    layer = MECHANISMS[name].module(16, 4, causal=causal).double().eval()
    lengths = [9, 5, 7]
    x = torch.randn(3, 9, 16, dtype=torch.float64)
    padding = torch.ones(3, 9, dtype=torch.bool)
    starts = [0, 0, 2] if causal else [0, 0, 0]  # the third sequence: two padded positions first
    for i, (n, s) in enumerate(zip(lengths, starts, strict=True)):
        padding[i, s : s + n] = False
    if poison is not None:
        x = x.masked_fill(padding.unsqueeze(-1), poison)
    out = layer(x, key_padding_mask=padding)
    for i, (n, s) in enumerate(zip(lengths, starts, strict=True)):
        alone = layer(x[i : i + 1, s : s + n])
        torch.testing.assert_close(out[i : i + 1, s : s + n], alone, **tol(torch.float64))
    if name in ("flow", "mobile"):  # a padded position receives no flow
        assert (out[padding] == layer.out_projection.bias).all()


@pytest.mark.parametrize("name", ["softmax", "linear", "flow", "mobile"])
def test_one_tensor_as_queries_keys_and_values_is_self_attention(name):
    """nn.MultiheadAttention is called as mha(x, x, x, key_padding_mask=pad): the same tensor three times is
    self-attention, so a padded position receives no flow there either (Flow-Attention's real outputs would
    change otherwise). A copy of x as the keys is cross-attention: only the keys are padded."""
    torch.manual_seed(0)
    layer = MECHANISMS[name].module(16, 4).double().eval()
    x = torch.randn(2, 9, 16, dtype=torch.float64)
    padding = torch.zeros(2, 9, dtype=torch.bool)
    padding[0, 6:] = True
    self_attention = layer(x, key_padding_mask=padding)
    torch.testing.assert_close(layer(x, x, x, key_padding_mask=padding), self_attention, rtol=0, atol=0)
    torch.testing.assert_close(layer(x, x, key_padding_mask=padding), self_attention, rtol=0, atol=0)
    alone = layer(x[:1, :6])
    torch.testing.assert_close(layer(x, x, x, key_padding_mask=padding)[:1, :6], alone, **tol(torch.float64))
    if name == "flow":  # padded queries are sinks of cross-attention: the real outputs differ
        crossed = layer(x, x.clone(), x.clone(), key_padding_mask=padding)[:1, :6]
        assert (crossed - alone).abs().max() > 1e-3


@pytest.mark.parametrize("name", ["linear", "flow", "mobile"])
def test_a_mechanism_without_weights_refuses_an_attn_mask_and_says_why(name):
    q, k, v = qkv(B, H, N, N, D, D)
    mask = torch.ones(N, N, dtype=torch.bool)
    message = r"attn_mask must be None \(.* never forms the N x M weights.*key_padding_mask"
    with pytest.raises(ValueError, match=message):
        MECHANISMS[name](q, k, v, attn_mask=mask)
    layer = MECHANISMS[name].module(16, 4)
    with pytest.raises(ValueError, match=r"attn_mask must be None"):
        layer(torch.randn(B, N, 16), attn_mask=mask)


@pytest.mark.parametrize("name", ["softmax", "linear", "flow", "moh"])
def test_is_causal_per_call_on_a_layer_built_non_causal(name):
    layer = MECHANISMS[name].module(16, 4).double().eval()
    causal_layer = MECHANISMS[name].module(16, 4, causal=True).double().eval()
    causal_layer.load_state_dict(layer.state_dict())
    x = torch.randn(2, 8, 16, dtype=torch.float64)
    torch.testing.assert_close(layer(x, is_causal=True), causal_layer(x))
    changed = x.clone()
    changed[:, 5:] = torch.randn(2, 3, 16, dtype=torch.float64)
    torch.testing.assert_close(layer(changed, is_causal=True)[:, :5], layer(x, is_causal=True)[:, :5])


def test_the_deprecated_names_still_work_and_warn():
    q, k, v = qkv(B, H, N, N, D, D)
    mask = random_bool(N, N) | torch.eye(N, dtype=torch.bool)
    with pytest.warns(FutureWarning, match="causal= is deprecated since attnbook 0.2.0, use is_causal="):
        old = attnbook.linear_attention(q, k, v, causal=True)
    torch.testing.assert_close(old, attnbook.linear_attention(q, k, v, is_causal=True))
    with pytest.warns(FutureWarning, match="mask= is deprecated since attnbook 0.2.0, use attn_mask="):
        old = attnbook.softmax_attention(q, k, v, mask=mask)
    torch.testing.assert_close(old, attnbook.softmax_attention(q, k, v, attn_mask=mask))
