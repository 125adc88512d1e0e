"""MoHAttention drops into a timm-style block that passes masks, and causal MoH equals its float64 reference.

timm's ``vision_transformer.Block`` calls its attention as ``self.attn(self.norm1(x), attn_mask=attn_mask)``;
the block below is that block with the causal flag passed on too (layer scale and drop path as
``nn.Identity``, their disabled form in timm), so it is the call a decoder built from timm blocks makes.
"""

import pytest
import torch
from support import tol
from torch import nn

from attnbook import MoHAttention, reference

COUNTS = [(4, 1, 2), (4, 0, 2), (6, 2, 2), (4, 4, 0)]  # (H, shared_head, routed_head)
IDS = [f"H{h}-s{s}-k{k}" for h, s, k in COUNTS]


class TimmStyleBlock(nn.Module):
    """timm's ViT block (pre-norm attention and MLP), with the attention's mask arguments passed through."""

    def __init__(self, dim: int, attn: nn.Module):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = attn
        self.ls1 = nn.Identity()
        self.drop_path1 = nn.Identity()
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
        self.ls2 = nn.Identity()
        self.drop_path2 = nn.Identity()

    def forward(self, x, attn_mask=None, is_causal=False):
        x = x + self.drop_path1(self.ls1(self.attn(self.norm1(x), attn_mask=attn_mask, is_causal=is_causal)))
        return x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))


def layer(counts, **kw):
    H, s, k = counts
    return MoHAttention(8 * H, H, qkv_bias=True, shared_head=s, routed_head=k, **kw).double()


def reference_block(block, x, *, attn_mask=None, is_causal=False):
    """The block with its attention evaluated literally, in float64, by attnbook.reference.moh_layer."""
    h = block.norm1(x)
    x = x + reference.moh_layer(block.attn, h, attn_mask=attn_mask, is_causal=is_causal)[0]
    return x + block.mlp(block.norm2(x))


def random_mask(B, H, N, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(B, H, N, N, generator=g) < 0.6


@pytest.mark.parametrize("counts", COUNTS, ids=IDS)
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("masked", [False, True], ids=["no-mask", "mask"])
def test_moh_in_a_timm_style_block_equals_the_masked_float64_reference(counts, is_causal, masked):
    block = TimmStyleBlock(8 * counts[0], layer(counts)).double().eval()
    x = torch.randn(2, 9, 8 * counts[0], dtype=torch.float64)
    mask = random_mask(2, counts[0], 9) if masked else None
    with torch.no_grad():
        out = block(x, attn_mask=mask, is_causal=is_causal)
        ref = reference_block(block, x, attn_mask=mask, is_causal=is_causal)
    torch.testing.assert_close(out, ref, **tol(torch.float64))


@pytest.mark.parametrize("counts", COUNTS, ids=IDS)
@pytest.mark.parametrize("N", [1, 7, 33], ids=lambda n: f"N{n}")
def test_a_causal_layer_equals_the_causal_reference_outputs_and_input_gradients(counts, N):
    moh = layer(counts, causal=True)
    x = torch.randn(2, N, 8 * counts[0], dtype=torch.float64, requires_grad=True)
    out = moh(x)
    ref_x = x.detach().clone().requires_grad_(True)
    ref = reference.moh_layer(moh, ref_x)[0]  # the reference reads the layer's causal flag
    torch.testing.assert_close(out, ref, **tol(torch.float64))
    upstream = torch.randn_like(ref)
    (g,) = torch.autograd.grad(out, x, upstream)
    (g_ref,) = torch.autograd.grad(ref, ref_x, upstream)
    torch.testing.assert_close(g, g_ref, **tol(torch.float64))


def test_the_causal_flag_and_is_causal_agree_and_differ_from_full_attention():
    causal = layer((4, 1, 2), causal=True)
    plain = layer((4, 1, 2))
    plain.load_state_dict(causal.state_dict())
    x = torch.randn(1, 6, 32, dtype=torch.float64)
    with torch.no_grad():
        a, b, full = causal(x), plain(x, is_causal=True), plain(x)
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert not torch.allclose(a[:, :-1], full[:, :-1])  # all but the last token see less in the causal form
    torch.testing.assert_close(a[:, -1], full[:, -1], **tol(torch.float64))  # the last token sees everything


def test_causal_moh_never_looks_ahead():
    moh = layer((6, 2, 2), causal=True)
    x = torch.randn(1, 10, 48, dtype=torch.float64)
    y = x.clone()
    y[:, 6:] += 1.0
    with torch.no_grad():
        a, b = moh(x), moh(y)
    torch.testing.assert_close(a[:, :6], b[:, :6], **tol(torch.float64))
    assert not torch.allclose(a[:, 6:], b[:, 6:])


def test_a_query_with_nothing_to_attend_to_gets_zero_heads_not_nan():
    moh = layer((4, 1, 2))
    x = torch.randn(1, 5, 32, dtype=torch.float64)
    mask = torch.ones(1, 4, 5, 5, dtype=torch.bool)
    mask[..., 0, :] = False  # query 0 may attend to nothing
    with torch.no_grad():
        out = moh(x, attn_mask=mask, is_causal=True)
        ref = reference.moh_layer(moh, x, attn_mask=mask, is_causal=True)[0]
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out[:, 0], moh.proj.bias.expand(1, 32), **tol(torch.float64))  # zero heads
    torch.testing.assert_close(out, ref, **tol(torch.float64))


def test_a_mask_of_the_wrong_shape_or_dtype_raises_naming_it():
    moh = layer((4, 1, 2))
    x = torch.randn(1, 5, 32, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"MoHAttention: attn_mask must broadcast to .*\(1, 4, 5, 4\)"):
        moh(x, attn_mask=torch.ones(1, 4, 5, 4, dtype=torch.bool))
    with pytest.raises(TypeError, match="attn_mask must be a bool tensor .* or a floating one"):
        moh(x, attn_mask=torch.ones(1, 4, 5, 5, dtype=torch.long))
