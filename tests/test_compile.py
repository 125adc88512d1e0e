"""Every public function, layer and step traces under ``torch.compile(fullgraph=True)`` at every shape: at three
batch sizes and lengths (the second shape once broke every module: an error message was built from a symbolic
size), and with ``dynamic=True``; the compiled calls give eager's numbers, gradients included, and a dynamic
compile is not recompiled at further lengths.

The ``eager`` backend checks tracing only (no code generation), so this is fast. On a GPU the same tests run
with code generation: ``ATTNBOOK_COMPILE_DEVICE=cuda ATTNBOOK_COMPILE_BACKEND=inductor pytest tests/test_compile.py``
(what ``benchmarks/gpu_session.sh`` does); every tensor is then made on that device. ``fullgraph=True`` turns any
graph break into an error; on a GPU a break would mean no fusion across it. The lengths put partial chunks
and several chunks in the causal paths (chunk size 16).
"""

import os

import pytest
import torch
from support import tol

from attnbook import _prefix
from attnbook.lm import DecoderLM
from attnbook.mechanisms import MECHANISMS

BACKEND = os.environ.get("ATTNBOOK_COMPILE_BACKEND", "eager")
DEVICE = os.environ.get("ATTNBOOK_COMPILE_DEVICE", "cpu")
H, D, CHUNK = 2, 8, 16
SHAPES = [(2, 64), (3, 70), (1, 5)]  # (B, N): whole chunks, a partial chunk, less than a chunk
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
# (grad, dynamic): inference compiled with dynamic=True, training with torch's default (automatic dynamic shapes:
# the second shape recompiles with symbolic sizes); together they cover both tracers' paths at a test's cost.
MODES = [pytest.param(False, True, id="no_grad-dynamic"), pytest.param(True, None, id="grad-automatic")]


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    """Each case traces from scratch (no cache hits, no recompilation limits shared between cases), with every
    tensor and layer made on DEVICE."""
    torch._dynamo.reset()
    with torch.device(DEVICE):
        yield


def compiled(fn, dynamic=None):
    return torch.compile(fn, backend=BACKEND, fullgraph=True, dynamic=dynamic)


def check_same(fn, compiled_fn, inputs, grad: bool):
    """compiled_fn(*inputs) equals fn(*inputs); with ``grad``, so do the gradients of a random upstream."""
    eager_in = [x.detach().clone().requires_grad_(grad) for x in inputs]
    comp_in = [x.detach().clone().requires_grad_(grad) for x in inputs]
    with torch.set_grad_enabled(grad):
        expected = fn(*eager_in)
        got = compiled_fn(*comp_in)
    torch.testing.assert_close(got, expected, **tol(torch.float32))
    if grad:
        upstream = torch.randn_like(expected)
        expected.backward(upstream)
        got.backward(upstream)
        for i, (a, b) in enumerate(zip(comp_in, eager_in, strict=True)):
            torch.testing.assert_close(a.grad, b.grad, **tol(torch.float32), msg=lambda m, i=i: f"grad {i}: {m}")


def frame_count() -> int:
    """How many graphs dynamo has compiled so far (each recompilation adds one)."""
    return torch._dynamo.utils.counters["stats"]["unique_graphs"]


@pytest.mark.parametrize("grad, dynamic", MODES)
@pytest.mark.parametrize("name, causal", FUNCTIONS)
def test_every_function_compiles_as_one_graph_at_every_shape(name, causal, grad, dynamic):
    kwargs = {"is_causal": True} if causal else {}
    if name in ("linear", "flow"):
        kwargs["chunk_size"] = CHUNK
    fn = MECHANISMS[name].function

    def call(q, k, v):
        return fn(q, k, v, **kwargs)

    cfn = compiled(call, dynamic)
    for B, N in SHAPES:
        check_same(call, cfn, [torch.randn(B, H, N, D) for _ in range(3)], grad)


@pytest.mark.parametrize("grad, dynamic", MODES)
@pytest.mark.parametrize("name, causal", LAYERS)
def test_every_layer_compiles_as_one_graph_at_every_shape(name, causal, grad, dynamic):
    layer = MECHANISMS[name].module(16, 2, causal=causal)
    if hasattr(layer, "chunk_size"):
        layer.chunk_size = CHUNK
    clayer = compiled(layer, dynamic)
    for B, N in SHAPES:
        check_same(layer, clayer, [torch.randn(B, N, 16)], grad)  # the input's gradient
    if grad:  # and every parameter's: compiled, then eager, on the same layer
        x = torch.randn(2, 33, 16)
        grads = []
        for fn in (clayer, layer):
            layer.zero_grad()
            fn(x).sum().backward()
            grads.append([p.grad.clone() for p in layer.parameters()])
        for (pname, _), a, b in zip(layer.named_parameters(), *grads, strict=True):
            torch.testing.assert_close(a, b, **tol(torch.float32), msg=lambda m, pname=pname: f"{pname}: {m}")


@pytest.mark.parametrize("name, causal", LAYERS)
def test_a_dynamic_layer_is_not_recompiled_at_other_lengths(name, causal):
    """After the first dynamic compile, ten more batch sizes and lengths reuse its graph (no recompilation)."""
    layer = MECHANISMS[name].module(16, 2, causal=causal).eval()
    clayer = compiled(layer, dynamic=True)
    with torch.no_grad():
        clayer(torch.randn(2, 40, 16))
        first = frame_count()
        for B, N in [(2, 41), (3, 17), (2, 64), (4, 65), (2, 100), (3, 2), (2, 129), (5, 33), (2, 7), (3, 256)]:
            x = torch.randn(B, N, 16)
            torch.testing.assert_close(clayer(x), layer(x), **tol(torch.float32))
    assert frame_count() == first, f"{frame_count() - first} recompilations after the first dynamic graph"


@pytest.mark.parametrize("grad", GRAD)
@pytest.mark.parametrize("name", STEPS)
def test_every_step_compiles_as_one_graph(name, grad):
    step = MECHANISMS[name].step

    def call(q, k, v):
        return step(q, k, v)[0]

    ccall = compiled(call)
    for B in (2, 3):
        check_same(call, ccall, [torch.randn(B, H, D) for _ in range(3)], grad)


@pytest.mark.parametrize("name", [n for n, m in MECHANISMS.items() if m.causal and m.inputs == "qkv"] + ["moh"])
def test_every_layer_step_and_prefill_compile(name):
    """A causal layer's prefill (forward with output_final_state) and its one-token step compile as graphs."""
    layer = MECHANISMS[name].module(16, 2, causal=True).eval()
    x = torch.randn(2, 9, 16)
    with torch.no_grad():
        y, state = layer(x, output_final_state=True)
        cy, cstate = compiled(lambda x: layer(x, output_final_state=True))(x)
        torch.testing.assert_close(cy, y, **tol(torch.float32))
        x_t = torch.randn(2, 16)
        expected, _ = layer.step(x_t, state)
        got, _ = compiled(layer.step)(x_t, cstate)
    torch.testing.assert_close(got, expected, **tol(torch.float32))


@pytest.mark.parametrize("name", [n for n, m in MECHANISMS.items() if m.causal])
def test_the_language_model_compiles_for_training_at_every_length(name):
    """DecoderLM's forward (token ids, no host read of their range while traced) and its gradients."""
    torch.manual_seed(0)
    model = DecoderLM(name, dim=16, n_heads=2, n_layers=1)
    cmodel = compiled(model, dynamic=True)
    for B, N in SHAPES:
        tokens = torch.randint(0, 256, (B, N))
        torch.testing.assert_close(cmodel(tokens), model(tokens), **tol(torch.float32))
    model.zero_grad()
    cmodel(tokens).logsumexp(-1).sum().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


@pytest.mark.parametrize("reverse", [False, True], ids=["forwards", "backwards"])
@pytest.mark.parametrize("N", [64, 70])
def test_the_prefix_kernel_compiles_as_one_graph(N, reverse):
    def fwd(q, k, v):
        return _prefix.prefix_product(q, k, v, CHUNK, reverse)

    check_same(fwd, compiled(fwd), [torch.randn(1, H, N, D) for _ in range(3)], False)
    if not reverse:

        def dot(q, k, v):
            return _prefix.causal_dot_product(q, k, v, CHUNK)

        check_same(dot, compiled(dot), [torch.randn(1, H, N, D) for _ in range(3)], True)


@pytest.mark.parametrize("name, causal", LAYERS)
def test_no_layer_breaks_its_graph(name, causal):
    """Without fullgraph, torch._dynamo.explain counts zero graph breaks and one graph per layer call (once
    three per layer: the error strings built from symbolic sizes)."""
    layer = MECHANISMS[name].module(16, 2, causal=causal)
    for grad in (False, True):
        torch._dynamo.reset()
        with torch.set_grad_enabled(grad):
            explained = torch._dynamo.explain(layer)(torch.randn(2, 33, 16))
        assert explained.graph_break_count == 0, [str(r.reason) for r in explained.break_reasons]
        assert explained.graph_count == 1


def test_compiling_is_not_exporting_where_torch_folds_is_exporting_to_true(monkeypatch):
    """Some torch releases fold ``torch.compiler.is_exporting()`` to True inside any dynamo trace (torch 2.11 on
    an H200: compiled causal linear attention took the export-only path and broke its graph at an ``item()``).
    With that behaviour imitated, causal layers still compile as one graph and a compiled MoH layer still keeps
    its load-balancing loss (which it leaves out only when exported). Here, on torch 2.13, only the MoH half fails
    without the fix: this torch folds the ``item()`` of a constant instead of breaking the graph."""
    monkeypatch.setattr(torch.compiler, "is_exporting", lambda: torch.compiler.is_compiling())  # True only traced
    for name in ("linear", "flow"):
        layer = MECHANISMS[name].module(16, 2, causal=True)
        x = torch.randn(2, 40, 16)
        torch.testing.assert_close(compiled(layer, dynamic=True)(x), layer(x), **tol(torch.float32))
    moh = MECHANISMS["moh"].module(16, 4).train()
    compiled(moh)(torch.randn(2, 9, 16))
    assert moh.load_balancing_loss is not None
