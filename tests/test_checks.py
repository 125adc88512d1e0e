"""Every public entry point rejects bad arguments with one wording, from the one validation module.

Each case is an argument class found by trying bad values for every argument of every entry point: string
booleans, bools and floats as counts, tensors and None as numbers, numbers that would give NaN, recurrent
states of the wrong kind, shape, dtype or count, non-tensors, non-modules, bad generators and seeds. The
error must be a TypeError (wrong type) or ValueError (wrong value), worded
``<where>: <argument> must be <expected>, got <received>``, and raised by ``attnbook/_checks.py`` itself:
before any torch internals run.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from support import qkv
from torch import nn

import attnbook
from attnbook import _checks, mechanisms, reference, testing
from attnbook.feature_maps import PerformerFeatures, elu_feature_map, relu_feature_map, resolve_feature_map
from attnbook.lab import bench, profiling

NAN, INF = float("nan"), float("inf")


def _qkv():
    return qkv(2, 3, 5, 5, 4, 6)


def _step_inputs():
    return torch.randn(2, 3, 4), torch.randn(2, 3, 4), torch.randn(2, 3, 5)


def _linear_state():
    return attnbook.linear_attention_step(*_step_inputs())[1]


def _flow_state():
    return attnbook.flow_attention_step(*_step_inputs())[1]


def _linear_step(state):
    return lambda: attnbook.linear_attention_step(*_step_inputs(), state)


def _flow_step(state):
    return lambda: attnbook.flow_attention_step(*_step_inputs(), state)


FUNCTIONS = {
    "softmax_attention": attnbook.softmax_attention,
    "linear_attention": attnbook.linear_attention,
    "flow_attention": attnbook.flow_attention,
    "mobile_attention": attnbook.mobile_attention,
}
FAMILY = {
    "SoftmaxAttention": attnbook.SoftmaxAttention,
    "LinearAttention": attnbook.LinearAttention,
    "FlowAttention": attnbook.FlowAttention,
    "MobileAttention": attnbook.MobileAttention,
}
BAD_BOOLS = {"string_False": "False", "int_1": 1, "None": None, "tensor": torch.tensor(True)}
BAD_COUNTS = {"bool": True, "float": 2.0, "string": "2", "tensor": torch.tensor(2), "zero": 0, "negative": -1}
BAD_PROBABILITIES = {"None": None, "string": "0.1", "tensor": torch.tensor(0.1), "one": 1.0, "nan": NAN}
BAD_EPS = {"inf": INF, "nan": NAN, "negative": -1e-6, "beyond_float32": 1e39, "string": "1e-6", "None": None}

CASES: dict[str, tuple] = {}  # id -> (call, error, message regex)


def case(id_: str, call, error, message: str) -> None:
    assert id_ not in CASES, id_
    CASES[id_] = (call, error, message)


def _error(value) -> type:
    """The class a bad value belongs to: a wrong type or a wrong value."""
    if isinstance(value, bool) or value is None or isinstance(value, (str, torch.Tensor)):
        return TypeError
    return ValueError


# Booleans: a string "False" must not be taken as True, nor 1 as a flag.
for fn_name, fn in FUNCTIONS.items():
    flags = ["is_causal"]
    flags += ["return_flows"] if fn_name in ("flow_attention", "mobile_attention") else []
    for flag in flags:
        for bad_id, bad in BAD_BOOLS.items():
            case(
                f"{fn_name}-{flag}-{bad_id}",
                lambda fn=fn, flag=flag, bad=bad: fn(*_qkv(), **{flag: bad}),
                TypeError,
                rf"{fn_name}: {flag} must be True or False",
            )
for cls_name, cls in FAMILY.items():
    if cls_name != "MobileAttention":
        for bad_id, bad in BAD_BOOLS.items():
            case(
                f"{cls_name}-causal-{bad_id}",
                lambda cls=cls, bad=bad: cls(8, 8, 8, 2, causal=bad),
                TypeError,
                rf"{cls_name}: causal must be True or False",
            )
for flag in ("qkv_bias", "qk_norm", "causal"):
    case(
        f"MoHAttention-{flag}-string",
        lambda flag=flag: attnbook.MoHAttention(8, 4, shared_head=4, **{flag: "False"}),
        TypeError,
        rf"MoHAttention: {flag} must be True or False, got 'False'",
    )
for flag in ("is_causal", "return_routing"):
    case(
        f"MoHAttention.forward-{flag}-int",
        lambda flag=flag: attnbook.MoHAttention(8, 4, shared_head=4)(torch.randn(1, 3, 8), **{flag: 1}),
        TypeError,
        rf"MoHAttention: {flag} must be True or False, got 1",
    )
case("PerformerFeatures-orthogonal-string", lambda: PerformerFeatures(4, 4, orthogonal="yes"), TypeError, "orthogonal")
case("mechanisms.names-causal-string", lambda: mechanisms.names(causal="True"), TypeError, "names: causal must be")
case("mechanisms.names-inputs", lambda: mechanisms.names(inputs="tokens"), ValueError, "inputs must be one of")
for name in mechanisms.MECHANISMS:
    case(
        f"MECHANISMS[{name}].module-causal-string",
        lambda name=name: mechanisms.MECHANISMS[name].module(8, 2, causal="False"),
        TypeError,
        "MoHAttention: causal must be" if name == "moh" else rf"MECHANISMS\['{name}'\].module: causal must be",
    )

# Counts: True is not 1 head, 2.0 is not 2, and sizes start at 1.
for cls_name, cls in FAMILY.items():
    for arg in ("d_input", "d_model", "d_output", "n_heads"):
        for bad_id, bad in BAD_COUNTS.items():
            args = dict(d_input=8, d_model=8, d_output=8, n_heads=2) | {arg: bad}
            case(
                f"{cls_name}-{arg}-{bad_id}",
                lambda cls=cls, args=args: cls(**args),
                TypeError if not isinstance(bad, int) or isinstance(bad, bool) else ValueError,
                rf"{cls_name}: {arg} must be an int",
            )
for arg in ("dim", "num_heads", "head_dim"):
    for bad_id, bad in BAD_COUNTS.items():
        case(
            f"MoHAttention-{arg}-{bad_id}",
            lambda arg=arg, bad=bad: attnbook.MoHAttention(**(dict(dim=8, num_heads=4, shared_head=4) | {arg: bad})),
            TypeError if not isinstance(bad, int) or isinstance(bad, bool) else ValueError,
            rf"MoHAttention: {arg} must be an int",
        )
for fn_name in ("linear_attention", "flow_attention"):
    for bad_id, bad in BAD_COUNTS.items():
        case(
            f"{fn_name}-chunk_size-{bad_id}",
            lambda fn=FUNCTIONS[fn_name], bad=bad: fn(*_qkv(), is_causal=True, chunk_size=bad),
            TypeError if not isinstance(bad, int) or isinstance(bad, bool) else ValueError,
            rf"{fn_name}: chunk_size must be an int",
        )
case("LinearAttention-chunk_size-string", lambda: attnbook.LinearAttention(8, 8, 8, 2, chunk_size="64"), TypeError, "")
for arg in ("num_features", "dim"):
    for bad_id, bad in BAD_COUNTS.items():
        case(
            f"PerformerFeatures-{arg}-{bad_id}",
            lambda arg=arg, bad=bad: PerformerFeatures(**(dict(num_features=4, dim=4) | {arg: bad})),
            TypeError if not isinstance(bad, int) or isinstance(bad, bool) else ValueError,
            rf"PerformerFeatures: {arg} must be an int",
        )

# Probabilities.
for cls_name, cls in FAMILY.items():
    for bad_id, bad in BAD_PROBABILITIES.items():
        case(
            f"{cls_name}-drop_out-{bad_id}",
            lambda cls=cls, bad=bad: cls(8, 8, 8, 2, drop_out=bad),
            _error(bad),
            rf"{cls_name}: drop_out must be a (finite )?number",
        )
for arg in ("attn_drop", "proj_drop"):
    for bad_id, bad in BAD_PROBABILITIES.items():
        case(
            f"MoHAttention-{arg}-{bad_id}",
            lambda arg=arg, bad=bad: attnbook.MoHAttention(8, 4, shared_head=4, **{arg: bad}),
            _error(bad),
            rf"MoHAttention: {arg} must be a (finite )?number",
        )

# Numbers that would give NaN or zeros.
for fn_name in ("linear_attention", "flow_attention", "mobile_attention"):
    for bad_id, bad in BAD_EPS.items():
        case(f"{fn_name}-eps-{bad_id}", lambda fn=FUNCTIONS[fn_name], bad=bad: fn(*_qkv(), eps=bad), _error(bad), "eps")
for cls_name in ("LinearAttention", "FlowAttention", "MobileAttention"):
    for bad_id, bad in BAD_EPS.items():
        case(
            f"{cls_name}-eps-{bad_id}",
            lambda cls=FAMILY[cls_name], bad=bad: cls(8, 8, 8, 2, eps=bad),
            _error(bad),
            "eps",
        )
for step_name, step in (
    ("linear_attention_step", attnbook.linear_attention_step),
    ("flow_attention_step", attnbook.flow_attention_step),
):
    case(f"{step_name}-eps-inf", lambda step=step: step(*_step_inputs(), eps=INF), ValueError, "eps must be")

# out_dtype
for fn_name in ("linear_attention", "flow_attention", "mobile_attention"):
    case(
        f"{fn_name}-out_dtype-string",
        lambda fn=FUNCTIONS[fn_name]: fn(*_qkv(), out_dtype="float32"),
        TypeError,
        "out_dtype must be a torch.dtype",
    )
    case(
        f"{fn_name}-out_dtype-int",
        lambda fn=FUNCTIONS[fn_name]: fn(*_qkv(), out_dtype=torch.int64),
        ValueError,
        "out_dtype must be a floating-point dtype",
    )

# Recurrent states: a plain tuple, fields of the wrong shape, dtype or kind, a negative count.
case("linear_attention_step-state-tuple", lambda: _linear_step(tuple(_linear_state()))(), TypeError, "LinearState")
case("linear_attention_step-state-list", lambda: _linear_step(list(_linear_state()))(), TypeError, "LinearState")
case("linear_attention_step-state-FlowState", lambda: _linear_step(_flow_state())(), TypeError, "LinearState")
case("flow_attention_step-state-tuple", lambda: _flow_step(tuple(_flow_state()))(), TypeError, "FlowState")
case("flow_attention_step-state-LinearState", lambda: _flow_step(_linear_state())(), TypeError, "FlowState")
for field in ("S", "z"):
    case(
        f"linear_attention_step-state.{field}-shape",
        lambda field=field: _linear_step(_linear_state()._replace(**{field: torch.zeros(2, 3, 1)}))(),
        ValueError,
        rf"state.{field} must have shape",
    )
    case(
        f"linear_attention_step-state.{field}-float64",
        lambda field=field: _linear_step(
            _linear_state()._replace(**{field: getattr(_linear_state(), field).double()})
        )(),
        ValueError,
        rf"state.{field} must be in the accumulation dtype torch.float32",
    )
    case(
        f"linear_attention_step-state.{field}-None",
        lambda field=field: _linear_step(_linear_state()._replace(**{field: None}))(),
        TypeError,
        rf"state.{field} must be a torch.Tensor",
    )
for field in ("key_sum", "query_sum", "key_over_outgoing", "query_over_incoming", "exp_mean", "kv"):
    case(
        f"flow_attention_step-state.{field}-shape",
        lambda field=field: _flow_step(_flow_state()._replace(**{field: torch.zeros(2, 3, 1, 1)}))(),
        ValueError,
        rf"state.{field} must have shape",
    )
    case(
        f"flow_attention_step-state.{field}-float64",
        lambda field=field: _flow_step(_flow_state()._replace(**{field: getattr(_flow_state(), field).double()}))(),
        ValueError,
        rf"state.{field} must be in the accumulation dtype",
    )
    case(
        f"flow_attention_step-state.{field}-int",
        lambda field=field: _flow_step(_flow_state()._replace(**{field: getattr(_flow_state(), field).long()}))(),
        TypeError,
        rf"state.{field} must be a floating-point tensor",
    )
for bad_id, bad, error, message in (
    ("int", 1, TypeError, r"state.t must be a torch.Tensor"),
    ("float-tensor", torch.ones(2), ValueError, r"state.t must be an int64 tensor of token counts of shape \(2,\)"),
    ("wrong-shape", torch.ones(3, dtype=torch.int64), ValueError, r"state.t must be an int64 tensor"),
    ("None", None, TypeError, r"state.t must be a torch.Tensor"),
):
    case(
        f"flow_attention_step-state.t-{bad_id}",
        lambda bad=bad: _flow_step(_flow_state()._replace(t=bad))(),
        error,
        message,
    )

# Non-tensors and tensors of the wrong kind, where the tables of test_mechanisms do not reach.
for fn_name, fn in FUNCTIONS.items():
    for arg in ("q", "k", "v"):
        for bad_id, bad in (("list", [[1.0]]), ("None", None), ("int", torch.ones(2, 3, 5, 4, dtype=torch.long))):
            case(
                f"{fn_name}-{arg}-{bad_id}",
                lambda fn=fn, arg=arg, bad=bad: fn(**(dict(zip("qkv", _qkv(), strict=True)) | {arg: bad})),
                TypeError,
                rf"{fn_name}: {arg} must be a (torch.Tensor|floating-point tensor)",
            )
    q, k, v = _qkv()
    case(
        f"{fn_name}-dtypes", lambda fn=fn, q=q, k=k, v=v: fn(q, k.double(), v), ValueError, "q, k, v must share a dtype"
    )
    case(
        f"{fn_name}-devices",
        lambda fn=fn, q=q, k=k, v=v: fn(q, k.to("meta"), v),
        ValueError,
        "q, k, v must be on one device",
    )
case(
    "softmax_attention-attn_mask-int",
    lambda: attnbook.softmax_attention(*_qkv(), attn_mask=torch.ones(5, 5, dtype=torch.long)),
    TypeError,
    r"attn_mask must be a bool tensor \(True = may attend\) or a floating one \(added to the scores\)",
)
case(
    "softmax_attention-attn_mask-list",
    lambda: attnbook.softmax_attention(*_qkv(), attn_mask=[[True]]),
    TypeError,
    "attn_mask must be a bool or floating-point torch.Tensor",
)
case(
    "softmax_attention-attn_mask-shape",
    lambda: attnbook.softmax_attention(*_qkv(), attn_mask=torch.ones(4, 5)),
    ValueError,
    r"attn_mask must broadcast to \(B, H, N, M\) = \(2, 3, 5, 5\), got a float32 tensor of shape \(4, 5\)",
)
case(
    "softmax_attention-key_padding_mask-int",
    lambda: attnbook.softmax_attention(*_qkv(), key_padding_mask=torch.ones(2, 5, dtype=torch.long)),
    TypeError,
    r"key_padding_mask must be a bool tensor \(True = padding\) or a floating one",
)
for fn_name in ("linear_attention", "flow_attention", "mobile_attention"):
    case(
        f"{fn_name}-attn_mask",
        lambda fn=FUNCTIONS[fn_name]: fn(*_qkv(), attn_mask=torch.ones(5, 5, dtype=torch.bool)),
        ValueError,
        rf"{fn_name}: attn_mask must be None \(.* never forms the N x M weights.*key_padding_mask",
    )
    case(
        f"{fn_name}-key_padding_mask-float",
        lambda fn=FUNCTIONS[fn_name]: fn(*_qkv(), key_padding_mask=torch.zeros(2, 5)),
        TypeError,
        r"key_padding_mask must be a bool tensor \(True = padding, as in nn.MultiheadAttention\) \(this mechanism "
        r"has no scores to add a float mask to\)",
    )
for fn_name in ("linear_attention", "flow_attention"):
    case(
        f"{fn_name}-output_final_state-non-causal",
        lambda fn=FUNCTIONS[fn_name]: fn(*_qkv(), output_final_state=True),
        ValueError,
        rf"{fn_name}: a call with a state \(initial_state, output_final_state\) must be causal",
    )
case(
    "flow_attention-query_padding_mask-causal",
    lambda: attnbook.flow_attention(*_qkv(), is_causal=True, query_padding_mask=torch.zeros(2, 5, dtype=torch.bool)),
    ValueError,
    r"is_causal must be False \(query i and key i are one position",
)
case(
    "mobile_attention-is_causal",
    lambda: attnbook.mobile_attention(*_qkv(), is_causal=True),
    ValueError,
    r"mobile_attention: is_causal must be False \(Mobile-Attention has no causal form",
)
case(
    "softmax_attention-causal-and-is_causal",
    lambda: attnbook.softmax_attention(*_qkv(), is_causal=True, causal=False),
    ValueError,
    r"causal must be None with is_causal=True \(causal is its old name\)",
)
case(
    "softmax_attention-dropout_p-negative",
    lambda: attnbook.softmax_attention(*_qkv(), dropout_p=-0.1),
    ValueError,
    r"softmax_attention: dropout_p must be a finite number >= 0 and < 1, got -0.1",
)
for eps, message in (
    (1e-300, r"eps must be 0 or at least float32's smallest normal number 1.175e-38"),
    (1e30, r"eps must be at most 1 \(eps keeps a normaliser away from zero; a larger one swamps it\), got 1e\+30"),
):
    for fn_name in ("linear_attention", "flow_attention", "mobile_attention"):
        case(f"{fn_name}-eps-{eps:g}", lambda fn=FUNCTIONS[fn_name], eps=eps: fn(*_qkv(), eps=eps), ValueError, message)
case(
    "linear_attention-key_padding_mask-list",
    lambda: attnbook.linear_attention(*_qkv(), key_padding_mask=[[True] * 5] * 2),
    TypeError,
    "key_padding_mask must be a torch.Tensor",
)
case(
    "linear_attention-feature_map-int",
    lambda: attnbook.linear_attention(*_qkv(), feature_map=3),
    TypeError,
    "feature_map",
)
case(
    "linear_attention-feature_map-returns-list",
    lambda: attnbook.linear_attention(*_qkv(), feature_map=lambda x: x.tolist()),
    TypeError,
    "the feature map must return a floating-point tensor",
)
case("elu_feature_map-list", lambda: elu_feature_map([1.0]), TypeError, "elu_feature_map: x must be a torch.Tensor")
case("relu_feature_map-int", lambda: relu_feature_map(torch.ones(2, dtype=torch.long)), TypeError, "floating-point")
case("resolve_feature_map-None", lambda: resolve_feature_map(None), TypeError, "feature_map must be")
case("PerformerFeatures-seed-float", lambda: PerformerFeatures(4, 4, seed=1.5), TypeError, "seed must be an int")
case("PerformerFeatures-seed-negative", lambda: PerformerFeatures(4, 4, seed=-1), ValueError, "seed must be an int in")
case("PerformerFeatures-generator-int", lambda: PerformerFeatures(4, 4, generator=0), TypeError, "generator must be")
case("PerformerFeatures.redraw-int", lambda: PerformerFeatures(4, 4, seed=0).redraw(0), TypeError, "generator must be")
case("PerformerFeatures.forward-list", lambda: PerformerFeatures(4, 4, seed=0)([1.0] * 4), TypeError, "x must be")
case(
    "MoHAttention-norm_layer-module",
    lambda: attnbook.MoHAttention(8, 4, shared_head=4, qk_norm=True, norm_layer=nn.LayerNorm(2)),
    TypeError,
    "norm_layer must be a normalisation class or factory",
)
case(
    "MoHAttention-gated",
    lambda: attnbook.MoHAttention(8, 4, shared_head=4, gated=True),
    ValueError,
    r"gated must be False \(timm's sigmoid output gate is not part of MoH",
)
case(
    "MoHAttention-attn_head_dim",
    lambda: attnbook.MoHAttention(8, 4, shared_head=4, head_dim=2, attn_head_dim=3),
    ValueError,
    r"attn_head_dim must equal head_dim \(attn_head_dim is timm's name for head_dim\)",
)
case(
    "MoHAttention-norm_layer-returns-int",
    lambda: attnbook.MoHAttention(8, 4, shared_head=4, qk_norm=True, norm_layer=lambda d: d),
    TypeError,
    r"norm_layer\(head_dim\) must return an nn.Module",
)
case(
    "MoHAttention.forward-attn_mask-int",
    lambda: attnbook.MoHAttention(8, 4, shared_head=4)(torch.randn(1, 3, 8), attn_mask=torch.ones(3, 3).long()),
    TypeError,
    "attn_mask must be a bool tensor",
)
case(
    "MoHAttention.forward-state-non-causal",
    lambda: attnbook.MoHAttention(8, 4, shared_head=4)(torch.randn(1, 3, 8), output_final_state=True),
    ValueError,
    r"MoHAttention: a call with a state \(initial_state, output_final_state\) must be causal",
)
for cls_name, cls in FAMILY.items():
    if cls_name != "MobileAttention":
        case(
            f"{cls_name}.forward-state-cross-attention",
            lambda cls=cls: cls(8, 8, 8, 2, causal=True)(
                torch.randn(1, 3, 8), torch.randn(1, 3, 8), output_final_state=True
            ),
            ValueError,
            rf"{cls_name}: a call with a state .* must be self-attention, layer\(x\)",
        )
        case(
            f"{cls_name}.step-x_t-shape",
            lambda cls=cls: cls(8, 8, 8, 2, causal=True).step(torch.randn(1, 3, 8)),
            ValueError,
            rf"{cls_name}.step: x_t must have 2 dimensions \(B, d_input\)",
        )
case(
    "MobileAttention.step",
    lambda: attnbook.MobileAttention(8, 8, 8, 2).step(torch.randn(1, 8)),
    ValueError,
    r"MobileAttention.step: the layer must have a recurrent step \(Mobile-Attention has no causal form",
)
case(
    "SoftmaxAttention.step-state",
    lambda: attnbook.SoftmaxAttention(8, 8, 8, 2, causal=True).step(torch.randn(1, 8), torch.zeros(2)),
    TypeError,
    r"SoftmaxAttention.step: state must be a KVCache \(from a previous call or step\) or None",
)


for cls_name in ("SoftmaxAttention", "LinearAttention", "FlowAttention", "MoHAttention", "GatedLinearAttention"):
    for kw_id, kw, error, message in (  # each failed inside torch's nn.Linear
        ("dtype-int64", {"dtype": torch.int64}, ValueError, "dtype must be a floating-point dtype, got torch.int64"),
        ("dtype-string", {"dtype": "float32"}, TypeError, "dtype must be a torch.dtype, got 'float32'"),
        ("device-unknown", {"device": "bogus"}, ValueError, "device must be a device string such as 'cpu'"),
    ):
        case(
            f"{cls_name}-{kw_id}",
            lambda cls_name=cls_name, kw=kw: getattr(attnbook, cls_name)(8, num_heads=2, **kw),
            error,
            rf"^{cls_name}: {message}",
        )


def _continue_cache(**change):
    """A softmax layer's step from a cache of 3 tokens (one padded) with fields changed: name -> f(cache)."""
    layer, x = attnbook.SoftmaxAttention(8, 8, 8, 2, causal=True), torch.randn(2, 4, 8)
    padding = torch.tensor([[True, False, False], [False, False, False]])
    _, cache = layer(x[:, :3], key_padding_mask=padding, output_final_state=True)
    return layer.step(x[:, 3], cache._replace(**{field: f(cache) for field, f in change.items()}))


for field_id, change, error, message in (  # each was misread (an int padding as a float mask) or failed in torch
    ("padding-int", {"padding": lambda c: c.padding.long()}, TypeError, r"state.padding must be None or a bool"),
    ("padding-shape", {"padding": lambda c: c.padding[:, :2]}, ValueError, r"shape \(B, t\) = \(2, 3\)"),
    ("values-length", {"values": lambda c: c.values[:, :, :2]}, ValueError, "as many tokens as state.keys"),
    ("keys-None", {"keys": lambda c: None}, ValueError, "must both be tensors or both None"),
    ("keys-list", {"keys": lambda c: [1, 2]}, TypeError, "state.keys must be a torch.Tensor or None"),
):
    case(f"SoftmaxAttention.step-cache-{field_id}", lambda change=change: _continue_cache(**change), error, message)
for ext_id, call, error, message in (  # each raised torch's "Sizes of tensors must match" from torch.cat
    ("batch", lambda c: c.extend(torch.randn(2, 2, 1, 4), torch.randn(2, 2, 1, 4)), ValueError, r"self.keys must"),
    ("width", lambda c: c.append(torch.randn(1, 2, 5), torch.randn(1, 2, 4)), ValueError, r"= \(1, 2, t, 5\)"),
    ("lengths", lambda c: c.extend(torch.randn(1, 2, 1, 4), torch.randn(1, 2, 2, 4)), ValueError, "new keys'"),
    ("padding", lambda c: c.extend(*torch.randn(2, 1, 2, 1, 4), torch.ones(1, 1)), TypeError, "padding must be"),
    ("list", lambda c: c.extend([1], torch.randn(1, 2, 1, 4)), TypeError, "k must be a torch.Tensor"),
):
    case(
        f"KVCache.extend-{ext_id}",
        lambda call=call: call(attnbook.KVCache.empty().extend(torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 4))),
        error,
        rf"^KVCache.extend: .*{message}",
    )
case(
    "LinearAttention.forward-initial_state",
    lambda: attnbook.LinearAttention(8, 8, 8, 2, causal=True)(torch.randn(1, 3, 8), initial_state=(1, 2)),
    TypeError,
    r"linear_attention: initial_state must be a LinearState \(from a previous call or step\) or None",
)
for bad_id, bad in (("None", None), ("string", "model"), ("tensor", torch.ones(2)), ("list", [nn.Linear(2, 2)])):
    case(
        f"moh_load_balancing_loss-model-{bad_id}",
        lambda bad=bad: attnbook.moh_load_balancing_loss(bad),
        TypeError,
        "model must be an nn.Module",
    )
case("mechanisms.get-int", lambda: mechanisms.get(3), TypeError, "name must be one of")
case("mechanisms.get-unknown", lambda: mechanisms.get("sofmax"), ValueError, "name must be one of")
case("testing.tol-string", lambda: testing.tol("float32"), TypeError, "tol: dtype must be one of")
case("testing.tol-int64", lambda: testing.tol(torch.int64), ValueError, "tol: dtype must be one of")
case("profiling.compare-list", lambda: profiling.compare([lambda: None]), TypeError, "fns must be a dict")
case(
    "profiling.compare-not-callable",
    lambda: profiling.compare({"a": 3}),
    TypeError,
    r"fns\['a'\] must be a zero-argument",
)
case(
    "profiling.compare-repeats-float", lambda: profiling.compare({"a": lambda: None}, repeats=2.5), TypeError, "repeats"
)
case(
    "profiling.compare-warmup-negative", lambda: profiling.compare({"a": lambda: None}, warmup=-1), ValueError, "warmup"
)
case(
    "profiling.compare-device-int",
    lambda: profiling.compare({"a": lambda: None}, device=0),
    TypeError,
    "device must be",
)
case(
    "profiling.compare-device-unknown",
    lambda: profiling.compare({"a": lambda: None}, device="gpu"),
    ValueError,
    "device",
)
case("profiling.peak_memory-not-callable", lambda: profiling.peak_memory(3), TypeError, "fn must be")
case("bench.run_benchmark-batch-zero", lambda: bench.run_benchmark([8], batch=0, progress=False), ValueError, "batch")
case(
    "bench.run_benchmark-dtype-string",
    lambda: bench.run_benchmark([8], dtype="float32", progress=False),
    TypeError,
    "dtype",
)
case(
    "reference.softmax_attention-rank",
    lambda: reference.softmax_attention(torch.randn(2, 5, 4), *_qkv()[1:]),
    ValueError,
    "q must have 4",
)
case(
    "reference.flow_attention-causal-lengths",
    lambda: reference.flow_attention(*qkv(1, 1, 3, 4, 2, 2), is_causal=True),
    ValueError,
    "N == M",
)
case(
    "reference.mobile_attention-lengths",
    lambda: reference.mobile_attention(*qkv(1, 1, 3, 4, 2, 2)),
    ValueError,
    "N == M",
)
for fn_name, arg, bad, error in (  # each was accepted, and NaN, inf or a negative one made NaN outputs
    ("softmax_attention", "scale", float("nan"), ValueError),
    ("softmax_attention", "scale", 0.0, ValueError),
    ("softmax_attention", "scale", "1", TypeError),
    ("linear_attention", "eps", -1e-6, ValueError),
    ("flow_attention", "eps", float("inf"), ValueError),
    ("mobile_attention", "eps", float("nan"), ValueError),
    ("gated_linear_attention", "scale", -1.0, ValueError),
):
    extra = {"mobile_attention": (), "gated_linear_attention": (-torch.rand(1, 1, 3),)}.get(fn_name, ())
    case(
        f"reference.{fn_name}-{arg}-{bad!r}",
        lambda fn_name=fn_name, arg=arg, bad=bad, extra=extra: getattr(reference, fn_name)(
            *qkv(1, 1, 3, 3, 2, 2), *extra, **{arg: bad}
        ),
        error,
        rf"^reference\.{fn_name}: {arg} must be a (finite )?number",
    )
case(
    "reference.linear_attention-feature_map",
    lambda: reference.linear_attention(*_qkv(), feature_map="x"),
    ValueError,
    "feature_map",
)

CHECKS = Path(_checks.__file__).resolve()


@pytest.mark.parametrize("case_id", list(CASES))
def test_bad_argument_raises_one_wording_from_the_validation_module(case_id):
    call, error, message = CASES[case_id]
    with pytest.raises((TypeError, ValueError)) as info:
        call()
    assert info.type is error, f"{info.type.__name__} instead of {error.__name__}: {info.value}"
    text = str(info.value)
    assert ": " in text and " must " in text and (", got " in text or "got " in text), text
    assert re.search(message, text), f"{message!r} not in {text!r}"
    raised_in = Path(info.traceback[-1].path).resolve()
    assert raised_in == CHECKS, f"raised in {raised_in}, not by the validation module"


# ----------------------------------------------------------------------------------------------------------
# The wording itself


def test_describe_quotes_what_was_received():
    assert _checks.describe(torch.zeros(2, 3)) == "a float32 tensor of shape (2, 3)"
    assert _checks.describe(torch.zeros(1, device="meta")) == "a float32 tensor of shape (1) on meta"
    assert _checks.describe([1, 2]) == "a list of length 2"
    assert _checks.describe(torch.zeros(2).numpy()) == "a numpy.ndarray of shape (2,)"
    assert _checks.describe(nn.Linear(2, 2)) == "a Linear module"
    assert _checks.describe("x" * 100).endswith("...") and len(_checks.describe("x" * 100)) == 80
    assert _checks.describe(2.5) == "2.5"


def test_one_rule_for_empty_sizes_names_the_size():
    with pytest.raises(ValueError, match=r"flow_attention: B must be at least 1 \(every size must be\), got q \(0"):
        attnbook.flow_attention(*qkv(0, 2, 3, 3, 2, 2), return_flows=True)
    with pytest.raises(ValueError, match=r"mobile_attention: H must be at least 1"):
        attnbook.mobile_attention(*qkv(1, 0, 3, 3, 2, 2))


# ---------------------------------------------------------------------------------------- the general checks
# Each check: what it accepts comes back unchanged, and each way of failing raises the named error, one wording.

C = _checks
GENERAL_CHECKS = {
    "int_why": (lambda: C.check_int(3, "n_keys", name="f", minimum=5, why=" (n_pairs)"), ValueError,
                r"^f: n_keys must be an int >= 5 \(n_pairs\), got 3$"),
    "number_why": (lambda: C.check_number(1, "hi", name="f", minimum=3, why=" (lo)"), ValueError,
                   r"^f: hi must be a finite number >= 3 \(lo\), got 1.0$"),
    "not_both_why": (lambda: C.check_not_both(1, 2, "a", "b", name="f", why=" (a has one)"), ValueError,
                     r"^f: b must be None when a is given \(a has one\), got 2$"),
    "exclusive": (lambda: C.check_exclusive(True, True, "a", "b", name="f", why=" (no b with a)"), ValueError,
                  r"^f: b must be False with a=True \(no b with a\), got b=True$"),
    "count_few": (lambda: C.check_count([], "xs", name="f", item="map"), ValueError,
                  "^f: xs must hold at least 1 map, got 0 maps$"),
    "count_many": (lambda: C.check_count([1] * 4, "xs", name="f", maximum=3, item="panel"), ValueError,
                   "^f: xs must hold 1 to 3 panels, got 4 panels$"),
    "count_exact": (lambda: C.check_count([1], "xs", name="f", minimum=2, maximum=2, item="value", why=" (one per N)"),
                    ValueError, r"^f: xs must hold 2 values \(one per N\), got 1 value$"),
    "count_series": (lambda: C.check_count({}, "xs", name="f", item="series"), ValueError,
                     "^f: xs must hold at least 1 series, got 0 series$"),
    "sequence_type": (lambda: C.check_sequence("ab", "xs", name="f"), TypeError,
                      r"^f: xs must be a sequence \(a list or a tuple\), got 'ab'$"),
    "sequence_mapping": (lambda: C.check_sequence([1], "xs", name="f", mapping=True), TypeError,
                         "^f: xs must be a mapping, got a list of length 1$"),
    "sequence_empty": (lambda: C.check_sequence((), "xs", name="f", minimum=1, item="seed"), ValueError,
                       "^f: xs must hold at least 1 seed, got 0 seeds$"),
    "subset": (lambda: C.check_subset(["a", "z"], "names", ["a", "b"], name="f"), ValueError,
               r"^f: names must be among 'a', 'b', got unknown names \['z'\]$"),
    "all_equal": (lambda: C.check_all_equal({"r0": [1, 2], "r1": [1, 3]}, "steps", name="f", what="be equal"),
                  ValueError, r"^f: steps must be equal, got \[1, 2\] for r0 but \[1, 3\] for r1$"),
    "dims_type": (lambda: C.check_dims([[1]], "w", 2, name="f"), TypeError,
                  "^f: w must be an array or a tensor, got a list of length 1$"),
    "dims_count": (lambda: C.check_dims(torch.zeros(2), "w", 2, name="f", layout="(N, M)"), ValueError,
                   r"^f: w must have 2 dimensions \(N, M\), got a float32 tensor of shape \(2\)$"),
    "dims_at_least": (lambda: C.check_dims(torch.tensor(1.0), "w", 1, name="f", at_least=True), ValueError,
                      r"^f: w must have at least 1 dimensions, got a float32 tensor of shape \(\)$"),
    "square": (lambda: C.check_square(torch.zeros(2, 3), "w", name="f"), ValueError,
               r"^f: w must be square \(\.\.\., N, N\), got a float32 tensor of shape \(2, 3\)$"),
    "square_type": (lambda: C.check_square([[1.0]], "w", name="f"), TypeError, "^f: w must be a torch.Tensor"),
    "non_negative": (lambda: C.check_non_negative(torch.tensor([1.0, -2.0]), "w", name="f"), ValueError,
                     "^f: w must be non-negative, got a minimum of -2$"),
    "nonzero": (lambda: C.check_nonzero(torch.zeros(2), "e", name="f", why=" (it divides)"), ValueError,
                r"^f: e must not be all zeros \(it divides\), got a float32 tensor of shape \(2\) of zeros$"),
    "same_shape": (lambda: C.check_same_shape(torch.zeros(2), torch.zeros(3), "a", "b", name="f"), ValueError,
                   r"^f: b must have the shape \(2\) of a, got a float32 tensor of shape \(3\)$"),
    "max_size": (lambda: C.check_max_size(torch.zeros(1, 9), "t", 1, 8, name="f", label="N", why=" (length)"),
                 ValueError, r"^f: t must have N <= 8 \(length\), got a float32 tensor of shape \(1, 9\)$"),
    "unbatched": (lambda: C.check_unbatched(torch.zeros(2, 2, 3, 4), "q", name="f"), ValueError,
                  r"^f: q must have shape \(H, N, D\) or \(1, H, N, D\), got a float32 tensor of shape \(2, 2"),
    "unbatched_type": (lambda: C.check_unbatched(torch.zeros(2, 3, 4, dtype=torch.long), "q", name="f"), TypeError,
                       "^f: q must be a floating-point tensor"),
    "moh_routed": (lambda: C.check_moh_routed(4, 4, name="f", why=" to train"), ValueError,
                   r"^f: the layer must have routed heads \(shared_head < num_heads\) to train, got num_heads=4, "
                   "shared_head=4$"),
}  # fmt: skip


@pytest.mark.parametrize("call, error, message", GENERAL_CHECKS.values(), ids=GENERAL_CHECKS.keys())
def test_general_checks_refuse_with_one_wording(call, error, message):
    with pytest.raises(error, match=message):
        call()


def test_general_checks_pass_good_values_through():
    x = torch.zeros(1, 2, 3, 4)
    assert C.check_int(5, "n", name="f", minimum=5, why=" (w)") == 5
    assert C.check_number(3, "hi", name="f", minimum=3, why=" (lo)") == 3.0
    assert C.check_not_both(None, 2, "a", "b", name="f", why="") is None
    assert C.check_exclusive(True, False, "a", "b", name="f") is None
    assert C.check_exclusive(False, True, "a", "b", name="f") is None
    assert C.check_count([1, 2], "xs", name="f", maximum=2) == [1, 2]
    assert C.check_sequence(range(3), "xs", name="f", minimum=3) == range(3)
    assert C.check_sequence({"a": 1}, "xs", name="f", mapping=True) == {"a": 1}
    assert C.check_subset(["b"], "names", ["a", "b"], name="f") is None
    assert C.check_all_equal({"r0": [1], "r1": [1]}, "steps", name="f", what="be equal") is None
    assert C.check_dims(x, "x", 4, name="f") is x and C.check_dims(x, "x", 2, name="f", at_least=True) is x
    sq = torch.rand(2, 3, 3)
    assert C.check_square(sq, "w", name="f") is sq
    assert C.check_non_negative(sq, "w", name="f") is sq
    assert C.check_nonzero(sq, "w", name="f") is sq
    assert C.check_same_shape(sq, sq.clone(), "a", "b", name="f") is None
    assert C.check_max_size(x, "x", -1, 4, name="f", label="D") is x
    assert C.check_unbatched(x, "q", name="f") is x
    assert C.check_unbatched(x[0], "q", name="f").shape == (1, 2, 3, 4)
    assert C.check_moh_routed(4, 3, name="f") is None


def test_no_validation_outside_the_validation_module():
    """Every raise in src/attnbook outside _checks.py is one of the known non-validation ones: a re-raise, an
    abstract method, an internal invariant or a capability the object lacks (each named here with its reason)."""
    allowed = {
        "exercises/_core.py": 2,  # Result.require's AssertionError (its purpose); a checker registered twice
        # BadReturn: a checker's wrapper tells check_function that what the student's function returned is unusable
        # (feedback on the answer, reported as what it returned, not a validation of the package's inputs)
        "exercises/ch02.py": 1,
        # NotImplementedError: the abstract attend(), attend_step(), gates(), mix(), mix_step(), neutral()
        "_module.py": 6,
        "mechanisms.py": 1,  # Mechanism.__call__ on a token-input entry: the entry has no q, k, v function
        "testing.py": 2,  # assert_matches_reference's baseline: re-raise of assert_close, its own AssertionError
        "viz/static.py": 1,  # Explorer.__getattr__: AttributeError for a name that is not a control (the protocol)
    }
    root = Path(attnbook.__file__).parent
    found = {}
    for path in root.rglob("*.py"):
        rel = path.relative_to(root).as_posix()
        if rel == "_checks.py":
            continue
        count = len(re.findall(r"^\s*raise\b", path.read_text(), flags=re.M))
        if count:
            found[rel] = count
    assert found == allowed
