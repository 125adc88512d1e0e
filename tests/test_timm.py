"""The layers in real timm (installed from PyPI with --no-deps; torchvision stood in by ``timm_stub``): a
``VisionTransformer(attn_layer=...)`` builds with timm's own constructor keywords and trains for every layer of the
package; MoHAttention also loads a timm ViT's attention weights, after which (every head shared, a zero ``wg_1``)
it computes timm's model exactly."""

import pytest
import timm_stub
import torch
from support import tol

import attnbook
from attnbook import MoHAttention

timm_stub.install()
timm = pytest.importorskip("timm")  # make test installs it (the Makefile's venv and wheel-test)
from timm.models.vision_transformer import VisionTransformer  # noqa: E402

VIT = dict(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=4, num_classes=10)


class Routed(MoHAttention):
    """MoH with 1 shared head and 2 of the other 3 routed per token, built by timm's call."""

    def __init__(self, dim, num_heads=8, **kwargs):
        super().__init__(dim, num_heads, shared_head=1, routed_head=2, **kwargs)


class AllShared(MoHAttention):
    """Every head shared: with a zero wg_1, timm's Attention."""

    def __init__(self, dim, num_heads=8, **kwargs):
        super().__init__(dim, num_heads, shared_head=num_heads, routed_head=0, **kwargs)


LAYERS = [attnbook.SoftmaxAttention, attnbook.LinearAttention, attnbook.FlowAttention, attnbook.MobileAttention]


@pytest.mark.parametrize("layer", LAYERS, ids=lambda c: c.__name__)
@pytest.mark.parametrize("qk_norm", [False, True], ids=["plain", "qk_norm"])
def test_a_vision_transformer_of_every_layer_builds_and_takes_a_training_step(layer, qk_norm):
    """timm builds each layer with its own keywords (0.2.0 refused them: "unexpected keyword argument
    'num_heads'"), and one optimiser step changes every parameter and lowers nothing to NaN."""
    torch.manual_seed(0)
    model = VisionTransformer(**VIT, attn_layer=layer, qkv_bias=True, qk_norm=qk_norm, proj_drop_rate=0.1)
    assert all(type(block.attn) is layer and block.attn.n_heads == 4 for block in model.blocks)
    assert all(isinstance(block.attn.q_norm, torch.nn.LayerNorm) == qk_norm for block in model.blocks)
    before = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss = torch.nn.functional.cross_entropy(model(torch.randn(4, 3, 32, 32)), torch.tensor([0, 1, 2, 3]))
    loss.backward()
    opt.step()
    assert torch.isfinite(loss)
    changed = [not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True)]
    assert all(changed), [n for (n, _), c in zip(model.named_parameters(), changed, strict=True) if not c]


def test_a_layer_without_attention_weights_refuses_attention_dropout():
    with pytest.raises(ValueError, match=r"LinearAttention: attn_drop must be 0.0 \(this mechanism never forms"):
        VisionTransformer(**VIT, attn_layer=attnbook.LinearAttention, attn_drop_rate=0.1)
    model = VisionTransformer(**VIT, attn_layer=attnbook.SoftmaxAttention, attn_drop_rate=0.1)
    assert model.blocks[0].attn.attn_drop == 0.1


@pytest.mark.parametrize("layer", [MoHAttention, Routed], ids=["defaults", "routed"])
def test_a_vision_transformer_builds_trains_and_compiles_with_moh(layer):
    torch.manual_seed(0)
    model = VisionTransformer(**VIT, attn_layer=layer, qkv_bias=True, qk_norm=True)
    assert all(isinstance(block.attn, MoHAttention) for block in model.blocks)
    images = torch.randn(2, 3, 32, 32)
    logits = model(images)
    assert logits.shape == (2, 10)
    logits.logsumexp(-1).sum().backward()
    assert all(p.grad is not None for n, p in model.named_parameters() if "wg" not in n)


def test_moh_takes_timms_scale_norm_and_proj_bias():
    """timm's own constructor call (vision_transformer._create_attn, what every Block makes) with the options."""
    from timm.models.vision_transformer import _create_attn

    attn = _create_attn(Routed, 64, num_heads=4, qkv_bias=True, scale_norm=True, proj_bias=False,
                        norm_layer=torch.nn.LayerNorm)  # fmt: skip
    assert isinstance(attn.norm, torch.nn.LayerNorm) and attn.proj.bias is None
    assert attn(torch.randn(2, 5, 64)).shape == (2, 5, 64)


def test_timms_vit_weights_load_into_moh_and_give_timms_outputs():
    torch.manual_seed(0)
    timm_vit = VisionTransformer(**VIT, qkv_bias=True).eval()
    moh_vit = VisionTransformer(**VIT, qkv_bias=True, attn_layer=AllShared).eval()
    missing, unexpected = moh_vit.load_state_dict(timm_vit.state_dict(), strict=False)
    assert unexpected == [] and all(".attn.wg" in k for k in missing), missing
    with torch.no_grad():
        for block in moh_vit.blocks:
            block.attn.wg_1.weight.zero_()  # every gate 1: plain multi-head attention
        images = torch.randn(2, 3, 32, 32)
        torch.testing.assert_close(moh_vit(images), timm_vit(images), **tol(torch.float32))
