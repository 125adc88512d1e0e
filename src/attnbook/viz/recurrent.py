"""Chapter 8's picture of a recurrent state: what each write rule leaves in S (D x Dv) after every token.

:func:`compute_writes` runs the three rules with the package's own steps on the same key-value pairs: **add**
(linear attention, S += k v^T: the gated step with g = 0), **decay** (S = gamma S + k v^T) and **delta**
(S += beta k (v - S^T k)^T). :func:`plot_writes` draws a row of heat maps per rule, one per token: with one-hot
keys, row d of S is the value stored under key d.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import matplotlib.pyplot as plt
import torch

from .. import delta_rule_step, gated_linear_attention_step
from .._checks import check_number, check_tensor
from .style import PAGE_WIDTH, book_style

__all__ = ["RULES", "compute_writes", "plot_writes"]

#: The write rules of :func:`compute_writes`, in the order they are drawn.
RULES = ("add", "decay", "delta")


def compute_writes(
    keys: torch.Tensor, values: torch.Tensor, *, gamma: float = 0.5, beta: float = 1.0
) -> dict[str, list[torch.Tensor]]:
    """The state S (D, Dv) after each of the T writes of ``keys`` (T, D) and ``values`` (T, Dv), per rule.

    The scale of the readout plays no part (S is what is written), so the states are those of the steps with the
    queries left out. Returns ``{rule: [S_1, ..., S_T]}``, float64."""
    name = "compute_writes"
    keys = check_tensor(keys, "keys", name=name, dims=2, layout="(T, D)").double()
    values = check_tensor(values, "values", name=name, dims=2, layout="(T, Dv)").double()
    gamma = check_number(gamma, "gamma", name=name, minimum=0.0, maximum=1.0, strict_minimum=True)
    beta = check_number(beta, "beta", name=name, minimum=0.0)
    q = torch.zeros_like(keys[0])[None, None]  # (1, 1, D): the readout is not drawn
    out: dict[str, list[torch.Tensor]] = {rule: [] for rule in RULES}
    states: dict[str, torch.Tensor | None] = dict.fromkeys(RULES)
    for k, v in zip(keys, values, strict=True):
        k_t, v_t = k[None, None], v[None, None]  # (1, 1, D), (1, 1, Dv)
        for rule, g in (("add", 0.0), ("decay", math.log(gamma))):
            _, states[rule] = gated_linear_attention_step(q, k_t, v_t, torch.full((1, 1), g).double(), states[rule])
        _, states["delta"] = delta_rule_step(q, k_t, v_t, torch.full((1, 1), beta).double(), states["delta"])
        for rule in RULES:
            out[rule].append(states[rule][0, 0].clone())
    return out


def plot_writes(
    states: dict[str, list[torch.Tensor]], *, labels: Sequence[str] | None = None, title: str | None = None
):
    """Heat maps of :func:`compute_writes`' states: one row per rule, one column per token (``labels`` name the
    tokens' writes), one colour scale for all, blue negative and red positive."""
    rules = list(states)
    T = len(states[rules[0]])
    top = max(float(S.abs().max()) for rule in rules for S in states[rule]) or 1.0
    with book_style():
        fig, axes = plt.subplots(len(rules), T, figsize=(PAGE_WIDTH, 1.45 * len(rules) + 0.6), squeeze=False,
                                 layout="constrained")  # fmt: skip
        for r, rule in enumerate(rules):
            for t, S in enumerate(states[rule]):
                ax = axes[r, t]
                image = ax.imshow(S.numpy(), cmap="RdBu_r", vmin=-top, vmax=top)
                ax.set(xticks=[], yticks=[])
                if r == 0 and labels is not None:
                    ax.set_title(labels[t])
            axes[r, 0].set_ylabel(rule)
        fig.colorbar(image, ax=axes, shrink=0.8, label="entry of S")
        if title:
            fig.suptitle(title)
    return fig
