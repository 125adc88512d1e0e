"""MoHAttention against the reference code, the literal float64 definition, and the properties of its gates."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from published import ReferenceCodeMoH
from support import DEVICES, FLOAT_DTYPES, assert_matches_reference, tol
from torch import nn
from torch.func import functional_call

import attnbook
from attnbook import HeadRouting, MoHAttention, moh_load_balancing_loss, reference


def reference_runs(H, s, k, dim=8):
    """Whether the reference code constructs and runs (one training forward) for these head counts."""
    try:
        ReferenceCodeMoH(dim, H, shared_head=s, routed_head=k, head_dim=2)(torch.randn(1, 3, dim))
    except (RuntimeError, AttributeError, ValueError, IndexError):
        return False
    return True


def our_rule(H, s, k):
    """The valid head counts, as MoHAttention's docstring states them."""
    if k == 0:
        return s == H
    return s + k <= H


ALL_COUNTS = [(H, s, k) for H in range(1, 6) for s in range(0, H + 2) for k in range(0, H + 2)]
VALID = [c for c in ALL_COUNTS if our_rule(*c)]
INVALID = [c for c in ALL_COUNTS if not our_rule(*c)]
REFERENCE_SUPPORTED = [c for c in VALID if c[1] != 1]  # checked against the reference code below


def cid(c):
    return "H{}-s{}-k{}".format(*c)


def twin(H, s, k, *, dim=12, seed=0, **kwargs):
    """A reference-code layer and a MoHAttention holding its weights (loaded strictly: same names/shapes)."""
    torch.manual_seed(seed)
    ref = ReferenceCodeMoH(dim, H, shared_head=s, routed_head=k, **kwargs)
    for name, p in ref.named_parameters():  # LayerNorm starts at (1, 0): make every parameter matter
        if "norm" in name:
            p.data.add_(0.3 * torch.randn_like(p))
    kwargs.pop("fused", None)
    ours = MoHAttention(dim, H, shared_head=s, routed_head=k, **kwargs)
    ours.load_state_dict(ref.state_dict(), strict=True)
    return ref, ours


# ----------------------------------------------------------------------------------------------------------
# Which configurations exist
# ----------------------------------------------------------------------------------------------------------


@pytest.mark.filterwarnings("ignore:Initializing zero-element tensors")
def test_valid_configurations_are_the_reference_ones_plus_one_shared_head():
    """Every configuration the reference runs is valid here; the only additions are shared_head = 1."""
    runs = {c for c in ALL_COUNTS if reference_runs(*c)}
    assert runs == set(REFERENCE_SUPPORTED)
    assert set(VALID) - runs == {c for c in VALID if c[1] == 1}
    assert any(c[1] == 1 and c[2] > 0 for c in VALID) and (1, 1, 0) in VALID


@pytest.mark.parametrize("counts", VALID, ids=cid)
def test_every_valid_configuration_runs_with_consistent_routing(counts):
    H, s, k = counts
    m = MoHAttention(10, H, shared_head=s, routed_head=k, head_dim=3)
    assert hasattr(m, "wg") == (k > 0)
    assert hasattr(m, "wg_0") == (k > 0 and s > 0)
    assert hasattr(m, "wg_1") == (s > 1)
    x = torch.randn(2, 5, 10)
    for training in (True, False):
        m.train(training)
        out, r = m(x, return_routing=True)
        assert out.shape == x.shape and torch.isfinite(out).all()
        assert isinstance(r, HeadRouting)
        E = H - s if k else 0
        assert r.gates.shape == r.selected.shape == (2, 5, H)
        assert r.routed_probs.shape == (2, 5, E) and r.load.shape == r.importance.shape == (E,)
        assert (r.selected.sum(-1) == s + k).all(), "each token uses its shared heads and k routed heads"
        assert r.selected[..., :s].all()
        assert (r.gates[~r.selected] == 0).all() and (r.gates[r.selected] > 0).all()
        assert torch.isfinite(r.loss) and r.loss.shape == ()
        if k:
            torch.testing.assert_close(r.load.sum(), torch.tensor(float(k)))
            assert (m.load_balancing_loss is r.loss) == training
        else:
            assert m.load_balancing_loss is None and r.loss == 0


@pytest.mark.parametrize("counts", INVALID, ids=cid)
def test_invalid_head_counts_raise_and_say_why(counts):
    H, s, k = counts
    with pytest.raises(ValueError, match=r"MoHAttention: .*(never|only|no head|more shared)"):
        MoHAttention(10, H, shared_head=s, routed_head=k, head_dim=2)


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        (dict(shared_head=-1, routed_head=2), ValueError, "shared_head must be an int >= 0"),
        (dict(shared_head=0, routed_head=-2), ValueError, "routed_head must be an int >= 0"),
        (dict(shared_head=1.0, routed_head=2), TypeError, "shared_head must be an int, got 1.0"),
        (dict(shared_head=True, routed_head=2), TypeError, "shared_head must be an int, got True"),
        (dict(num_heads=0, shared_head=0, routed_head=1), ValueError, "num_heads must be an int >= 1"),
        (dict(num_heads=True, shared_head=0, routed_head=1), TypeError, "num_heads must be an int, got True"),
        (dict(routed_head=2, head_dim=0), ValueError, "head_dim must be an int >= 1"),
        (dict(dim=3, num_heads=4, routed_head=2), ValueError, r"head_dim = dim // num_heads = 3 // 4 = 0"),
        (dict(routed_head=2, attn_drop=1.0), ValueError, r"attn_drop must be a finite number >= 0 and < 1, got 1.0"),
        (dict(routed_head=2, proj_drop=-0.1), ValueError, r"proj_drop must be a finite number >= 0 and < 1, got -0.1"),
        (dict(routed_head=2, attn_drop=None), TypeError, r"attn_drop must be a number, got None"),
        (dict(routed_head=2, qk_norm="yes"), TypeError, r"qk_norm must be True or False, got 'yes'"),
        (dict(routed_head=2, causal="False"), TypeError, r"causal must be True or False, got 'False'"),
        (
            dict(routed_head=2, qk_norm=True, norm_layer=nn.LayerNorm(2)),
            TypeError,
            r"norm_layer must be a normalisation class .*, got a LayerNorm module",
        ),
    ],
    ids=[
        "neg-shared",
        "neg-routed",
        "float-count",
        "bool-count",
        "zero-heads",
        "bool-heads",
        "zero-head-dim",
        "dim-lt-heads",
        "attn-drop",
        "proj-drop",
        "none-drop",
        "string-flag",
        "string-causal",
        "norm-layer-instance",
    ],
)
def test_invalid_arguments_raise(kwargs, error, match):
    args = dict(dim=8, num_heads=4) | kwargs
    with pytest.raises(error, match=match):
        MoHAttention(**args)


@pytest.mark.parametrize(
    "x,error,match",
    [
        (torch.randn(2, 5), ValueError, r"x must have 3 dimensions \(B, N, dim\), got .* \(2, 5\)"),
        (torch.randn(2, 5, 7), ValueError, r"x must have the last dimension dim = 8, got .* \(2, 5, 7\)"),
        (torch.ones(2, 5, 8, dtype=torch.long), TypeError, "x must be a floating-point tensor, got a int64"),
        (torch.randn(2, 0, 8), ValueError, r"N must be at least 1 .* got x \(2, 0, 8\)"),
        (torch.randn(0, 5, 8), ValueError, r"B must be at least 1 .* got x \(0, 5, 8\)"),
        (torch.randn(2, 5, 8, dtype=torch.float64), ValueError, "x must have the layer's dtype torch.float32"),
        ([[0.0] * 8], TypeError, "x must be a torch.Tensor, got a list of length 1"),
    ],
    ids=["2d", "wrong-width", "integer", "no-tokens", "empty-batch", "float64-into-float32", "list"],
)
def test_bad_input_raises(x, error, match):
    m = MoHAttention(8, 4, shared_head=1, routed_head=2)
    with pytest.raises(error, match=match):
        m(x)
    with pytest.raises(error, match=match):
        m.route(x)


# ----------------------------------------------------------------------------------------------------------
# Same numbers as the reference code
# ----------------------------------------------------------------------------------------------------------

OPTIONS = {
    "plain": dict(),
    "bias-qknorm": dict(qkv_bias=True, qk_norm=True),
    "head-dim": dict(head_dim=5),
    "indivisible-dim": dict(dim=14),  # head_dim = 14 // H, so H * head_dim != dim; the reference allows it
}


# Every configuration the reference supports with H <= 4 in the plain setting; the options on H = 4 only.
REFERENCE_CASES = [
    pytest.param(c, o, id=f"{cid(c)}-{name}")
    for name, o in OPTIONS.items()
    for c in REFERENCE_SUPPORTED
    if c[0] == 4 or (name == "plain" and c[0] < 4)
]


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "manual"])
@pytest.mark.parametrize("mode", ["eval", "train"])
@pytest.mark.parametrize("counts,options", REFERENCE_CASES)
def test_matches_reference_code_outputs_gradients_and_loss(counts, options, mode, fused):
    ref, ours = twin(*counts, fused=fused, **options)
    ours.fused_attn = fused
    ref.train(mode == "train")
    ours.train(mode == "train")
    x = torch.randn(2, 7, ours.dim)
    expected, got = ref(x), ours(x)
    assert got.dtype == x.dtype
    torch.testing.assert_close(got, expected, **tol(torch.float32))
    upstream = torch.randn_like(got)
    for p in ref.parameters():
        p.grad = None
    (expected * upstream).sum().backward()
    (got * upstream).sum().backward()
    params = dict(ours.named_parameters())
    for name, p in ref.named_parameters():
        torch.testing.assert_close(params[name].grad, p.grad, **tol(torch.float32), msg=lambda m, n=name: f"{n}: {m}")
    if mode == "train" and counts[2] > 0:
        assert len(ref.losses) == 1
        torch.testing.assert_close(ours.load_balancing_loss, ref.losses[0], **tol(torch.float32))
    else:
        assert ref.losses == [] and ours.load_balancing_loss is None


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "manual"])
def test_same_dropout_as_reference_code_for_the_same_seed(fused):
    """Training with dropout: the router draws no random numbers, so both draw the same dropout masks."""
    ref, ours = twin(6, 2, 3, fused=fused, attn_drop=0.2, proj_drop=0.1)
    ours.fused_attn = fused
    x = torch.randn(2, 9, 12)
    torch.manual_seed(5)
    expected = ref(x)
    torch.manual_seed(5)
    got = ours(x)
    torch.testing.assert_close(got, expected, **tol(torch.float32))
    assert not torch.equal(got, ours.eval()(x)), "dropout was active"


def test_state_dict_keys_and_shapes_match_the_reference_code_for_every_valid_configuration():
    for H, s, k in VALID:
        ref = ReferenceCodeMoH(12, H, shared_head=s, routed_head=k, head_dim=3, qk_norm=True, qkv_bias=True)
        ours = MoHAttention(12, H, shared_head=s, routed_head=k, head_dim=3, qk_norm=True, qkv_bias=True)
        assert {n: p.shape for n, p in ours.state_dict().items()} == {
            n: p.shape for n, p in ref.state_dict().items()
        }, (H, s, k)


def test_timm_attention_weights_load_and_give_plain_attention():
    """A timm ``Attention`` state dict (qkv, q_norm, k_norm, proj) loads; with wg_1 = 0 it is that layer."""
    dim, H = 16, 4
    timm_like = {
        "qkv.weight": torch.randn(3 * dim, dim),
        "qkv.bias": torch.randn(3 * dim),
        "q_norm.weight": torch.rand(dim // H) + 0.5,
        "q_norm.bias": torch.randn(dim // H),
        "k_norm.weight": torch.rand(dim // H) + 0.5,
        "k_norm.bias": torch.randn(dim // H),
        "proj.weight": torch.randn(dim, dim),
        "proj.bias": torch.randn(dim),
    }
    m = MoHAttention(dim, H, qkv_bias=True, qk_norm=True, shared_head=H).eval()
    result = m.load_state_dict(timm_like, strict=False)
    assert result.unexpected_keys == [] and result.missing_keys == ["wg_1.weight"]
    nn.init.zeros_(m.wg_1.weight)
    x = torch.randn(2, 6, dim)
    q, k, v = (
        F.linear(x, timm_like["qkv.weight"], timm_like["qkv.bias"]).view(2, 6, 3, H, dim // H).permute(2, 0, 3, 1, 4)
    )
    q = F.layer_norm(q, (dim // H,), timm_like["q_norm.weight"], timm_like["q_norm.bias"])
    k = F.layer_norm(k, (dim // H,), timm_like["k_norm.weight"], timm_like["k_norm.bias"])
    heads = attnbook.softmax_attention(q, k, v).transpose(1, 2).reshape(2, 6, dim)
    expected = F.linear(heads, timm_like["proj.weight"], timm_like["proj.bias"])
    torch.testing.assert_close(m(x), expected, **tol(torch.float32))


# ----------------------------------------------------------------------------------------------------------
# The literal float64 definition (attnbook.reference.moh_attention)
# ----------------------------------------------------------------------------------------------------------


def literal(m: MoHAttention, x, params: dict):
    """reference.moh_attention with the parameters of ``m`` replaced by ``params``."""

    def norm(which):
        if f"{which}.weight" not in params:
            return None
        return lambda t: F.layer_norm(t, (m.head_dim,), params[f"{which}.weight"], params[f"{which}.bias"])

    return reference.moh_attention(
        x,
        num_heads=m.num_heads,
        shared_head=m.shared_head,
        routed_head=m.routed_head,
        qkv_weight=params["qkv.weight"],
        qkv_bias=params.get("qkv.bias"),
        proj_weight=params["proj.weight"],
        proj_bias=params.get("proj.bias"),
        wg=params.get("wg.weight"),
        wg_0=params.get("wg_0.weight"),
        wg_1=params.get("wg_1.weight"),
        q_norm=norm("q_norm"),
        k_norm=norm("k_norm"),
    )


def flat_out_gates_loss(out, gates, loss):
    return torch.cat([out.flatten(), gates.flatten(), loss.reshape(1)])


LITERAL_CASES = [(4, 2, 2), (4, 0, 3), (4, 1, 2), (4, 1, 3), (4, 4, 0), (1, 1, 0), (5, 3, 1), (3, 0, 3)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("qk_norm", [False, True], ids=["no-norm", "qk-norm"])
@pytest.mark.parametrize("counts", LITERAL_CASES, ids=cid)
def test_matches_literal_definition_outputs_gates_loss_and_all_gradients(counts, qk_norm, dtype, device):
    """Output, gates and loss (concatenated), and their gradients w.r.t. x and EVERY parameter."""
    H, s, k = counts
    torch.manual_seed(1)
    m = MoHAttention(12, H, qkv_bias=True, qk_norm=qk_norm, shared_head=s, routed_head=k, head_dim=3)
    names = [n for n, _ in m.named_parameters()]
    inputs = [torch.randn(2, 7, 12)] + [p.detach() + 0.1 * torch.randn_like(p) for p in m.parameters()]
    inputs = [t.to(device) for t in inputs]
    m.to(device)

    def fast(x, *ps):
        m.to(x.dtype)
        out, r = functional_call(m, dict(zip(names, ps, strict=True)), (x,), {"return_routing": True})
        return flat_out_gates_loss(out, r.gates.to(x.dtype), r.loss.to(x.dtype))

    def slow(x, *ps):
        return flat_out_gates_loss(*literal(m, x, dict(zip(names, ps, strict=True))))

    assert_matches_reference(fast, slow, inputs, dtype=dtype)


@pytest.mark.parametrize("counts", [(4, 2, 2), (3, 1, 1), (3, 0, 2), (3, 3, 0)], ids=cid)
def test_gradcheck_with_well_separated_router_logits(counts):
    """torch.autograd.gradcheck in float64; the router's top-k choice must not flip under the probe."""
    H, s, k = counts
    torch.manual_seed(0)
    m = MoHAttention(6, H, qkv_bias=True, qk_norm=True, shared_head=s, routed_head=k, head_dim=2).double()
    x = torch.randn(1, 3, 6, dtype=torch.float64)
    if k:
        with torch.no_grad():  # spread the routed logits: rows of wg far apart along x's directions
            m.wg.weight.mul_(4.0)
        top2 = m.route(x).routed_probs.sort(dim=-1, descending=True).values
        gap = (top2[..., k - 1] - top2[..., k]).min() if k < H - s else torch.tensor(1.0)
        assert gap > 1e-3, f"router logits not well separated (gap {gap}): the test would be meaningless"
    # x and the router weights; the gradients of the other parameters are checked against the literal
    # reference above (gradcheck on every weight of the layer would take about a minute here).
    names = [n for n, _ in m.named_parameters() if n.startswith("wg") or n == "q_norm.weight"]
    params = [m.get_parameter(n).detach().clone().requires_grad_() for n in names]

    def f(x, *ps):
        out, r = functional_call(m, dict(zip(names, ps, strict=True)), (x,), {"return_routing": True})
        return flat_out_gates_loss(out, r.gates, r.loss)

    assert torch.autograd.gradcheck(f, (x.requires_grad_(),) + tuple(params), eps=1e-6, atol=1e-6)


# ----------------------------------------------------------------------------------------------------------
# Special cases and gate properties
# ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("H", [1, 2, 4])
def test_all_shared_with_zero_router_is_plain_multi_head_attention(H):
    dim = 16
    m = MoHAttention(dim, H, qkv_bias=True, shared_head=H, routed_head=0).eval()
    if H > 1:
        nn.init.zeros_(m.wg_1.weight)
    x = torch.randn(2, 9, dim)
    D = dim // H
    q, k, v = m.qkv(x).view(2, 9, 3, H, D).permute(2, 0, 3, 1, 4)  # 3 x (B, H, N, D)
    heads = attnbook.softmax_attention(q, k, v).transpose(1, 2).reshape(2, 9, dim)
    expected = m.proj(heads)
    out, r = m(x, return_routing=True)
    torch.testing.assert_close(out, expected, **tol(torch.float32))
    torch.testing.assert_close(r.gates, torch.ones(2, 9, H))
    # ... and the same as the module family's SoftmaxAttention holding the same weights.
    sa = attnbook.SoftmaxAttention(dim, dim, dim, H).eval()
    wq, wk, wv = m.qkv.weight.chunk(3)
    bq, bk, bv = m.qkv.bias.chunk(3)
    with torch.no_grad():
        for lin, w, b in (
            (sa.query_projection, wq, bq),
            (sa.key_projection, wk, bk),
            (sa.value_projection, wv, bv),
            (sa.out_projection, m.proj.weight, m.proj.bias),
        ):
            lin.weight.copy_(w)
            lin.bias.copy_(b)
    torch.testing.assert_close(out, sa(x, x, x), **tol(torch.float32))


def test_all_shared_with_trained_router_is_not_plain_attention():
    """The special case above is a real check: a non-zero wg_1 changes the output."""
    m = MoHAttention(16, 4, shared_head=4).eval()
    x = torch.randn(1, 5, 16)
    gated = m(x)
    nn.init.zeros_(m.wg_1.weight)
    assert not torch.allclose(gated, m(x), **tol(torch.float32))


@pytest.mark.parametrize("counts", [(4, 2, 2), (6, 0, 3), (5, 1, 2), (4, 4, 0), (6, 2, 4)], ids=cid)
def test_zero_router_gives_unit_gates_on_active_heads_and_loss_k(counts):
    H, s, k = counts
    m = MoHAttention(8, H, shared_head=s, routed_head=k, head_dim=2)
    for name, p in m.named_parameters():
        if name.startswith("wg"):
            nn.init.zeros_(p)
    r = m.route(torch.randn(3, 4, 8))
    torch.testing.assert_close(r.gates, r.selected.float())
    torch.testing.assert_close(r.loss, torch.tensor(float(k)))  # E * sum_i f_i / E = sum_i f_i = k


@settings(max_examples=40, deadline=None)
@given(
    H=st.integers(1, 8),
    data=st.data(),
    N=st.integers(1, 9),
    seed=st.integers(0, 2**16),
    temperature=st.sampled_from([0.1, 1.0, 10.0]),
)
def test_gate_sums_follow_the_paper(H, data, N, seed, temperature):
    """Per token: shared gates sum to a_1 h_s, routed gates to a_2 k, a_1 + a_2 = 2; mean active gate 1 when
    h_s = k or only one kind exists; load sums to k; importance sums to 1."""
    s = data.draw(st.integers(0, H), label="shared_head")
    k = data.draw(st.integers(1 if s < H else 0, H - s) if s < H else st.just(0), label="routed_head")
    torch.manual_seed(seed)
    m = MoHAttention(8, H, shared_head=s, routed_head=k, head_dim=2).double()
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.startswith("wg"):
                p.mul_(temperature)
    r = m.route(torch.randn(2, N, 8, dtype=torch.float64))
    sums = dict(rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(r.gates[..., :s].sum(-1), r.shared_weight * s, **sums)
    torch.testing.assert_close(r.gates[..., s:].sum(-1), r.routed_weight * k, **sums)
    if s and k:
        torch.testing.assert_close(r.shared_weight + r.routed_weight, torch.full_like(r.shared_weight, 2.0), **sums)
    if s == k or s == 0 or k == 0:
        mean_active = r.gates.sum(-1) / (s + k)
        torch.testing.assert_close(mean_active, torch.ones_like(mean_active), **sums)
    if k:
        torch.testing.assert_close(r.load.sum(), torch.tensor(float(k), dtype=torch.float64), **sums)
        torch.testing.assert_close(r.importance.sum(), torch.tensor(1.0, dtype=torch.float64), **sums)
        torch.testing.assert_close(r.routed_probs.sum(-1), torch.ones(2, N, dtype=torch.float64), **sums)


# ----------------------------------------------------------------------------------------------------------
# The loss: no global state, the helper
# ----------------------------------------------------------------------------------------------------------


def test_no_global_state_two_models_keep_their_own_losses():
    a = MoHAttention(8, 4, shared_head=2, routed_head=2)
    b = MoHAttention(8, 4, shared_head=0, routed_head=2)
    assert not any(isinstance(v, list) for v in vars(MoHAttention).values()), "no class-level list"
    assert a.load_balancing_loss is None and b.load_balancing_loss is None
    _, ra = a(torch.randn(2, 5, 8), return_routing=True)
    assert a.load_balancing_loss is ra.loss and b.load_balancing_loss is None
    _, rb = b(torch.randn(2, 5, 8), return_routing=True)
    assert a.load_balancing_loss is ra.loss and b.load_balancing_loss is rb.loss
    _, ra2 = a(torch.randn(2, 5, 8), return_routing=True)
    assert a.load_balancing_loss is ra2.loss, "a second forward replaces the loss; nothing accumulates"


def test_eval_forward_clears_the_loss_but_routing_still_reports_it():
    m = MoHAttention(8, 4, shared_head=1, routed_head=2)
    x = torch.randn(2, 5, 8)
    m(x)
    assert m.load_balancing_loss is not None and m.load_balancing_loss.requires_grad
    m.eval()
    _, r = m(x, return_routing=True)
    assert m.load_balancing_loss is None
    torch.testing.assert_close(r.loss, m.train()(x, return_routing=True)[1].loss)


class Block(nn.Module):
    def __init__(self, dim, **kw):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.attn = MoHAttention(dim, 4, **kw)

    def forward(self, x):
        return x + self.attn(self.norm(x))


def test_helper_gathers_losses_from_nested_models_mean_and_sum():
    model = nn.Sequential(
        Block(8, shared_head=2, routed_head=2),
        nn.Sequential(Block(8, shared_head=0, routed_head=1), Block(8, shared_head=4)),
    )
    model(torch.randn(2, 6, 8)).sum()
    layers = [m for m in model.modules() if isinstance(m, MoHAttention) and m.routed_head]
    assert len(layers) == 2
    total = layers[0].load_balancing_loss + layers[1].load_balancing_loss
    torch.testing.assert_close(moh_load_balancing_loss(model, reduction="sum"), total)
    torch.testing.assert_close(moh_load_balancing_loss(model), total / 2)
    moh_load_balancing_loss(model).backward()
    for m in layers:
        assert m.wg.weight.grad is not None and m.wg.weight.grad.abs().sum() > 0


def test_helper_errors_and_zero():
    with pytest.raises(ValueError, match="model must contain a MoHAttention layer, got a Linear without one"):
        moh_load_balancing_loss(nn.Linear(2, 2))
    for not_a_model in (None, "model", [Block(8, shared_head=4)]):
        with pytest.raises(TypeError, match="model must be an nn.Module, got"):
            moh_load_balancing_loss(not_a_model)
    model = nn.Sequential(Block(8, shared_head=2, routed_head=2))
    with pytest.raises(ValueError, match=r"layer '0.attn' must have run a forward in training mode"):
        moh_load_balancing_loss(model)
    model.eval()(torch.randn(1, 3, 8))
    with pytest.raises(ValueError, match="training mode"):
        moh_load_balancing_loss(model)
    with pytest.raises(ValueError, match="reduction must be one of 'mean', 'sum', got 'max'"):
        moh_load_balancing_loss(model, reduction="max")
    only_shared = nn.Sequential(Block(8, shared_head=4))
    only_shared(torch.randn(1, 3, 8))
    assert moh_load_balancing_loss(only_shared) == 0


def test_training_the_router_on_the_loss_evens_out_the_load():
    """The loss does what it is for: a few steps on it alone move the load towards k / E per head."""
    torch.manual_seed(0)
    m = MoHAttention(16, 6, shared_head=2, routed_head=2)
    with torch.no_grad():
        m.wg.weight[0] += 0.3  # a router biased towards the first two routed heads: they get every token
        m.wg.weight[1] += 0.3
    x = torch.randn(4, 32, 16) + 1.0
    opt = torch.optim.SGD([m.wg.weight], lr=0.5)
    before = m.route(x)
    assert before.load.tolist() == [1.0, 1.0, 0.0, 0.0]
    for _ in range(50):
        opt.zero_grad()
        m(x)
        moh_load_balancing_loss(m).backward()
        opt.step()
    after = m.route(x)
    target = torch.full((4,), 2 / 4)
    assert (after.load - target).abs().max() < 0.5 * (before.load - target).abs().max()
    assert after.loss < before.loss - 1.0


# ----------------------------------------------------------------------------------------------------------
# Precision and devices
# ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bfloat16", "float16"])
def test_half_precision_router_in_float32_output_in_input_dtype(dtype, device):
    m = MoHAttention(16, 4, shared_head=1, routed_head=2).to(device).eval()
    x = torch.randn(2, 7, 16, device=device)
    expected = m(x)
    m16 = m.to(dtype)
    out, r = m16(x.to(dtype), return_routing=True)
    assert out.dtype == dtype and r.gates.dtype == r.routed_probs.dtype == r.loss.dtype == torch.float32
    torch.testing.assert_close(out.float(), expected, **tol(dtype))


def test_router_ignores_autocast():
    m = MoHAttention(16, 4, shared_head=2, routed_head=2).eval()
    x = torch.randn(2, 7, 16)
    plain = m.route(x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, r = m(x, return_routing=True)
    assert out.dtype == torch.bfloat16, "attention itself does follow autocast"
    assert r.gates.dtype == torch.float32
    torch.testing.assert_close(r.gates, plain.gates, rtol=0, atol=0)


@pytest.mark.parametrize("device", DEVICES)
def test_runs_on_device_without_host_sync_surprises(device):
    m = MoHAttention(16, 4, shared_head=1, routed_head=2).to(device)
    out, r = m(torch.randn(2, 5, 16, device=device), return_routing=True)
    assert out.device.type == r.gates.device.type == r.loss.device.type == torch.device(device).type
    moh_load_balancing_loss(m).backward()


def test_deepcopy_and_pickle_work_after_a_training_forward():
    """EMA copies (copy.deepcopy) and torch.save must not trip over the graph-attached loss."""
    import copy
    import io

    layer = attnbook.MoHAttention(32, num_heads=4, shared_head=1, routed_head=2).train()
    layer(torch.randn(2, 5, 32))
    assert layer.load_balancing_loss is not None
    clone = copy.deepcopy(layer)
    assert clone.load_balancing_loss is None and layer.load_balancing_loss is not None
    x = torch.randn(1, 3, 32)
    torch.testing.assert_close(clone.eval()(x), layer.eval()(x))
    torch.save(layer, io.BytesIO())


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "explicit"])
def test_float16_layer_at_large_magnitudes_is_finite_where_float64_is_representable(fused):
    """x ~ 1e4: a gate times a head exceeds 65504 although the projected output does not; before, inf."""
    torch.manual_seed(0)
    layer = MoHAttention(64, 4, shared_head=1, routed_head=2).double().eval()
    layer.fused_attn = fused
    x = torch.randn(2, 16, 64, dtype=torch.float64) * 1e4
    expected = layer(x)
    assert expected.abs().max() < 65504
    out = layer.half()(x.half())
    assert out.dtype == torch.float16 and torch.isfinite(out).all()
    scale = expected.abs().max()
    torch.testing.assert_close(out.double() / scale, expected / scale, **tol(torch.float16))


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "explicit"])
def test_a_nan_token_is_never_turned_into_zeros(fused):
    """The explicit path's softmax of a NaN row is NaN; the reference's nan_to_num would hide it as zeros."""
    layer = MoHAttention(8, 4, shared_head=1, routed_head=2).eval()
    layer.fused_attn = fused
    x = torch.randn(2, 5, 8)
    x[1, 3, 0] = float("nan")
    mask = torch.ones(5, 5, dtype=torch.bool).tril()  # a mask takes the masked path on both
    out = layer(x, attn_mask=mask)
    assert out[1, 3:].isnan().all(), "token 3 and the tokens that attend to it are NaN"
    assert torch.isfinite(out[0]).all()


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "explicit"])
def test_every_broadcastable_mask_shape_works_on_both_paths(fused):
    layer = MoHAttention(8, 4, shared_head=1, routed_head=2).double().eval()
    layer.fused_attn = fused
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    keys = torch.tensor([True, True, False, True, False])
    expected = reference.moh_layer(layer, x, attn_mask=keys.expand(2, 4, 5, 5))[0]
    for mask in (keys, keys[None], keys.expand(5, 5), keys.expand(2, 1, 5, 5)):
        torch.testing.assert_close(layer(x, attn_mask=mask), expected, **tol(torch.float64))


def test_reentrant_checkpointing_warns_that_the_load_balancing_loss_has_no_gradient():
    """torch.utils.checkpoint(use_reentrant=True) runs its first forward without autograd, so the loss a layer
    keeps has no graph; gathering it says so (0.2.0 said nothing, and the router learned nothing). With
    use_reentrant=False the loss has its gradient."""
    from torch.utils.checkpoint import checkpoint

    torch.manual_seed(0)
    model = torch.nn.Sequential(attnbook.MoHAttention(16, num_heads=4, shared_head=1, routed_head=2)).train()
    x = torch.randn(2, 5, 16, requires_grad=True)
    checkpoint(model, x, use_reentrant=True).sum()
    with pytest.warns(UserWarning, match="computed without autograd .* use_reentrant=False"):
        attnbook.moh_load_balancing_loss(model)
    checkpoint(model, x, use_reentrant=False).sum()
    loss = attnbook.moh_load_balancing_loss(model)
    (grad,) = torch.autograd.grad(loss, model[0].wg.weight)
    assert grad.abs().sum() > 0


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_float16_inputs_of_magnitude_1e4_give_finite_gradients(seed):
    """0.2.0's float16 output projection took its gradient through the rows' scale (up to 2^16): a finite forward,
    an entirely non-finite gradient. The float64 output fits float16 here, and so must both results."""
    torch.manual_seed(seed)
    layer = attnbook.MoHAttention(16, num_heads=2)
    x = torch.randn(2, 8, 16) * 1e4
    assert layer.double()(x.double()).abs().max() < 65504  # the case is one float16 can hold
    x16 = x.half().requires_grad_()
    y = layer.half()(x16)
    y.sum().backward()
    assert torch.isfinite(y).all() and torch.isfinite(x16.grad).all()
