"""``torch.export`` with a dynamic batch and length: every layer and every q, k, v function gives a program that
matches eager at other sizes, the shortest (N = 1) and sizes the export never saw, with gradients.

Traced code takes the package's graph path (no loop over sizes, no ``out=`` write, no branch on a size); the
chunked causal products get a data-dependent chunk count (``attnbook._runtime.chunk_count``), about which the
export can prove what every length needs. Once the causal linear layer exported with ``divmod`` on sizes
failed, softmax and MoH violated the length constraints (a branch on M >= 64), and the exported causal
``LinearAttention`` ran only under ``no_grad`` (an ``out=`` product wrote into a leaf).
"""

import pytest
import torch
from support import tol
from torch.export import Dim, export

from attnbook.mechanisms import MECHANISMS

# Chapter 8's mechanisms ("qkvg") are left out: their chunked forms carry the state from chunk to chunk in a
# Python loop, so an exported program (like a compiled graph) holds one number of chunks.
LAYERS = [
    pytest.param(n, c, id=f"{n}-causal" if c else n)
    for n, m in MECHANISMS.items()
    if m.inputs != "qkvg"
    for c in m.forms
]
FUNCTIONS = [
    pytest.param(n, c, id=f"{n}-causal" if c else n)
    for n, m in MECHANISMS.items()
    if m.inputs == "qkv"
    for c in m.forms
]
OTHER_SIZES = [(3, 7), (1, 1), (2, 64), (4, 33)]  # (B, N) the export never saw


class _Function(torch.nn.Module):
    def __init__(self, fn, kwargs):
        super().__init__()
        self.fn, self.kwargs = fn, kwargs

    def forward(self, q, k, v):
        return self.fn(q, k, v, **self.kwargs)


@pytest.mark.parametrize("name, causal", LAYERS)
def test_every_layer_exports_with_a_dynamic_batch_and_length(name, causal):
    layer = MECHANISMS[name].module(16, 2, causal=causal)
    arg = "x" if name == "moh" else "queries"
    program = export(layer, (torch.randn(2, 40, 16),), dynamic_shapes={arg: {0: Dim("B"), 1: Dim("N")}})
    for B, N in OTHER_SIZES:
        x = torch.randn(B, N, 16, requires_grad=True)
        x_eager = x.detach().clone().requires_grad_()
        got, expected = program.module()(x), layer(x_eager)
        torch.testing.assert_close(got, expected, **tol(torch.float32))
        upstream = torch.randn_like(expected)
        got.backward(upstream)
        expected.backward(upstream)
        torch.testing.assert_close(x.grad, x_eager.grad, **tol(torch.float32))


@pytest.mark.parametrize("name, causal", FUNCTIONS)
def test_every_function_exports_with_a_dynamic_batch_and_length(name, causal):
    kwargs = {"is_causal": True} if causal else {}
    module = _Function(MECHANISMS[name].function, kwargs)
    B, N = Dim("B"), Dim("N")
    dims = {"q": {0: B, 2: N}, "k": {0: B, 2: N}, "v": {0: B, 2: N}}
    program = export(module, tuple(torch.randn(2, 2, 40, 8) for _ in range(3)), dynamic_shapes=dims)
    for b, n in OTHER_SIZES:
        q, k, v = (torch.randn(b, 2, n, 8) for _ in range(3))
        torch.testing.assert_close(program.module()(q, k, v), module(q, k, v), **tol(torch.float32))
