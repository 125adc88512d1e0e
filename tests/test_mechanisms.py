"""The registry: every entry is complete, its function matches its float64 oracle, its layer drops in, and
every function, step and layer holds up under real use: bad shapes and sizes, autocast, second derivatives,
NaN in visible inputs."""

import pytest
import torch
from support import BAD_QKV_SHAPES, BAD_STEP_SHAPES, assert_matches_reference, qkv, tol
from torch.nn.attention import SDPBackend, sdpa_kernel

import attnbook
from attnbook import mechanisms, reference
from attnbook.mechanisms import MECHANISMS

QKV = mechanisms.names(inputs="qkv")
CAUSAL_FORMS = [(n, c) for n, m in MECHANISMS.items() for c in (False, True) if (m.causal if c else m.bidirectional)]
QKV_FORMS = [c for c in CAUSAL_FORMS if c[0] in QKV]
STEPS = [n for n, m in MECHANISMS.items() if m.step is not None and m.inputs == "qkv"]  # chapter 8's: test_recurrent
AUTOCAST = [pytest.param(torch.bfloat16, id="bfloat16"), pytest.param(torch.float16, id="float16")]


def params(forms):
    """(name, causal) pairs as parameters with readable ids: ``flow``, ``flow-causal``."""
    return [pytest.param(n, c, id=f"{n}-causal" if c else n) for n, c in forms]


def call(name: str, causal: bool, q, k, v, **kwargs):
    """The registry's function, causal only when asked (Mobile has no causal keyword)."""
    return MECHANISMS[name](q, k, v, **({"is_causal": True} if causal else {}), **kwargs)


def test_registry_names_are_keys_and_chapters_are_in_order():
    assert list(MECHANISMS) == [m.name for m in MECHANISMS.values()]
    chapters = [m.chapter for m in MECHANISMS.values()]
    assert chapters == sorted(chapters)
    assert {m.inputs for m in MECHANISMS.values()} <= {"qkv", "qkvg", "x"}
    assert all((m.gate is None) == (m.inputs != "qkvg") for m in MECHANISMS.values())
    assert all(m.causal or m.bidirectional for m in MECHANISMS.values())


def test_get_names_the_known_mechanisms_when_asked_for_an_unknown_one():
    with pytest.raises(ValueError, match=r"name must be one of 'softmax', 'linear', .*got 'sofmax'"):
        mechanisms.get("sofmax")


BAD_SHAPES = [
    *(pytest.param(n, "function", c, id=f"{n}-{c}") for n in QKV for c in BAD_QKV_SHAPES),
    *(pytest.param(n, "step", c, id=f"{n}_step-{c}") for n in STEPS for c in BAD_STEP_SHAPES),
]


@pytest.mark.parametrize("name, form, case", BAD_SHAPES)
def test_every_function_and_step_rejects_bad_shapes_naming_them(name, form, case):
    shapes, message = (BAD_QKV_SHAPES if form == "function" else BAD_STEP_SHAPES)[case]
    q, k, v = (torch.randn(*s) for s in shapes)
    fn = MECHANISMS[name].function if form == "function" else MECHANISMS[name].step
    with pytest.raises(ValueError, match=message):
        fn(q, k, v)


# id -> (inputs of layer(x) for a layer of width 8, error, message). The family quotes queries/keys/values,
# MoH quotes x; both name the layer.
BAD_LAYER_INPUTS = {
    "rank": (lambda: torch.randn(5, 8), ValueError, r"must have 3 dimensions .* \(5, 8\)"),
    "width": (lambda: torch.randn(2, 5, 7), ValueError, r"must have the last dimension .*= 8"),
    "empty_batch": (lambda: torch.randn(0, 5, 8), ValueError, r"B must be at least 1"),
    "no_tokens": (lambda: torch.randn(2, 0, 8), ValueError, r"(L|N) must be at least 1"),
    "integer": (lambda: torch.ones(2, 5, 8, dtype=torch.long), TypeError, r"must be a floating-point tensor"),
    "bool": (lambda: torch.ones(2, 5, 8, dtype=torch.bool), TypeError, r"must be a floating-point tensor"),
    "complex": (lambda: torch.ones(2, 5, 8, dtype=torch.complex64), TypeError, r"must be a floating-point tensor"),
    "float64_into_float32": (lambda: torch.randn(2, 5, 8, dtype=torch.float64), ValueError, r"layer's dtype"),
    "list": (lambda: torch.randn(2, 5, 8).tolist(), TypeError, r"must be a torch.Tensor, got a list"),
    "numpy": (lambda: torch.randn(2, 5, 8).numpy(), TypeError, r"must be a torch.Tensor, got a numpy.ndarray"),
    "meta": (lambda: torch.empty(2, 5, 8, device="meta"), ValueError, r"must be on the layer's device cpu"),
}


@pytest.mark.parametrize("name", list(MECHANISMS))
@pytest.mark.parametrize("case", list(BAD_LAYER_INPUTS), ids=str)
def test_every_layer_rejects_bad_inputs_naming_them(name, case):
    make, error, message = BAD_LAYER_INPUTS[case]
    layer = MECHANISMS[name].module(8, 2)
    with pytest.raises(error, match=rf"{type(layer).__name__}: .*{message}"):
        layer(make())


@pytest.mark.parametrize("name", mechanisms.names(inputs="qkv"))
def test_every_family_layer_rejects_keys_that_do_not_fit(name):
    layer = MECHANISMS[name].module(8, 2)
    x = torch.randn(2, 5, 8)
    with pytest.raises(ValueError, match=r"values must have the length S = 5 of keys"):
        layer(x, x, torch.randn(2, 6, 8))
    with pytest.raises(ValueError, match=r"keys and values must have the batch size B = 2 of queries"):
        layer(x, torch.randn(3, 5, 8), torch.randn(3, 5, 8))
    with pytest.raises(ValueError, match=r"S must be at least 1"):
        layer(x, torch.randn(2, 0, 8), torch.randn(2, 0, 8))


@pytest.mark.parametrize("name,causal", params(QKV_FORMS))
def test_every_qkv_function_matches_its_reference_outputs_and_gradients(name, causal):
    m = MECHANISMS[name]
    N = 9
    M = N if (causal or m.same_length) else 11
    inputs = [torch.randn(2, 3, n, 4) for n in (N, M, M)]
    kwargs = {"is_causal": True} if causal else {}
    assert_matches_reference(
        lambda q, k, v: m.function(q, k, v, **kwargs),
        lambda q, k, v: m.reference(q, k, v, **kwargs),
        inputs,
        dtype=torch.float64,
    )


@pytest.mark.parametrize("name,causal", params(CAUSAL_FORMS))
def test_every_module_is_a_self_attention_layer_of_the_model_width(name, causal):
    layer = MECHANISMS[name].module(16, 4, causal=causal).double()
    x = torch.randn(2, 7, 16, dtype=torch.float64)
    y = layer(x)
    assert y.shape == x.shape and y.dtype == x.dtype
    if causal:  # the first tokens do not see the later ones
        x2 = x.clone()
        x2[:, 4:] += 1.0
        torch.testing.assert_close(layer(x2)[:, :4], y[:, :4])


def test_the_token_layer_matches_its_reference():
    m = MECHANISMS["moh"]
    for causal in (False, True):
        layer = m.module(16, 4, causal=causal).double().eval()
        x = torch.randn(2, 7, 16, dtype=torch.float64)
        torch.testing.assert_close(layer(x), m.reference(layer, x), rtol=1e-9, atol=1e-11)


def test_calling_a_token_mechanism_on_qkv_says_how_to_use_it():
    with pytest.raises(TypeError, match=r"works on tokens \(B, N, C\).*module\(dim, n_heads\)"):
        MECHANISMS["moh"](torch.randn(1, 1, 2, 2), torch.randn(1, 1, 2, 2), torch.randn(1, 1, 2, 2))


def test_mobile_has_no_causal_form_and_says_why():
    with pytest.raises(ValueError, match="Mobile-Attention has no causal form"):
        MECHANISMS["mobile"].module(16, 4, causal=True)


# ----------------------------------------------------------------------------------------------------------
# Autocast: outputs in the autocast dtype (as SDPA), accumulation in float32, backward through the same code.
# The CPU runs bfloat16 and float16 autocast through the code that CUDA's autocast takes.


@pytest.mark.parametrize("grad", [False, True], ids=["inference", "training"])
@pytest.mark.parametrize("dtype", AUTOCAST)
@pytest.mark.parametrize("name,causal", params(QKV_FORMS))
def test_every_qkv_function_runs_under_autocast_in_the_autocast_dtype(name, causal, dtype, grad):
    m = MECHANISMS[name]
    q, k, v = (x.requires_grad_(grad) for x in qkv(2, 3, 9, 9, 4, 5))
    with torch.autocast("cpu", dtype=dtype), torch.set_grad_enabled(grad):
        out = call(name, causal, q, k, v)
    assert out.dtype == dtype, "under autocast a function returns the autocast dtype, as torch's SDPA does"
    expected = m.reference(q, k, v, **({"is_causal": True} if causal else {}))
    torch.testing.assert_close(out.double(), expected, **tol(dtype))
    if grad:
        upstream = torch.randn_like(expected)
        grads = torch.autograd.grad(out, (q, k, v), upstream.to(dtype))
        ref_grads = torch.autograd.grad(expected, (q, k, v), upstream)
        for g, r in zip(grads, ref_grads, strict=True):
            assert g.dtype == torch.float32  # gradients come back in the inputs' dtype
            torch.testing.assert_close(g, r.float(), **tol(dtype))


@pytest.mark.parametrize("dtype", AUTOCAST)
@pytest.mark.parametrize("name", QKV)
def test_float64_inputs_stay_float64_under_autocast(name, dtype):
    q, k, v = qkv(1, 2, 5, 5, 3, 3, dtype=torch.float64)
    with torch.autocast("cpu", dtype=dtype):
        assert MECHANISMS[name](q, k, v).dtype == torch.float64  # autocast never casts float64


@pytest.mark.parametrize("dtype", AUTOCAST)
@pytest.mark.parametrize("name", STEPS)
def test_every_step_function_runs_under_autocast_with_a_float32_state(name, dtype):
    q, k, v = (x.requires_grad_() for x in qkv(2, 3, 4, 4, 4, 5))
    step = MECHANISMS[name].step
    state, outs = None, []
    with torch.autocast("cpu", dtype=dtype):
        for t in range(4):
            out_t, state = step(q[:, :, t], k[:, :, t], v[:, :, t], state)
            assert out_t.dtype == dtype
            outs.append(out_t)
    assert all(x.dtype == torch.float32 for x in state if isinstance(x, torch.Tensor) and x.is_floating_point())
    parallel = MECHANISMS[name](q, k, v, is_causal=True)
    torch.testing.assert_close(torch.stack(outs, 2).float(), parallel, **tol(dtype))
    torch.stack(outs, 2).float().sum().backward()
    assert all(torch.isfinite(x.grad).all() for x in (q, k, v))


@pytest.mark.parametrize("grad", [False, True], ids=["inference", "training"])
@pytest.mark.parametrize("dtype", AUTOCAST)
@pytest.mark.parametrize("name,causal", params(CAUSAL_FORMS))
def test_every_layer_behaves_like_a_torch_layer_under_autocast(name, causal, dtype, grad):
    """float32 parameters, the autocast dtype out (as nn.Linear), float32 gradients; close to the float32 layer."""
    layer = MECHANISMS[name].module(16, 4, causal=causal).train(grad)
    x = torch.randn(2, 7, 16, requires_grad=grad)
    with torch.autocast("cpu", dtype=dtype), torch.set_grad_enabled(grad):
        out = layer(x)
    assert out.dtype == dtype
    torch.testing.assert_close(out.float(), layer(x).detach(), **tol(dtype))
    if grad:
        out.float().sum().backward()
        for p in [x, *layer.parameters()]:
            assert p.grad is not None and p.grad.dtype == torch.float32 and torch.isfinite(p.grad).all()


def test_moh_with_qk_norm_runs_under_autocast():
    """LayerNorm runs in float32 under autocast: q, k float32 beside a bfloat16 v is one dtype for autocast."""
    layer = MECHANISMS["moh"].module(16, 4, qk_norm=True)
    x = torch.randn(2, 7, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = layer(x)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), layer(x), **tol(torch.bfloat16))


# ----------------------------------------------------------------------------------------------------------
# Second derivatives: exact (gradgradcheck) for every function and step, or a clear error, never a silent
# wrong number (before, causal linear attention's custom autograd.Function returned one).


@pytest.mark.parametrize("name,causal", params(QKV_FORMS))
def test_every_qkv_function_has_exact_second_derivatives(name, causal):
    q, k, v = qkv(1, 1, 3, 3, 2, 2, dtype=torch.float64)  # chunk_size 2: a whole and a partial chunk
    inputs = [x.requires_grad_() for x in (q, k, v)]
    kwargs = {"chunk_size": 2} if causal and name != "softmax" else {}
    with sdpa_kernel(SDPBackend.MATH):  # torch's fused SDPA kernels are differentiable once only
        assert torch.autograd.gradgradcheck(lambda q, k, v: call(name, causal, q, k, v, **kwargs), inputs)


@pytest.mark.parametrize("name", STEPS)
def test_every_step_function_has_exact_second_derivatives(name):
    q, k, v = (x.requires_grad_() for x in qkv(1, 2, 1, 1, 3, 2, dtype=torch.float64))
    step = MECHANISMS[name].step

    def two_steps(q, k, v):
        _, state = step(q[:, :, 0], k[:, :, 0], v[:, :, 0])
        return step(q[:, :, 0] * 0.5, k[:, :, 0] - 1, v[:, :, 0], state)[0]

    assert torch.autograd.gradgradcheck(two_steps, [q, k, v])


def test_softmax_second_derivative_through_fused_kernels_raises_rather_than_lies():
    q, k, v = (x.requires_grad_() for x in qkv(1, 1, 4, 4, 3, 3, dtype=torch.float64))
    out = MECHANISMS["softmax"](q, k, v)
    (g,) = torch.autograd.grad(out.sum(), q, create_graph=True)
    try:
        second = torch.autograd.grad(g.square().sum(), q)[0]
    except RuntimeError as e:  # torch's fused kernels: "derivative ... is not implemented"
        assert "not implemented" in str(e)
    else:  # a backend that supports it must give the right number
        with sdpa_kernel(SDPBackend.MATH):
            out = MECHANISMS["softmax"](q, k, v)
            (g,) = torch.autograd.grad(out.sum(), q, create_graph=True)
            torch.testing.assert_close(second, torch.autograd.grad(g.square().sum(), q)[0])


# ----------------------------------------------------------------------------------------------------------
# A NaN in a visible input is never hidden


@pytest.mark.parametrize("name,causal", params(QKV_FORMS))
@pytest.mark.parametrize("bad", [float("nan"), float("inf")], ids=["nan", "inf"])
@pytest.mark.parametrize("N", [6, 100], ids=["short", "long"])
def test_a_non_finite_query_gives_a_nan_output_row_not_zeros(name, causal, N, bad):
    """Torch's CPU SDPA kernel returns zeros for a NaN query when there are fewer than 8 keys: the package
    must not, with few keys or many. (Flow and Mobile take sigmoid(q), and sigmoid(inf) = 1 exactly: an
    infinite query is a finite feature.)"""
    q, k, v = qkv(2, 2, N, N, 16, 16)
    q[0, 0, 2, 0] = bad
    out = call(name, causal, q, k, v)
    if bad == float("inf") and name in ("flow", "mobile"):
        assert torch.isfinite(out).all()
        return
    assert out[0, 0, 2].isnan().all(), "the non-finite query's output must be NaN"
    assert torch.isfinite(out[1]).all(), "other batch elements are untouched"


@pytest.mark.parametrize("position", [0, 2])
@pytest.mark.parametrize("where", ["key", "value"])
@pytest.mark.parametrize("name,causal", params(QKV_FORMS))
def test_a_nan_visible_key_or_value_reaches_the_queries_that_see_it(name, causal, where, position):
    """Position 0 too: causal query 0 sees key 0 alone, and torch's CPU SDPA gave it a finite row for a NaN key."""
    q, k, v = qkv(2, 2, 6, 6, 3, 4)
    (k if where == "key" else v)[1, 0, position, 1] = float("nan")
    out = call(name, causal, q, k, v)
    seen = out[1, 0, position:] if causal else out[1, 0]
    assert seen.isnan().any(dim=-1).all(), f"every query that sees position {position} has a NaN output"
    assert torch.isfinite(out[0]).all()


@pytest.mark.parametrize("N", [3, 8, 63])
def test_causal_query_0_that_sees_only_a_nan_key_gets_a_nan_row(N):
    """torch's fused CPU kernel (D == Dv: the test above, with D != Dv, runs the math kernel) gave query 0 a finite
    row when its one visible key held a NaN, at every length below the rule's bound."""
    q, k, v = qkv(1, 2, N, N, 4, 4)
    k[0, 1, 0, 2] = float("nan")
    out = attnbook.softmax_attention(q, k, v, is_causal=True)
    assert out[0, 1].isnan().all() and torch.isfinite(out[0, 0]).all()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("M", [64, 65, 128, 200])
def test_a_half_precision_query_holding_inf_gives_a_nan_row_at_any_length(dtype, M):
    """Above 64 keys torch's float16 and bfloat16 CPU kernels dropped an inf query to a row of zeros at some
    lengths (64, 65, 128, 200), where float32's propagate it: the rule holds at every length in half precision."""
    q, k, v = (x.to(dtype) for x in qkv(1, 2, M, M, 8, 8))
    q[0, 0, 5, 3], q[0, 1, M - 1, 0] = float("inf"), float("-inf")
    for causal in (False, True):
        out = attnbook.softmax_attention(q, k, v, is_causal=causal)
        assert out[0, 0, 5].isnan().all() and out[0, 1, M - 1].isnan().all()
        assert torch.isfinite(out[0, 0, :5]).all()


def test_a_nan_in_a_float_mask_reaches_its_row_in_the_package_and_the_reference():
    """A NaN in a float mask is added to that score, as SDPA adds it: its row is NaN. The package counted the key
    as forbidden yet added the NaN, and the reference hid it as a forbidden key (a finite row)."""
    q, k, v = qkv(1, 1, 3, 3, 4, 4)
    mask = torch.zeros(3, 3)
    mask[1, 2] = float("nan")
    mask[2] = float("nan")  # a row of NaN only: not an empty row (zeros) but a NaN one
    for out in (
        attnbook.softmax_attention(q, k, v, attn_mask=mask),
        reference.softmax_attention(q, k, v, attn_mask=mask),
    ):
        assert torch.isfinite(out[0, 0, 0]).all() and out[0, 0, 1:].isnan().all()


# ----------------------------------------------------------------------------------------------------------
# Poisoned padding: a key that no query may attend to contributes nothing, whatever it holds


def _padding(B=3, M=7):
    real = torch.ones(B, M, dtype=torch.bool)  # (B, M), True = real token
    real[1, 4:] = False
    real[2, ::3] = False
    return real


def _poison(x, real, value):
    """x (B, H, M, .) with every padded position set to ``value``."""
    x = x.clone()
    x[~real[:, None, :, None].expand_as(x)] = value
    return x


# entry point -> fn(q, k, v, real) with q (B, H, N, D), k, v (B, H, M, .) and real (B, M)
MASKED_FUNCTIONS = {
    "softmax_attention-mask": lambda q, k, v, real: MECHANISMS["softmax"](q, k, v, attn_mask=real[:, None, None, :]),
    "softmax_attention-mask-causal": lambda q, k, v, real: MECHANISMS["softmax"](
        q, k, v, attn_mask=real[:, None, None, :], is_causal=True
    ),
    "softmax_attention-per-head-mask": lambda q, k, v, real: MECHANISMS["softmax"](
        q,
        k,
        v,
        attn_mask=torch.stack([real, real.roll(1, -1)], 1)[:, :, None, :],  # (B, H, 1, M)
    ),
    "linear_attention-key_padding_mask": lambda q, k, v, real: MECHANISMS["linear"](q, k, v, key_padding_mask=~real),
    "linear_attention-key_padding_mask-causal": lambda q, k, v, real: MECHANISMS["linear"](
        q, k, v, key_padding_mask=~real, is_causal=True
    ),
}


@pytest.mark.parametrize("poison", [float("nan"), float("inf"), -1e30], ids=["nan", "inf", "huge"])
@pytest.mark.parametrize("entry", list(MASKED_FUNCTIONS))
def test_garbage_in_masked_keys_and_values_changes_nothing(entry, poison):
    fn = MASKED_FUNCTIONS[entry]
    real = _padding()
    if entry.endswith("per-head-mask"):  # head 1 pads other positions: poison only what both heads pad
        real_any = real | real.roll(1, -1)
    else:
        real_any = real
    q, k, v = qkv(3, 2, 7, 7, 4, 5)
    clean = fn(q, k, v, real)
    assert torch.isfinite(clean).all()
    k2, v2 = (_poison(x, real_any, poison).requires_grad_() for x in (k, v))
    q2 = q.clone().requires_grad_()
    out = fn(q2, k2, v2, real)
    torch.testing.assert_close(out, clean, **tol(torch.float32))
    out.backward(torch.randn_like(out))
    for g in (q2.grad, k2.grad, v2.grad):
        assert torch.isfinite(g).all()
    padded = ~real_any[:, None, :, None].expand_as(k2)
    assert (k2.grad[padded] == 0).all() and (v2.grad[padded[..., :1].expand_as(v2)] == 0).all()


@pytest.mark.parametrize("poison", [float("nan"), float("inf")], ids=["nan", "inf"])
@pytest.mark.parametrize("name", ["softmax", "linear"])
def test_garbage_in_padded_tokens_does_not_reach_a_layers_other_outputs(name, poison):
    layer = MECHANISMS[name].module(8, 2).eval()
    real = _padding()
    x = torch.randn(3, 7, 8)  # queries
    y = torch.randn(3, 7, 8)  # keys and values, padded where real is False
    mask = {"attn_mask": real[:, None, None, :]} if name == "softmax" else {"key_padding_mask": ~real}
    clean = layer(x, y, y, **mask)
    y[~real] = poison
    torch.testing.assert_close(layer(x, y, y, **mask), clean)


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "explicit"])
@pytest.mark.parametrize("poison", [float("nan"), float("inf")], ids=["nan", "inf"])
def test_garbage_in_padded_tokens_does_not_reach_moh_real_tokens(poison, fused):
    """MoH's keys and values are projections of x: padded tokens hold garbage in k and v (and in their own
    output rows and routing, which belong to them); the real tokens' outputs do not change."""
    layer = MECHANISMS["moh"].module(8, 2).eval()
    layer.fused_attn = fused
    real = _padding()
    x = torch.randn(3, 7, 8)
    mask = real[:, None, None, :]  # (B, 1, 1, N): nobody attends to a padded token
    clean = layer(x, attn_mask=mask)
    x[~real] = poison
    out = layer(x, attn_mask=mask)
    torch.testing.assert_close(out[real], clean[real])
