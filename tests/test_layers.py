"""Every layer follows torch's layer conventions: ``device=`` and ``dtype=`` at construction, and
``reset_parameters()`` that draws the parameters again (and only them)."""

import pytest
import torch

import attnbook
from attnbook.lm import DecoderLM

LAYERS = {
    "SoftmaxAttention": lambda **kw: attnbook.SoftmaxAttention(16, 16, 8, 4, **kw),
    "LinearAttention": lambda **kw: attnbook.LinearAttention(16, 16, 8, 4, causal=True, **kw),
    "FlowAttention": lambda **kw: attnbook.FlowAttention(16, 16, 8, 4, **kw),
    "MobileAttention": lambda **kw: attnbook.MobileAttention(16, 16, 8, 4, **kw),
    "MoHAttention": lambda **kw: attnbook.MoHAttention(16, 4, shared_head=1, routed_head=2, qk_norm=True, **kw),
    "DecoderLM": lambda **kw: DecoderLM("flow", dim=16, n_heads=4, n_layers=1, **kw),
}


@pytest.mark.parametrize("name", list(LAYERS))
def test_dtype_and_device_at_construction(name):
    layer = LAYERS[name](dtype=torch.float64, device="cpu")
    assert {p.dtype for p in layer.parameters()} == {torch.float64}
    assert {p.device.type for p in layer.parameters()} == {"cpu"}
    meta = LAYERS[name](device="meta")  # no storage: torch's way to build a large model before loading it
    assert {p.device.type for p in meta.parameters()} == {"meta"}


@pytest.mark.parametrize("name", list(LAYERS))
def test_reset_parameters_draws_every_weight_again(name):
    torch.manual_seed(0)
    layer = LAYERS[name]()
    before = {n: p.detach().clone() for n, p in layer.named_parameters()}
    with torch.no_grad():
        for p in layer.parameters():
            p.fill_(7.0)
    layer.reset_parameters()
    for n, p in layer.named_parameters():
        assert not (p == 7.0).all(), f"{n} was not reset"
        if p.dim() >= 2:  # weights are random: drawn again, not restored
            assert p.shape == before[n].shape and torch.isfinite(p).all()
