"""Every public function, layer and step under ``torch.compile(fullgraph=True)``: with inductor, torch's default
backend, which generates code, and with the ``eager`` backend, which only traces (cheap, so it covers every
function and both gradient modes).

With inductor: every layer trains (outputs, input and parameter gradients equal eager's) at four lengths
under ``dynamic=True`` with one graph; every causal layer's prefill (a KV cache or a recurrent state out) and
its one-token step compile once each and serve every length and every token; the language model trains at
three lengths with one graph. ``ATTNBOOK_COMPILE_DEVICE=cuda`` runs the same on a GPU (what
``benchmarks/gpu_session.sh`` does). ``fullgraph=True`` turns any graph break into an error. The lengths put
partial chunks and several chunks in the causal paths (chunk size 16).
"""

import inspect
import os

import pytest
import torch
from support import tol

from attnbook.lm import DecoderLM
from attnbook.mechanisms import MECHANISMS

DEVICE = os.environ.get("ATTNBOOK_COMPILE_DEVICE", "cpu")
H, D, CHUNK = 2, 8, 16
SHAPES = [(2, 64), (3, 70), (1, 5)]  # (B, N): whole chunks, a partial chunk, less than a chunk
# Chapter 8's mechanisms ("qkvg") carry their state from chunk to chunk in a Python loop, so a graph holds one
# number of chunks: they have their own tests at the end of this file.
ONE_GRAPH = [n for n, m in MECHANISMS.items() if m.inputs != "qkvg"]
FUNCTIONS = [
    pytest.param(n, c, id=f"{n}-causal" if c else n)
    for n, m in MECHANISMS.items()
    if m.inputs == "qkv"
    for c in m.forms
]
LAYERS = [pytest.param(n, c, id=f"{n}-causal" if c else n) for n in ONE_GRAPH for c in MECHANISMS[n].forms]
STEPS = [pytest.param(n, id=n) for n, m in MECHANISMS.items() if m.step is not None and m.inputs == "qkv"]
GATED = [n for n, m in MECHANISMS.items() if m.inputs == "qkvg"]
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


def compiled(fn, dynamic=None, backend="eager"):
    return torch.compile(fn, backend=backend, fullgraph=True, dynamic=dynamic)


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


@pytest.mark.parametrize("name, causal", LAYERS)
def test_every_layer_trains_under_inductor_at_four_lengths_with_one_graph(name, causal):
    """0.2.0's causal LinearAttention and FlowAttention failed at the second length ("expected size 4==4, stride
    2112==1088" in the generated backward): outputs, input and parameter gradients equal eager's at every length,
    and the first dynamic graph serves them all."""
    torch.manual_seed(0)
    layer = MECHANISMS[name].module(16, 2, causal=causal)
    if hasattr(layer, "chunk_size"):
        layer.chunk_size = CHUNK
    clayer = compiled(layer, dynamic=True, backend="inductor")
    for i, (B, N) in enumerate([(2, 17), (3, 33), (2, 70), (3, 5)]):  # B = 1 would be specialised
        x = torch.randn(B, N, 16)
        grads = []
        for fn in (clayer, layer):
            layer.zero_grad()
            xi = x.clone().requires_grad_()
            y = fn(xi)
            y.backward(torch.ones_like(y))
            grads.append([y, xi.grad, *(p.grad.clone() for p in layer.parameters())])
        for a, b in zip(*grads, strict=True):
            torch.testing.assert_close(a, b, **tol(torch.float32))
        if i == 0:
            first = frame_count()
    assert frame_count() == first, f"{frame_count() - first} recompilations after the first dynamic graph"


@pytest.mark.parametrize("name", [n for n in ONE_GRAPH if MECHANISMS[n].causal])
def test_every_prefill_and_step_compile_once_for_every_length_and_token(name):
    """A causal layer's prefill (forward with output_final_state: a KV cache, a LinearState or a FlowState) and
    its one-token step, compiled by inductor with dynamic shapes: eager's outputs, and two graphs in all for three
    prompt lengths and five tokens after each (0.2.0: a compiled softmax or MoH step raised "name 's17' is not
    defined" with dynamic shapes, and recompiled at every token without them; a KV cache could not be traced
    past one length)."""
    layer = MECHANISMS[name].module(16, 2, causal=True).eval()
    start = frame_count()
    prefill = compiled(lambda x: layer(x, output_final_state=True), dynamic=True, backend="inductor")
    step = compiled(layer.step, dynamic=True, backend="inductor")
    with torch.no_grad():
        for N in (9, 17, 4):
            x = torch.randn(2, N + 5, 16)
            y, state = prefill(x[:, :N])
            expected, eager_state = layer(x[:, :N], output_final_state=True)
            torch.testing.assert_close(y, expected, **tol(torch.float32))
            for t in range(N, N + 5):
                y_t, state = step(x[:, t], state)
                expected, eager_state = layer.step(x[:, t], eager_state)
                torch.testing.assert_close(y_t, expected, **tol(torch.float32))
    assert frame_count() - start == 2, f"{frame_count() - start} graphs for a prefill and a step"


# DecoderLM's own code (token ids, embeddings, blocks, the head) is the same for every mechanism, and every
# mechanism's layer trains under inductor above: the model is compiled with one, causal linear attention's chunked
# form (each case costs 25 to 65 s on a cold inductor cache, the largest part of a CI run).
@pytest.mark.parametrize("name", ["linear"])
def test_the_language_model_trains_under_inductor_at_every_length(name):
    """DecoderLM's forward (token ids, no host read of their range while traced) and its gradients, one graph."""
    torch.manual_seed(0)
    model = DecoderLM(name, dim=16, n_heads=2, n_layers=1)
    cmodel = compiled(model, dynamic=True, backend="inductor")
    start = frame_count()
    for B, N in SHAPES:
        tokens = torch.randint(0, 256, (B, N))
        torch.testing.assert_close(cmodel(tokens), model(tokens), **tol(torch.float32))
    model.zero_grad()
    cmodel(tokens).logsumexp(-1).sum().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
    assert frame_count() - start <= 2, "one graph for the forward of every length (and one for the last backward)"


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


# -- chapter 8: a graph per number of chunks ----------------------------------------------------------------------


@pytest.mark.parametrize("name", GATED)
def test_chapter_8_layers_train_under_inductor_at_three_lengths(name):
    """Outputs, input and parameter gradients equal eager's at three lengths; the chunk loop holds one number of
    chunks per graph, so there is at most one graph per number of chunks (and never a graph break)."""
    torch.manual_seed(0)
    layer = MECHANISMS[name].module(16, 2)
    clayer = compiled(layer, dynamic=True, backend="inductor")
    start = frame_count()
    # two chunks (the second partial, then full), and less than one: each graph unrolls at most two chunks (a
    # cold inductor cache spent over a minute a case on the three to five chunks of lengths 17 and 33)
    ell = inspect.signature(MECHANISMS[name].function).parameters["chunk_size"].default
    lengths = [(2, ell + 1), (3, 2 * ell), (3, ell // 2 + 1)]
    for B, N in lengths:
        x = torch.randn(B, N, 16)
        grads = []
        for fn in (clayer, layer):
            layer.zero_grad()
            xi = x.clone().requires_grad_()
            y = fn(xi)
            y.backward(torch.ones_like(y))
            grads.append([y, xi.grad, *(p.grad.clone() for p in layer.parameters())])
        for a, b in zip(*grads, strict=True):
            torch.testing.assert_close(a, b, **tol(torch.float32))
    assert frame_count() - start <= len(lengths), "more graphs than lengths"


@pytest.mark.parametrize("name", GATED)
def test_chapter_8_steps_compile_once_for_every_token(name):
    """The one-token step has no loop: one graph, from no state and from every state after it."""
    layer = MECHANISMS[name].module(16, 2).eval()
    step = compiled(layer.step, dynamic=True, backend="inductor")
    x = torch.randn(2, 6, 16)
    with torch.no_grad():
        _, state = layer(x[:, :3], output_final_state=True)
        eager_state = state
        start = frame_count()
        for t in range(3, 6):
            y_t, state = step(x[:, t], state)
            expected, eager_state = layer.step(x[:, t], eager_state)
            torch.testing.assert_close(y_t, expected, **tol(torch.float32))
    assert frame_count() - start == 1


def test_a_timed_compiled_step_is_compiled_or_fails(monkeypatch):
    """Chapter 7's generation benchmark times ``DecoderLM.step`` compiled; past torch's recompile limit (8 graphs of
    that one method, here lowered to 1) torch would run the step eagerly and it would be timed as compiled (the
    recording of 0a79af3 compiled 12 models in one process). The step is compiled with fullgraph=True, so that
    this is an error, not a number."""
    from attnbook.lab import generation, lm

    real_compile = torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: real_compile(fn, **{**kw, "backend": "eager"}))
    monkeypatch.setattr(torch._dynamo.config, "recompile_limit", 1)
    options = dict(positions=[4], repeats=1, warmup=0, decoders=["compiled"], burst=1, progress=False)
    generation.measure(lm.SMALL, mechanism_names=["linear"], **options)  # one model: one graph
    with pytest.raises(torch._dynamo.exc.FailOnRecompileLimitHit):
        generation.measure(lm.SMALL, mechanism_names=["flow"], **options)  # another: past the limit
