"""Chapter 8's mechanisms, gated linear attention (decay, gates) and the delta rule: the chunked forms and the
steps against the literal float64 loops of :mod:`attnbook.reference` and fla's naive recurrences, gradients, any
chunk length, states carried across calls, the layers, half precision, autocast and bad input. (Compiling with
inductor is in ``test_compile.py``.)"""

import pytest
import torch
import torch.nn.functional as F
from published import fla_delta_rule_recurrence, fla_naive_recurrent_gla
from support import qkv, tol

import attnbook
from attnbook import reference
from attnbook.mechanisms import MECHANISMS
from attnbook.testing import assert_matches_reference

GATED = ["decay", "gated", "delta"]  # the registry's "qkvg" mechanisms


def gate_for(name, q, generator=None):
    """A valid gate for inputs like q (B, H, N, D): log-decays (per head or per key dimension), or beta in (0, 1)."""
    kind = MECHANISMS[name].gate
    shape = q.shape if kind == "key decay" else q.shape[:-1]
    x = torch.randn(shape, generator=generator, dtype=torch.float64).to(q.dtype)
    return torch.sigmoid(x) if kind == "beta" else F.logsigmoid(x)


def inputs(name, B=2, H=3, N=23, D=5, Dv=4, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = qkv(B, H, N, N, D, Dv, dtype=dtype, generator=g)
    if name == "delta":
        k = F.normalize(k, dim=-1)  # unit keys, as the layer makes them
    return q, k, v, gate_for(name, q, g)


@pytest.mark.parametrize("chunk_size", [1, 3, 8, 16, 64])  # 3 and 8 do not divide N = 23; 64 > N
@pytest.mark.parametrize("name", GATED)
def test_the_chunked_form_equals_the_literal_loop_in_float64(name, chunk_size):
    q, k, v, gate = inputs(name)
    S0 = torch.randn(2, 3, 5, 4, dtype=torch.float64)
    fn, ref = MECHANISMS[name].function, MECHANISMS[name].reference
    out, S = fn(q, k, v, gate, initial_state=S0, output_final_state=True, chunk_size=chunk_size)
    ref_out, ref_S = ref(q, k, v, gate, initial_state=S0, output_final_state=True)
    torch.testing.assert_close(out, ref_out, **tol(torch.float64))
    torch.testing.assert_close(S, ref_S, **tol(torch.float64))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("name", GATED)
def test_outputs_and_gradients_match_the_float64_loop(name, dtype):
    q, k, v, gate = inputs(name, N=37)
    fn, ref = MECHANISMS[name].function, MECHANISMS[name].reference
    assert_matches_reference(lambda *a: fn(*a, chunk_size=8), ref, [q, k, v, gate], dtype=dtype)


@pytest.mark.parametrize("name", GATED)
def test_second_derivatives_are_exact(name):
    q, k, v, gate = (x.detach().requires_grad_() for x in inputs(name, B=1, H=2, N=9, D=3, Dv=2))
    fn = MECHANISMS[name].function
    assert torch.autograd.gradgradcheck(lambda *a: fn(*a, chunk_size=4), (q, k, v, gate))


@pytest.mark.parametrize("name", GATED)
def test_the_package_matches_flas_naive_recurrences_in_float32(name):
    q, k, v, gate = inputs(name, dtype=torch.float32, N=40, D=8, Dv=8)
    S0 = torch.randn(2, 3, 8, 8)
    out, S = MECHANISMS[name].function(q, k, v, gate, initial_state=S0, output_final_state=True)
    if name == "delta":
        fla_out, fla_S = fla_delta_rule_recurrence(q, k, v, gate, initial_state=S0)
    else:
        gk = gate if gate.dim() == 4 else gate.unsqueeze(-1).expand_as(q)  # fla's gk is per key dimension
        fla_out, fla_S = fla_naive_recurrent_gla(*(x.transpose(1, 2) for x in (q, k, v, gk)), initial_state=S0)
        fla_out = fla_out.transpose(1, 2)  # fla's (B, T, H, V) -> (B, H, N, V)
    torch.testing.assert_close(out, fla_out, **tol(torch.float32))
    torch.testing.assert_close(S, fla_S, **tol(torch.float32))


@pytest.mark.parametrize("cuts", [(1,), (7,), (16, 17), (5, 6, 30)], ids=lambda c: "-".join(map(str, c)))
@pytest.mark.parametrize("name", GATED)
def test_a_call_split_in_pieces_through_its_state_equals_one_call(name, cuts):
    q, k, v, gate = inputs(name, N=40)
    fn = MECHANISMS[name].function
    whole, final = fn(q, k, v, gate, output_final_state=True, chunk_size=8)
    pieces, state, start = [], None, 0
    for stop in (*cuts, 40):
        part = [x[:, :, start:stop] for x in (q, k, v, gate)]
        out, state = fn(*part, initial_state=state, output_final_state=True, chunk_size=8)
        pieces.append(out)
        start = stop
    torch.testing.assert_close(torch.cat(pieces, dim=2), whole, **tol(torch.float64))
    torch.testing.assert_close(state, final, **tol(torch.float64))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("name", GATED)
def test_the_steps_are_the_recurrence_and_reach_the_final_state(name, dtype):
    q, k, v, gate = (x.to(dtype) for x in inputs(name, N=12))
    out, final = MECHANISMS[name].function(q, k, v, gate, output_final_state=True)
    state, outs = None, []
    for t in range(12):
        o_t, state = MECHANISMS[name].step(q[:, :, t], k[:, :, t], v[:, :, t], gate[:, :, t], state)
        outs.append(o_t)
    torch.testing.assert_close(torch.stack(outs, 2), out, **tol(dtype))
    torch.testing.assert_close(state, final, **tol(dtype))


def test_a_decay_of_minus_infinity_forgets_everything_exactly():
    q, k, v, g = inputs("gated", N=12)
    g = g.clone()
    g[:, :, 5] = -torch.inf  # token 5 wipes the state before writing its own pair
    out = attnbook.gated_linear_attention(q, k, v, g, chunk_size=4)
    torch.testing.assert_close(out, reference.gated_linear_attention(q, k, v, g))
    later = attnbook.gated_linear_attention(q[:, :, 5:], k[:, :, 5:], v[:, :, 5:], g[:, :, 5:], chunk_size=4)
    torch.testing.assert_close(out[:, :, 5:], later)  # nothing from before token 5 survives
    assert torch.isfinite(out).all()


def test_no_decay_is_causal_linear_attention_without_its_normaliser():
    q, k, v, _ = inputs("gated", N=20)
    zero = torch.zeros(q.shape[:-1], dtype=q.dtype)
    mask = torch.ones(20, 20, dtype=torch.bool).tril()
    expected = ((q @ k.transpose(-2, -1)) * q.shape[-1] ** -0.5).masked_fill(~mask, 0) @ v
    torch.testing.assert_close(attnbook.gated_linear_attention(q, k, v, zero), expected)


def test_a_delta_write_with_beta_one_replaces_the_value_under_a_unit_key():
    q, k, v, _ = inputs("delta", N=2)
    k = k[:, :, :1].expand(-1, -1, 2, -1)  # the same unit key twice
    _, S = attnbook.delta_rule_attention(q, k, v, torch.ones(2, 3, 2), output_final_state=True)
    torch.testing.assert_close((S.transpose(-2, -1) @ k[:, :, 0, :, None])[..., 0], v[:, :, 1])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["float16", "bfloat16"])
@pytest.mark.parametrize("name", GATED)
def test_half_precision_inputs_give_half_outputs_from_float32_work(name, dtype):
    q, k, v, gate = inputs(name, N=30, dtype=torch.float32)
    out, S = MECHANISMS[name].function(*(x.to(dtype) for x in (q, k, v, gate)), output_final_state=True)
    assert out.dtype == dtype and S.dtype == torch.float32
    halves = [x.to(dtype).double() for x in (q, k, v, gate)]  # the rounded inputs, exactly
    torch.testing.assert_close(out.double(), MECHANISMS[name].reference(*halves), **tol(dtype))


@pytest.mark.parametrize("name", GATED)
def test_under_autocast_a_layer_returns_the_autocast_dtype_and_float32_gradients(name):
    layer = MECHANISMS[name].module(16, 2)
    x = torch.randn(2, 9, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y, S = layer(x, output_final_state=True)
    assert y.dtype == torch.bfloat16 and S.dtype == torch.float32
    y.float().sum().backward()
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in layer.parameters())
    torch.testing.assert_close(y.float(), layer(x), rtol=0.05, atol=0.05)


@pytest.mark.parametrize("name", GATED)
def test_every_layer_matches_its_literal_float64_evaluation_with_padding(name):
    torch.manual_seed(0)
    layer = MECHANISMS[name].module(16, 4).double()
    x = torch.randn(3, 11, 16, dtype=torch.float64)
    pad = torch.zeros(3, 11, dtype=torch.bool)
    pad[1, 8:] = True  # right padding
    pad[2, :3] = True  # left padding, as batched generation pads a prompt
    y = layer(x, key_padding_mask=pad)
    torch.testing.assert_close(y, reference.recurrent_layer(layer, x, key_padding_mask=pad))
    real = layer(x[2:, 3:])  # a padded token neither writes nor decays: the real tokens get the unpadded outputs
    torch.testing.assert_close(y[2:, 3:], real)


@pytest.mark.parametrize("poison", [float("nan"), float("inf")], ids=["nan", "inf"])
@pytest.mark.parametrize("name", GATED)
def test_what_a_padded_token_holds_reaches_no_real_output_state_or_gradient(name, poison):
    """NaN or inf filler in a padded token: the real outputs, the final state and every gradient stay those of
    clean filler (k * keep made NaN * 0 = NaN, and the state was NaN from the padded token on)."""
    torch.manual_seed(2)
    layer = MECHANISMS[name].module(16, 2)
    x = torch.randn(2, 7, 16)
    pad = torch.zeros(2, 7, dtype=torch.bool)
    pad[0, :2] = True
    pad[1, 4] = True
    results = []
    for filler in (0.0, poison):
        xi = x.clone().requires_grad_()
        y, S = layer(torch.where(pad[..., None], filler, xi), key_padding_mask=pad, output_final_state=True)
        layer.zero_grad()
        y[~pad].square().sum().backward()
        results.append((y[~pad], S, xi.grad, [p.grad.clone() for p in layer.parameters()]))
    (y0, S0, gx0, gp0), (y1, S1, gx1, gp1) = results
    torch.testing.assert_close(y1, y0)
    torch.testing.assert_close(S1, S0)
    torch.testing.assert_close(gx1, gx0)
    for a, b in zip(gp1, gp0, strict=True):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("name", GATED)
def test_layer_gradients_match_the_float64_evaluation(name):
    torch.manual_seed(1)
    layer = MECHANISMS[name].module(16, 2)
    twin = MECHANISMS[name].module(16, 2).double()
    twin.load_state_dict(layer.state_dict())
    x = torch.randn(2, 19, 16)
    w = torch.randn(2, 19, 16, dtype=torch.float64)
    (layer(x) * w.float()).sum().backward()
    (reference.recurrent_layer(twin, x.double()) * w).sum().backward()
    for (n, p), q in zip(layer.named_parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(p.grad.double(), q.grad, **tol(torch.float32), msg=lambda m, n=n: f"{n}: {m}")


@pytest.mark.parametrize("name", GATED)
def test_layers_take_device_and_dtype_and_reset_parameters(name):
    layer = MECHANISMS[name].module(16, 2, device="cpu", dtype=torch.float64)
    assert {p.dtype for p in layer.parameters()} == {torch.float64}
    before = [p.clone() for p in layer.parameters()]
    layer.reset_parameters()
    assert any(not torch.equal(a, b) for a, b in zip(before, layer.parameters(), strict=True))


def test_retnet_decays_are_one_per_head_and_fixed():
    layer = attnbook.GatedLinearAttention(16, 4, decay="fixed")
    g = layer.gates(torch.randn(2, 7, 16))
    assert g.shape == (2, 4, 7) and torch.equal(g[0, :, 0], g[1, :, 6])
    torch.testing.assert_close(g[0, :, 0].exp(), 1 - 2.0 ** (-5 - torch.arange(4.0)))


BAD = [
    ("gated_linear_attention", lambda q, k, v, g, b: attnbook.gated_linear_attention(q, k, v, -g.abs()[..., :2]),
     ValueError, r"g must have shape \(2, 3, 6\) or \(2, 3, 6, 4\)"),
    ("gated_linear_attention", lambda q, k, v, g, b: attnbook.gated_linear_attention(q, k, v, g.to("meta")),
     ValueError, r"g must be on q's device cpu"),
    ("gated_linear_attention",
     lambda q, k, v, g, b: attnbook.gated_linear_attention(q, k[:, :, :5], v[:, :, :5], -g.abs()),
     ValueError, r"k must have as many keys as q has queries \(N == M\) \(it is causal only\)"),
    ("gated_linear_attention", lambda q, k, v, g, b: attnbook.gated_linear_attention(
        q, k, v, -g.abs(), initial_state=torch.zeros(2, 3, 4, 5)),
     ValueError, r"initial_state must have shape \(B, H, D, Dv\) = \(2, 3, 4, 4\)"),
    ("gated_linear_attention", lambda q, k, v, g, b: attnbook.gated_linear_attention(
        q, k, v, -g.abs(), initial_state=torch.zeros(2, 3, 4, 4, dtype=torch.float64)),
     ValueError, r"initial_state must be in the accumulation dtype torch.float32"),
    ("gated_linear_attention", lambda q, k, v, g, b: attnbook.gated_linear_attention(q, k, v, -g.abs(), scale=0),
     ValueError, r"scale"),
    ("delta_rule_attention", lambda q, k, v, g, b: attnbook.delta_rule_attention(q, k, v, g),
     ValueError, r"beta must have shape \(2, 3, 6\) for q \(2, 3, 6, 4\), got a float32 tensor of shape"),
    ("delta_rule_attention", lambda q, k, v, g, b: attnbook.delta_rule_attention(q, k, v, b.long()),
     TypeError, r"beta must be a floating-point"),
    ("delta_rule_attention", lambda q, k, v, g, b: attnbook.delta_rule_attention(q, k, v, b, chunk_size=0),
     ValueError, r"chunk_size must be"),
    ("delta_rule_step", lambda q, k, v, g, b: attnbook.delta_rule_step(q[:, :, 0], k[:, :, 0], v[:, :, 0], b),
     ValueError, r"beta_t must have shape \(2, 3\)"),
]  # fmt: skip


@pytest.mark.parametrize("where, call, error, message", BAD, ids=[f"{b[0]}-{i}" for i, b in enumerate(BAD)])
def test_bad_input_is_refused_with_a_message_naming_it(where, call, error, message):
    q, k, v = qkv(2, 3, 6, 6, 4, 4)
    g, b = torch.randn(2, 3, 6, 4), torch.rand(2, 3, 6)
    with pytest.raises(error, match=f"{where}: .*{message}"):
        call(q, k, v, g, b)


@pytest.mark.parametrize("name", GATED)
def test_the_layers_are_causal_only(name):
    with pytest.raises(ValueError, match=rf"MECHANISMS\['{name}'\].module: causal must be True \(.*causal only"):
        MECHANISMS[name].module(16, 2, causal=False)
    layer = MECHANISMS[name].module(16, 2)
    with pytest.raises(ValueError, match="is_causal must be True .*causal only"):
        layer(torch.randn(1, 4, 16), is_causal=False)
