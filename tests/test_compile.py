"""Every public function and layer traces under ``torch.compile(fullgraph=True)`` as one graph, with and without
gradients, causal and not, and the compiled call gives eager's numbers.

The ``eager`` backend checks tracing only (no code generation), so this is fast. ``fullgraph=True`` turns any
graph break into an error; on a GPU a break would mean no fusion across it. The sizes are chosen so that the
causal blocks span several rows of (B H) and several chunks (where non-contiguous ``out=`` tensors once broke
the graph), and so that a partial chunk remains.
"""

import pytest
import torch
from support import tol

from attnbook import _prefix
from attnbook.mechanisms import MECHANISMS

B, H, D, CHUNK = 2, 2, 8, 16
LENGTHS = [pytest.param(64, id="whole_chunks"), pytest.param(70, id="partial_chunk")]
FUNCTIONS = [
    pytest.param(n, c, id=f"{n}-causal" if c else n)
    for n, m in MECHANISMS.items()
    if m.function is not None
    for c in ((False, True) if m.causal else (False,))
]
LAYERS = [
    pytest.param(n, c, id=f"{n}-causal" if c else n)
    for n, m in MECHANISMS.items()
    for c in ((False, True) if m.causal else (False,))
]
STEPS = [pytest.param(n, id=n) for n, m in MECHANISMS.items() if m.step is not None]
GRAD = [pytest.param(False, id="no_grad"), pytest.param(True, id="grad")]


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    """Each case traces from scratch (no cache hits, no recompilation limits shared between cases)."""
    torch._dynamo.reset()


def compiled(fn):
    return torch.compile(fn, backend="eager", fullgraph=True)


def check_same(fn, inputs, grad: bool):
    """fn(*inputs) compiled as one graph equals eager; with ``grad``, so do the gradients of its sum."""
    eager_in = [x.detach().clone().requires_grad_(grad) for x in inputs]
    comp_in = [x.detach().clone().requires_grad_(grad) for x in inputs]
    with torch.set_grad_enabled(grad):
        expected = fn(*eager_in)
        got = compiled(fn)(*comp_in)
    torch.testing.assert_close(got, expected, **tol(torch.float32))
    if grad:
        expected.sum().backward()
        got.sum().backward()
        for i, (a, b) in enumerate(zip(comp_in, eager_in, strict=True)):
            torch.testing.assert_close(a.grad, b.grad, **tol(torch.float32), msg=lambda m, i=i: f"grad {i}: {m}")


def qkv(N, B=B):
    return [torch.randn(B, H, N, D) for _ in range(3)]


@pytest.mark.parametrize("grad", GRAD)
@pytest.mark.parametrize("name, causal", FUNCTIONS)
def test_every_function_compiles_as_one_graph(name, causal, grad):
    kwargs = {"is_causal": True} if causal else {}
    if name in ("linear", "flow"):
        kwargs["chunk_size"] = CHUNK
    fn = MECHANISMS[name].function
    check_same(lambda q, k, v: fn(q, k, v, **kwargs), qkv(64), grad)


@pytest.mark.parametrize("grad", GRAD)
@pytest.mark.parametrize("name, causal", LAYERS)
def test_every_layer_compiles_as_one_graph(name, causal, grad):
    layer = MECHANISMS[name].module(16, 2, causal=causal)
    if hasattr(layer, "chunk_size"):
        layer.chunk_size = CHUNK
    x = torch.randn(B, 64, 16)
    check_same(layer, [x], grad)  # the input's gradient
    if grad:  # and every parameter's: compiled, then eager, on the same layer
        grads = []
        for fn in (compiled(layer), layer):
            layer.zero_grad()
            fn(x).sum().backward()
            grads.append([p.grad.clone() for p in layer.parameters()])
        for (pname, _), a, b in zip(layer.named_parameters(), *grads, strict=True):
            torch.testing.assert_close(a, b, **tol(torch.float32), msg=lambda m, pname=pname: f"{pname}: {m}")


@pytest.mark.parametrize("grad", GRAD)
@pytest.mark.parametrize("name", STEPS)
def test_every_step_compiles_as_one_graph(name, grad):
    step = MECHANISMS[name].step
    q, k, v = (torch.randn(B, H, D) for _ in range(3))
    check_same(lambda q, k, v: step(q, k, v)[0], [q, k, v], grad)


@pytest.mark.parametrize("reverse", [False, True], ids=["forwards", "backwards"])
@pytest.mark.parametrize("N", LENGTHS)
def test_the_prefix_kernel_compiles_as_one_graph(N, reverse):
    check_same(lambda q, k, v: _prefix.prefix_product(q, k, v, CHUNK, reverse), qkv(N, B=1), False)
    if not reverse:
        check_same(lambda q, k, v: _prefix.causal_dot_product(q, k, v, CHUNK), qkv(N, B=1), True)


def test_causal_linear_attention_has_no_graph_break_in_explain():
    """The case that once broke 1 (no grad) and 4 (grad) times: torch._dynamo.explain counts zero breaks."""
    fn = MECHANISMS["linear"].function
    for grad in (False, True):
        torch._dynamo.reset()
        q, k, v = (x.requires_grad_(grad) for x in qkv(64))
        with torch.set_grad_enabled(grad):
            explained = torch._dynamo.explain(lambda q, k, v: fn(q, k, v, is_causal=True, chunk_size=CHUNK))(q, k, v)
        assert explained.graph_break_count == 0, [str(r.reason) for r in explained.break_reasons]
        assert explained.graph_count == 1
