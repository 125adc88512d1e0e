"""The registry: every entry is complete, its function matches its float64 oracle, its layer drops in."""

import pytest
import torch
from support import BAD_QKV_SHAPES, assert_matches_reference

from attnbook import mechanisms
from attnbook.mechanisms import MECHANISMS

QKV = mechanisms.names(inputs="qkv")
CAUSAL_FORMS = [(n, c) for n, m in MECHANISMS.items() for c in ((False, True) if m.causal else (False,))]


def test_registry_names_are_keys_and_chapters_are_in_order():
    assert list(MECHANISMS) == [m.name for m in MECHANISMS.values()]
    chapters = [m.chapter for m in MECHANISMS.values()]
    assert chapters == sorted(chapters)
    assert {m.inputs for m in MECHANISMS.values()} <= {"qkv", "x"}


def test_get_names_the_known_mechanisms_when_asked_for_an_unknown_one():
    with pytest.raises(ValueError, match=r"name must be one of 'softmax', 'linear', .*got 'sofmax'"):
        mechanisms.get("sofmax")


@pytest.mark.parametrize("name", QKV)
@pytest.mark.parametrize("case", list(BAD_QKV_SHAPES), ids=str)
def test_every_qkv_function_rejects_bad_shapes_naming_them(name, case):
    shapes, message = BAD_QKV_SHAPES[case]
    q, k, v = (torch.randn(*s) for s in shapes)
    with pytest.raises(ValueError, match=message):
        MECHANISMS[name](q, k, v)


@pytest.mark.parametrize("name,causal", [c for c in CAUSAL_FORMS if c[0] in QKV], ids=str)
def test_every_qkv_function_matches_its_reference_outputs_and_gradients(name, causal):
    m = MECHANISMS[name]
    N = 9
    M = N if (causal or m.same_length) else 11
    inputs = [torch.randn(2, 3, n, 4) for n in (N, M, M)]
    kwargs = {"causal": True} if causal else {}
    assert_matches_reference(
        lambda q, k, v: m.function(q, k, v, **kwargs),
        lambda q, k, v: m.reference(q, k, v, **kwargs),
        inputs,
        dtype=torch.float64,
    )


@pytest.mark.parametrize("name,causal", CAUSAL_FORMS, ids=str)
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
