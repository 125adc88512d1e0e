"""The one registry of mechanisms: what each one is, how to call it, and what checks it.

Every consumer (the benchmarks, the GPU check, the training race, the language model, the chapters and the tests)
reads :data:`MECHANISMS`, so adding a mechanism means adding one entry here. Three kinds of input exist:

* ``"qkv"``: ``function(q, k, v, is_causal=...)`` on per-head q (B, H, N, D), k (B, H, M, D), v (B, H, M, Dv),
  and a float64 ``reference`` with the same call;
* ``"qkvg"``: a causal ``function(q, k, v, gate)`` whose gate the layer computes from its input (chapter 8:
  :attr:`Mechanism.gate`), and a float64 ``reference`` with the same call;
* ``"x"``: a layer on tokens x (B, N, C) only (MoH routes tokens to heads); ``reference(layer, x, is_causal=...)``
  evaluates the layer's weights literally in float64.

Every entry's ``module(dim, n_heads, causal=...)`` builds a self-attention layer (B, N, dim) -> (B, N, dim),
without dropout, so that all mechanisms can be swapped inside one model.

Example:
    >>> import torch
    >>> from attnbook.mechanisms import MECHANISMS, names
    >>> x = torch.randn(2, 10, 32)
    >>> {name: tuple(MECHANISMS[name].module(32, 4)(x).shape) for name in names(bidirectional=True)}
    {'softmax': (2, 10, 32), 'linear': (2, 10, 32), 'flow': (2, 10, 32), 'mobile': (2, 10, 32), 'moh': (2, 10, 32)}
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias

import torch

from . import reference
from ._checks import check_bool, check_choice, check_int
from ._module import ProjectedAttention, RecurrentAttention
from .delta import DeltaRuleAttention, delta_rule_attention, delta_rule_step
from .flow import FlowAttention, FlowState, flow_attention, flow_attention_step
from .gated import GatedLinearAttention, gated_linear_attention, gated_linear_attention_step
from .linear import LinearAttention, LinearState, linear_attention, linear_attention_step
from .mobile import _NO_CAUSAL, MobileAttention, mobile_attention
from .moh import MoHAttention, default_heads
from .softmax import SoftmaxAttention, softmax_attention

__all__ = ["Mechanism", "MECHANISMS", "get", "names"]

#: What an entry's ``module`` builds: a layer of the module family or an MoH layer. Its recurrent state is the
#: layer's own (a KVCache, a LinearState or a FlowState), so the family's state parameter is Any here.
Layer: TypeAlias = "ProjectedAttention[Any] | MoHAttention | RecurrentAttention"
#: The state an entry's ``step`` carries.
RecurrentState: TypeAlias = "LinearState | FlowState | torch.Tensor"


@dataclass(frozen=True)
class Mechanism:
    """One mechanism of the book.

    Attributes:
        name, title, chapter: short key (``"flow"``), what the book calls it, the chapter that derives it.
        inputs: ``"qkv"``, ``"qkvg"`` or ``"x"`` (module docstring).
        causal, bidirectional: whether a causal, and a non-causal, form exists.
        gate: for ``"qkvg"``: ``"decay"`` (log-decays, (B, H, N)), ``"key decay"`` ((B, H, N, D)) or ``"beta"``
            (the delta rule's, (B, H, N)); else None.
        same_length: the mechanism needs N == M even when not causal.
        function: the fast function (None for ``"x"``), returning the output tensor.
        reference: the float64 oracle, with the function's call (``"x"``: ``reference(layer, x, is_causal=...)``).
        module: ``module(dim, n_heads, causal=False, **kwargs)`` -> a self-attention layer.
        step: the recurrent one-token form ``step(q_t, k_t, v_t[, gate_t], state) -> (out_t, state)``, or None
            when generation needs a cache of past keys and values.

    Example:
        >>> import torch
        >>> from attnbook.mechanisms import MECHANISMS
        >>> flow = MECHANISMS["flow"]
        >>> q, k, v = (torch.randn(1, 2, 8, 4) for _ in range(3))
        >>> torch.allclose(flow(q, k, v, is_causal=True), flow.reference(q, k, v, is_causal=True).float(), atol=1e-5)
        True
    """

    name: str
    title: str
    chapter: int
    inputs: Literal["qkv", "qkvg", "x"]
    causal: bool
    same_length: bool
    function: Callable[..., torch.Tensor] | None
    reference: Callable[..., torch.Tensor]
    module: Callable[..., Layer]
    step: Callable[..., tuple[torch.Tensor, RecurrentState]] | None = None
    bidirectional: bool = True
    gate: Literal["decay", "key decay", "beta"] | None = None

    @property
    def forms(self) -> tuple[bool, ...]:
        """The values of ``causal`` the mechanism has a form for: (False, True), (False,) or (True,)."""
        return tuple(c for c in (False, True) if (self.causal if c else self.bidirectional))

    def example_inputs(
        self, B: int, H: int, N: int, D: int, *, generator: torch.Generator | None = None, dtype: Any = None
    ) -> list[torch.Tensor]:
        """Standard normal q, k, v (B, H, N, D) for the function, and for ``"qkvg"`` a gate as its layer makes one:
        log-decays logsigmoid(z) (per head or per key dimension), or beta = sigmoid(z) with unit keys (the delta
        rule's layer normalises them; with raw keys of norm sqrt(D) its state would grow without bound)."""
        q, k, v = (torch.randn(B, H, N, D, generator=generator, dtype=dtype) for _ in range(3))
        if self.gate is None:
            return [q, k, v]
        z = torch.randn((B, H, N, D) if self.gate == "key decay" else (B, H, N), generator=generator, dtype=dtype)
        if self.gate == "beta":
            return [q, torch.nn.functional.normalize(k, dim=-1), v, torch.sigmoid(z)]
        return [q, k, v, torch.nn.functional.logsigmoid(z)]

    def __call__(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        """Call the fast function (``"qkv"`` mechanisms only)."""
        if self.function is None:
            raise TypeError(
                f"the {self.name!r} mechanism works on tokens (B, N, C), not on q, k, v: "
                f"build a layer with MECHANISMS[{self.name!r}].module(dim, n_heads)"
            )
        return self.function(*args, **kwargs)


def _family(cls: type[ProjectedAttention[Any]], key: str, **fixed: Any) -> Callable[..., ProjectedAttention[Any]]:
    """Factory for the softmax / linear / flow / mobile module family: (dim, n_heads, causal) -> layer."""

    def make(dim: int, n_heads: int, causal: bool = False, **kwargs: Any) -> ProjectedAttention[Any]:
        options = {"drop_out": 0.0, **fixed, **kwargs}
        if check_bool(causal, "causal", name=f"MECHANISMS[{key!r}].module"):
            options["causal"] = True
        return cls(dim, dim, dim, n_heads, **options)

    make.__doc__ = f"{cls.__name__}(dim, dim, dim, n_heads, drop_out=0.0, causal=causal, **kwargs)"
    return make


def _recurrent(cls: type[RecurrentAttention], key: str, **fixed: Any) -> Callable[..., RecurrentAttention]:
    """Factory for chapter 8's layers: (dim, n_heads, causal=True) -> layer; they have no non-causal form."""

    def make(dim: int, n_heads: int, causal: bool = True, **kwargs: Any) -> RecurrentAttention:
        why = " (this mechanism is causal only: its state is written token by token)"
        check_choice(check_bool(causal, "causal", name=f"MECHANISMS[{key!r}].module"), "causal", (True,),
                     name=f"MECHANISMS[{key!r}].module", why=why)  # fmt: skip
        return cls(dim, n_heads, **{**fixed, **kwargs})

    make.__doc__ = f"{cls.__name__}(dim, n_heads, {', '.join(f'{k}={v!r}' for k, v in fixed.items())})"
    return make


def _mobile_module(dim: int, n_heads: int, causal: bool = False, **kwargs: Any) -> MobileAttention:
    """MobileAttention(dim, dim, dim, n_heads, drop_out=0.0); it has no causal form."""
    check_choice(causal, "causal", (False,), name="MECHANISMS['mobile'].module", why=_NO_CAUSAL)
    return MobileAttention(dim, dim, dim, n_heads, **{"drop_out": 0.0, **kwargs})


def _moh_module(dim: int, n_heads: int, causal: bool = False, **kwargs: Any) -> MoHAttention:
    """MoHAttention(dim, n_heads, qkv_bias=True, causal=causal) with :func:`attnbook.moh.default_heads`' split."""
    shared, routed = default_heads(check_int(n_heads, "n_heads", name="MECHANISMS['moh'].module", minimum=1))
    options = {"qkv_bias": True, "shared_head": shared, "routed_head": routed, "causal": causal, **kwargs}
    return MoHAttention(dim, n_heads, **options)


def _moh_reference(
    layer: MoHAttention, x: torch.Tensor, *, is_causal: bool | None = None, **masks: Any
) -> torch.Tensor:
    """The output of :func:`attnbook.reference.moh_layer` (float64); ``masks``: ``attn_mask``,
    ``key_padding_mask`` (Any: passed on as they are, the deprecated ``mask`` too)."""
    return reference.moh_layer(layer, x, is_causal=is_causal, **masks)[0]


#: Every mechanism of the package by name, with its function, module, float64 reference and whether a causal
#: form exists: the registry that the tests, the benchmarks and the chapters iterate over.
MECHANISMS: dict[str, Mechanism] = {
    m.name: m
    for m in (
        Mechanism(
            "softmax",
            "softmax attention",
            1,
            "qkv",
            causal=True,
            same_length=False,
            function=softmax_attention,
            reference=reference.softmax_attention,
            module=_family(SoftmaxAttention, "softmax"),
        ),
        Mechanism(
            "linear",
            "linear attention",
            2,
            "qkv",
            causal=True,
            same_length=False,
            function=linear_attention,
            reference=reference.linear_attention,
            module=_family(LinearAttention, "linear"),
            step=linear_attention_step,
        ),
        Mechanism(
            "flow",
            "Flow-Attention",
            3,
            "qkv",
            causal=True,
            same_length=False,
            function=flow_attention,
            reference=reference.flow_attention,
            module=_family(FlowAttention, "flow"),
            step=flow_attention_step,
        ),
        Mechanism(
            "mobile",
            "Mobile-Attention",
            4,
            "qkv",
            causal=False,
            same_length=True,
            function=mobile_attention,
            reference=reference.mobile_attention,
            module=_mobile_module,
        ),
        Mechanism(
            "moh",
            "mixture-of-head attention",
            5,
            "x",
            causal=True,
            same_length=True,
            function=None,
            reference=_moh_reference,
            module=_moh_module,
        ),
        Mechanism(
            "decay",
            "linear attention with decay",
            8,
            "qkvg",
            causal=True,
            same_length=True,
            function=gated_linear_attention,
            reference=reference.gated_linear_attention,
            module=_recurrent(GatedLinearAttention, "decay", decay="fixed"),
            step=gated_linear_attention_step,
            bidirectional=False,
            gate="decay",
        ),
        Mechanism(
            "gated",
            "gated linear attention",
            8,
            "qkvg",
            causal=True,
            same_length=True,
            function=gated_linear_attention,
            reference=reference.gated_linear_attention,
            module=_recurrent(GatedLinearAttention, "gated", decay="data"),
            step=gated_linear_attention_step,
            bidirectional=False,
            gate="key decay",
        ),
        Mechanism(
            "delta",
            "delta-rule attention",
            8,
            "qkvg",
            causal=True,
            same_length=True,
            function=delta_rule_attention,
            reference=reference.delta_rule_attention,
            module=_recurrent(DeltaRuleAttention, "delta"),
            step=delta_rule_step,
            bidirectional=False,
            gate="beta",
        ),
    )
}


def names(*, causal: bool = False, bidirectional: bool = False, inputs: str | None = None) -> list[str]:
    """Names in registry order; ``causal=True`` keeps those with a causal form, ``bidirectional=True`` those with a
    non-causal one, ``inputs`` one input kind.

    Example:
        >>> from attnbook import mechanisms
        >>> mechanisms.names(causal=True)
        ['softmax', 'linear', 'flow', 'moh', 'decay', 'gated', 'delta']
        >>> mechanisms.names(inputs="x")
        ['moh']
    """
    check_bool(causal, "causal", name="names")
    check_bool(bidirectional, "bidirectional", name="names")
    if inputs is not None:
        check_choice(inputs, "inputs", ("qkv", "qkvg", "x"), name="names")
    return [
        n
        for n, m in MECHANISMS.items()
        if (m.causal or not causal) and (m.bidirectional or not bidirectional) and inputs in (None, m.inputs)
    ]


def get(name: str) -> Mechanism:
    """The entry called ``name``; a ``ValueError`` (``TypeError`` for a non-string) listing the known names.

    Example:
        >>> from attnbook import mechanisms
        >>> mechanisms.get("mobile").step is None  # no causal form, so no recurrent step
        True
    """
    return MECHANISMS[check_choice(name, "name", tuple(MECHANISMS), name="mechanisms.get")]
