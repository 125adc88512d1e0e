"""The head-routing explorer for chapter 5 (mixture-of-head attention, MoH).

Jin et al., "MoH: Multi-Head Attention as Mixture-of-Head Attention", arXiv 2410.11842.

A small :class:`attnbook.MoHAttention` routes a batch of tokens to its heads. The pure compute functions
(tested) build that module and read the routing straight from its forward pass
(``forward(x, return_routing=True)``); the views draw it:

- :func:`compute_routing` -- the gates (token x head), the heads each token activates, the load of every
  routed head against the balanced target, and the load-balancing loss, as a :class:`RoutingState`;
- :func:`train_router` -- a few optimiser steps on the router alone, with the load-balancing loss, returning
  the loss and the loads after every step (a :class:`RouterTraining`), so the load can be seen evening out;
- :func:`plot_routing` -- one matplotlib ``Figure`` of a state (and, optionally, of its training so far);
- :func:`routing_explorer` -- the live ipywidgets explorer (core widgets only: ipywidgets 7.7 and 8);
- :func:`default_figure` and :func:`training_frames` -- the static figure and the pre-rendered frames the
  website shows in place of the live widget;
- :func:`fraction_curve` and :func:`fraction_figure` -- quality against the fraction of heads each token
  activates (the MoH paper's claim), from a live :func:`attnbook.lab.claims.moh_study` or its recording.

The tokens are Gaussian around a shared mean direction (``offset``), as real token embeddings tend to be:
the shared component gives a freshly initialised router a preference for a few heads, which is the
imbalance the load-balancing loss exists to remove.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, replace

import ipywidgets as widgets
import numpy as np
import torch
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure
from torch import nn

from .._checks import (
    check_count,
    check_found,
    check_instance,
    check_int,
    check_moh_heads,
    check_moh_routed,
    check_non_negative,
    check_not_both,
    check_number,
    check_sequence,
    check_tensor,
)
from ..moh import MoHAttention
from .static import enable_slider_keys, figure_to_png, set_slider_range
from .style import DPI, PAGE_WIDTH, book_style, colour

__all__ = [
    "RoutingState",
    "RouterTraining",
    "compute_routing",
    "load_imbalance",
    "train_router",
    "plot_routing",
    "default_figure",
    "training_frames",
    "routing_explorer",
    "RoutingExplorer",
    "fraction_curve",
    "fraction_figure",
]

_ROUTER_LAYERS = ("wg", "wg_0", "wg_1")  # MoH's router: routed heads, shared-vs-routed split, shared heads


@dataclass(frozen=True)
class RoutingState:
    """One routing of ``tokens`` by ``module``, read from its forward pass (CPU float64 copies).

    Everything here comes from the :class:`attnbook.HeadRouting` that ``module(tokens, return_routing=True)``
    returns; nothing about the routing is recomputed by the widget. With more than one sequence in
    ``tokens`` the per-token matrices are those of the first; load and loss are over all tokens.

    Attributes:
        module: the :class:`attnbook.MoHAttention` that routed the tokens (in training mode).
        tokens: (1, N, C) the routed tokens.
        n_heads, shared, top_k, temperature, seed: the settings it was built with.
        gates: (N, H) the weight of every head for every token (0 for heads a token does not use).
        selected: (N, H) bool, the heads each token activates (shared heads always).
        routed_probs: (N, E) the router's softmax over the E = H - shared routed heads.
        load: (E,) fraction of the tokens that activate each routed head; sums to ``top_k``.
        target: the balanced load ``top_k / E`` (every routed head equally busy).
        loss: the load-balancing loss of this routing (0 when there are no routed heads).
        step: router optimiser steps taken since :func:`compute_routing`.
    """

    module: nn.Module
    tokens: torch.Tensor
    n_heads: int
    shared: int
    top_k: int
    temperature: float
    seed: int
    gates: torch.Tensor
    selected: torch.Tensor
    routed_probs: torch.Tensor
    load: torch.Tensor
    target: float
    loss: float
    step: int = 0

    @property
    def routed(self) -> int:
        """E, the number of routed heads."""
        return self.n_heads - self.shared

    @property
    def imbalance(self) -> float:
        """:func:`load_imbalance` of this state's load."""
        return load_imbalance(self.load, self.top_k)


@dataclass(frozen=True)
class RouterTraining:
    """What :func:`train_router` recorded: index 0 is before the first step, index s after step s.

    Attributes:
        losses: (S + 1,) the load-balancing loss.
        loads: (S + 1, E) the load of every routed head.
        imbalances: (S + 1,) :func:`load_imbalance` of each load.
        target: the balanced load ``top_k / E``.
        top_k: k, the balanced value of the loss.
        state: the routing after the last step.
    """

    losses: np.ndarray
    loads: np.ndarray
    imbalances: np.ndarray
    target: float
    top_k: int
    state: RoutingState

    @property
    def steps(self) -> int:
        return len(self.losses) - 1

    def then(self, later: RouterTraining) -> RouterTraining:
        """This training followed by ``later`` (which must start where this one ended)."""
        return RouterTraining(
            losses=np.concatenate([self.losses, later.losses[1:]]),
            loads=np.concatenate([self.loads, later.loads[1:]]),
            imbalances=np.concatenate([self.imbalances, later.imbalances[1:]]),
            target=later.target,
            top_k=later.top_k,
            state=later.state,
        )


def load_imbalance(load, top_k: int) -> float:
    """The fraction of all head choices that would have to move to another head to balance the load.

    ``sum_e max(load_e - k/E, 0) / k``: 0 when every routed head is chosen by the same share of tokens,
    approaching 1 - k/E when all tokens choose the same k heads.

    Args:
        load: (E,) the share of tokens that chose each routed head (``HeadRouting.load``): a tensor or a
            sequence of finite numbers >= 0 (none: a layer without routed heads, balanced, 0).
        top_k: the routed heads each token chooses, an int from 1 to E (0 when E = 0).
    """
    name = "load_imbalance"
    if not isinstance(load, torch.Tensor):
        if not hasattr(load, "__array__"):
            what = "a 1-D tensor, array or sequence of numbers (the load of each routed head)"
            check_sequence(load, "load", name=name, what=what)
            load = [check_number(x, "load", name=name, minimum=0.0) for x in load]
        load = torch.as_tensor(load, dtype=torch.float64)
    check_tensor(load, "load", name=name, dims=1, layout="(E,)")
    load = load.detach().to(torch.float64)
    check_non_negative(load, "load", name=name)  # a NaN is refused too
    E = load.numel()
    if E == 0:  # a layer without routed heads: nothing to balance
        check_int(top_k, "top_k", name=name, minimum=0, maximum=0, why=" (there are no routed heads)")
        return 0.0
    top_k = check_int(top_k, "top_k", name=name, minimum=1, maximum=E, why=" (the routed heads)")
    target = top_k / load.numel()
    return float((load - target).clamp_min(0).sum() / top_k)


def _check_settings(n_heads, shared, top_k, temperature, *, name: str) -> tuple[int, int, int, float]:
    """MoH's head rules (``attnbook._checks.check_moh_heads``: n_heads, shared, top_k are the layer's
    num_heads, shared_head, routed_head) and a positive, finite temperature."""
    where = f"{name} (n_heads, shared, top_k are MoH's num_heads, shared_head, routed_head)"
    H, S, K = check_moh_heads(n_heads, shared, top_k, name=where)
    temperature = check_number(temperature, "temperature", name=name, minimum=0.0, strict_minimum=True)
    return H, S, K, temperature


def _clone(module: nn.Module) -> nn.Module:
    """A deep copy of ``module`` that leaves behind tensors still attached to an autograd graph.

    After a training forward an MoH layer keeps its load-balancing loss, a non-leaf tensor, which
    ``copy.deepcopy`` refuses to copy; the copy gets None in its place (its next forward sets it again).
    """
    memo = {
        id(value): None
        for m in module.modules()
        for value in vars(m).values()
        if isinstance(value, torch.Tensor) and not value.is_leaf
    }
    return copy.deepcopy(module, memo)


def _router_parameters(module: nn.Module) -> list[nn.Parameter]:
    return [getattr(module, name).weight for name in _ROUTER_LAYERS if hasattr(module, name)]


def _read_routing(module: nn.Module, tokens: torch.Tensor, **settings) -> RoutingState:
    """Run ``module`` on ``tokens`` (training mode, no gradients) and keep what its routing says."""
    module.train()
    with torch.no_grad():
        _, routing = module(tokens, return_routing=True)
    gates = routing.gates[0].detach().to("cpu", torch.float64)  # (N, H)
    selected = routing.selected[0].detach().to("cpu")  # (N, H)
    routed = gates.shape[-1] - settings["shared"]
    return RoutingState(
        module=module,
        tokens=tokens,
        gates=gates,
        selected=selected,
        routed_probs=routing.routed_probs[0].detach().to("cpu", torch.float64),
        load=routing.load.detach().to("cpu", torch.float64),  # (E,) share of tokens per routed head
        target=settings["top_k"] / routed if routed else 0.0,
        loss=float(routing.loss),
        **settings,
    )


def compute_routing(
    n_heads: int = 8,
    shared: int = 2,
    top_k: int = 2,
    temperature: float = 1.0,
    seed: int = 0,
    n_tokens: int = 128,
    dim: int = 32,
    *,
    offset: float = 1.5,
    head_dim: int = 8,
) -> RoutingState:
    """Route ``n_tokens`` random tokens through a freshly initialised MoH layer and read the routing.

    The router's logits are divided by ``temperature`` (its weights are, which is the same thing): a high
    temperature flattens every token's head probabilities, a low one sharpens them.

    Args:
        n_heads: H, the heads of the layer (MoH's ``num_heads``).
        shared: h_s, the heads every token uses (``shared_head``).
        top_k: k, the routed heads each token activates (``routed_head``; 0 exactly when all heads are shared).
        temperature: divides the router logits.
        seed: seeds the tokens and the layer's initialisation (the global RNG is left untouched).
        n_tokens: N, tokens routed (the load is measured over all of them).
        dim: C, the token width.
        offset: length, in standard deviations, of the mean direction shared by all tokens.
        head_dim: D, the width of a head.

    Returns:
        a :class:`RoutingState`.
    """
    where = "compute_routing"
    n_heads, shared, top_k, temperature = _check_settings(n_heads, shared, top_k, temperature, name=where)
    seed = check_int(seed, "seed", name=where, minimum=0)
    n_tokens = check_int(n_tokens, "n_tokens", name=where, minimum=1)
    dim = check_int(dim, "dim", name=where, minimum=1)
    offset = check_number(offset, "offset", name=where)
    head_dim = check_int(head_dim, "head_dim", name=where, minimum=1)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        direction = torch.randn(dim, dtype=torch.float64)
        direction = direction / direction.norm() * dim**0.5  # (C,), the norm of a typical token
        tokens = (offset * direction + torch.randn(n_tokens, dim, dtype=torch.float64)).float()[None]
        module = MoHAttention(dim, num_heads=n_heads, shared_head=shared, routed_head=top_k, head_dim=head_dim)
    with torch.no_grad():
        for weight in _router_parameters(module):
            weight.div_(temperature)
    return _read_routing(
        module, tokens, n_heads=n_heads, shared=shared, top_k=top_k, temperature=float(temperature), seed=seed
    )


def train_router(
    state_or_module: RoutingState | nn.Module,
    steps: int = 30,
    lr: float = 0.01,
    *,
    tokens: torch.Tensor | None = None,
) -> RouterTraining:
    """Train only the router, with the load-balancing loss alone, and record loss and load at every step.

    The attention weights (``qkv``, ``proj``, norms) are frozen; the router layers (``wg``, ``wg_0``,
    ``wg_1``) are handed to Adam for ``steps`` steps on the loss the layer's router reports
    (``module.route``: the router its forward runs, without the attention, on which this loss does not
    depend). The loss depends on ``wg`` (W_r) alone, so in practice only ``wg`` moves. The input is never
    modified: a copy of the module is trained.

    Args:
        state_or_module: a :class:`RoutingState`, or an :class:`attnbook.MoHAttention` with ``tokens``.
        steps: optimiser steps (0 just measures).
        lr: Adam's learning rate.
        tokens: (B, N, C) the tokens to route, when a module is given.

    Returns:
        a :class:`RouterTraining` whose ``state`` is the routing after the last step.
    """
    where = "train_router"
    steps = check_int(steps, "steps", name=where, minimum=0)
    lr = check_number(lr, "lr", name=where, minimum=0.0, strict_minimum=True)
    kinds = (RoutingState, MoHAttention)
    check_instance(state_or_module, "state_or_module", kinds, name=where, what="a RoutingState or an MoHAttention")
    if isinstance(state_or_module, RoutingState):
        why = " (its tokens are used)"
        check_not_both(state_or_module, tokens, "a RoutingState", "tokens", name=where, why=why)
        state = state_or_module
        module, tokens = _clone(state.module), state.tokens
        settings = dict(
            n_heads=state.n_heads,
            shared=state.shared,
            top_k=state.top_k,
            temperature=state.temperature,
            seed=state.seed,
        )
        start = state.step
    else:
        check_instance(tokens, "tokens", torch.Tensor, name=where, what="a (B, N, C) tensor with a module")
        check_tensor(tokens, "tokens", name=where, dims=3, layout="(B, N, C)")
        module = _clone(state_or_module)
        settings = dict(
            n_heads=module.num_heads, shared=module.shared_head, top_k=module.routed_head, temperature=1.0, seed=-1
        )  # the module's own router, as it is
        start = 0
    check_moh_routed(settings["n_heads"], settings["shared"], name=where, why=" to have a router to train")

    router = _router_parameters(module)
    trainable = {name: p.requires_grad for name, p in module.named_parameters()}
    for p in module.parameters():
        p.requires_grad_(False)
    for p in router:
        p.requires_grad_(True)
    optimiser = torch.optim.Adam(router, lr=lr)
    losses, loads = [], []
    module.train()
    for _ in range(steps):
        routing = module.route(tokens)  # the layer's own router; the attention is not needed here
        loss = routing.loss
        losses.append(float(loss.detach()))
        loads.append(routing.load.detach().to("cpu", torch.float64))
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
    for name, p in module.named_parameters():
        p.requires_grad_(trainable[name])
    final = replace(_read_routing(module, tokens, **settings), step=start + steps)
    losses.append(final.loss)
    loads.append(final.load)
    loads_np = torch.stack(loads).cpu().numpy()
    return RouterTraining(
        losses=np.asarray(losses),
        loads=loads_np,
        imbalances=np.asarray([load_imbalance(row, settings["top_k"]) for row in loads_np]),
        target=final.target,
        top_k=settings["top_k"],
        state=final,
    )


# ----------------------------------------------------------------------------------------------- views


class _Figure(Figure):
    """A Figure that shows itself as a PNG in IPython, with or without pyplot's inline backend.

    The views build figures without pyplot, so nothing accumulates in pyplot's registry and nothing needs
    closing; ``_repr_png_`` is what lets ``display(fig)`` in a notebook draw them.
    """

    def _repr_png_(self) -> bytes:
        return figure_to_png(self, dpi=DPI)


# Heads are shared or routed; the routed ones carry MoH's colour of attnbook.viz.style, shared ones a grey.
_SHARED_COLOUR = "#7f7f7f"
_ROUTED_COLOUR = colour("moh")
_SELECTION_COLOURS = ListedColormap(["#f2f2f2", _SHARED_COLOUR, _ROUTED_COLOUR])  # off, shared, routed + chosen


def _head_labels(n_heads: int, shared: int) -> list[str]:
    return [f"s{h}" for h in range(shared)] + [f"r{h}" for h in range(n_heads - shared)]


def _head_ticks(ax, n_heads: int, labels: list[str]) -> None:
    ax.set_xticks(range(n_heads), labels, rotation=90 if n_heads > 8 else 0)


def plot_routing(
    state: RoutingState,
    history: RouterTraining | None = None,
    *,
    max_tokens: int = 24,
    next_steps: int | None = None,
) -> Figure:
    """Draw a routing: gates (token x head), the heads each token activates, the per-head load, and the
    router's training so far (loss and load imbalance against router steps).

    Four panels on two rows, :data:`~attnbook.viz.style.PAGE_WIDTH` wide, text of at least
    :data:`~attnbook.viz.style.MIN_FONT` points; the layout is the same with or without ``history`` (without
    it, the training panel shows the untrained router as step 0), so a widget's image keeps its size while
    the router trains. The legends sit outside the plotting areas: they never cover a curve. The title carries
    the settings and the load-balancing loss. Only the first ``max_tokens`` tokens are drawn in the two
    matrices; the load and the loss are over all tokens.

    Args:
        state: the routing to draw.
        history: the training that led to ``state`` (from :func:`train_router`, chained with ``then``).
        max_tokens: tokens drawn in the two matrices.
        next_steps: if given, the training panel also marks the steps the next "train router" click adds.

    Returns:
        a matplotlib ``Figure`` (not registered with pyplot, so nothing needs closing).
    """
    where = "plot_routing"
    check_instance(state, "state", RoutingState, name=where, what="a RoutingState")
    check_instance(history, "history", (RouterTraining, type(None)), name=where, what="a RouterTraining or None")
    max_tokens = check_int(max_tokens, "max_tokens", name=where, minimum=1)
    if next_steps is not None:
        next_steps = check_int(next_steps, "next_steps", name=where, minimum=1)
    with book_style():
        fig = _Figure(figsize=(PAGE_WIDTH, 6.6))
        # Fixed margins rather than a layout engine: drawing stays cheap (the website pre-renders frames).
        grid = fig.add_gridspec(
            2, 2, left=0.09, right=0.91, bottom=0.2, top=0.87, wspace=0.42, hspace=0.62, width_ratios=[1.1, 1.0]
        )
        axes = [fig.add_subplot(grid[r, c]) for r in range(2) for c in range(2)]
        _draw_routing(fig, axes, state, history, max_tokens, next_steps)
    return fig


def _draw_routing(fig, axes, state, history, max_tokens, next_steps) -> None:
    H, S = state.n_heads, state.shared
    labels = _head_labels(H, S)
    shown = min(max_tokens, state.gates.shape[0])

    ax = axes[0]
    image = ax.imshow(state.gates[:shown].numpy(), cmap="viridis", vmin=0.0, aspect="auto", interpolation="nearest")
    fig.colorbar(image, ax=ax, fraction=0.06, pad=0.03)
    ax.set_title("gate $g_{t,h}$ of token t for head h", fontsize=10)
    ax.set_ylabel(f"token t (first {shown} of {state.gates.shape[0]})")

    ax = axes[1]
    code = state.selected[:shown].to(torch.int64).numpy().copy()
    code[:, S:] *= 2  # 0 off, 1 shared, 2 routed and chosen
    ax.imshow(code, cmap=_SELECTION_COLOURS, vmin=0, vmax=2, aspect="auto", interpolation="nearest")
    ax.set_title("heads each token activates", fontsize=10)
    ax.set_yticks([])
    for ax, separator in zip(axes[:2], ("white", "#333333"), strict=True):
        _head_ticks(ax, H, labels)
        ax.set_xlabel("head (s = shared, r = routed)")
        if 0 < S < H:
            ax.axvline(S - 0.5, color=separator, lw=1.5)

    ax = axes[2]
    shared_load = np.ones(S)
    colours = [_SHARED_COLOUR] * S + [_ROUTED_COLOUR] * (H - S)
    ax.bar(range(H), np.concatenate([shared_load, state.load.numpy()]), color=colours)
    if H > S:
        ax.hlines(state.target, S - 0.45, H - 0.55, colors="black", linestyles="--")
    ax.set_ylim(0, 1.15)
    _head_ticks(ax, H, labels)
    ax.set_xlabel("head (s = shared, r = routed)")
    ax.set_ylabel("share of tokens using it")
    ax.set_title(
        f"load (dashed: balanced k/E = {state.target:.2f})" if H > S else "load (every head is shared)", fontsize=10
    )

    ax = axes[3]
    if history is None:  # the untrained router: step 0 only
        losses, imbalances, top_k = np.array([state.loss]), np.array([state.imbalance]), state.top_k
    else:
        losses, imbalances, top_k = history.losses, history.imbalances, history.top_k
    steps = np.arange(len(losses))
    last = int(steps[-1])
    ax.plot(steps, losses, color="black", marker="o" if len(steps) == 1 else None, label="loss (left axis)")
    if state.routed:
        ax.axhline(top_k, color="black", ls=":", lw=1, label=f"balanced loss = k = {top_k}")
    twin = ax.twinx()
    twin.plot(
        steps,
        imbalances,
        color=_ROUTED_COLOUR,
        marker="o" if len(steps) == 1 else None,
        label="load imbalance (right axis)",
    )
    twin.set_ylim(0, max(0.05, 1.1 * float(np.max(imbalances))))
    twin.set_ylabel("load imbalance", color=_ROUTED_COLOUR)
    twin.tick_params(axis="y", colors=_ROUTED_COLOUR)
    handles = ax.get_lines() + twin.get_lines()
    if next_steps is not None and state.routed:
        handles.append(
            ax.axvspan(last, last + next_steps, color="#dddddd", zorder=0, label=f"next click: +{next_steps} steps")
        )
    ax.set_xlim(0, max(last + (next_steps or 0), 1))
    low, high = float(np.min(losses)), float(np.max(losses))
    pad = max(0.05 * (high - low), 0.02 * max(abs(high), 1.0))
    ax.set_ylim(min(low, top_k) - pad, max(high, top_k) + pad)
    ax.set_xlabel("router step")
    ax.set_ylabel("load-balancing loss")
    ax.set_title("training the router" if state.routed else "no router to train", fontsize=10)
    # below the axes and their label: a legend there cannot cover a curve
    ax.legend(
        handles=handles,
        loc="upper left",
        bbox_to_anchor=(-0.62, -0.3),
        ncol=2,
        frameon=False,
        borderaxespad=0.0,
        handlelength=1.6,
    )

    routed = f"h_r = {state.top_k} of {state.routed} routed" if state.routed else "no routed heads"
    fig.suptitle(
        f"H = {H}: {S} shared, {routed}, temperature {state.temperature:g}, step {state.step}\n"
        f"load-balancing loss {state.loss:.3f}, load imbalance {state.imbalance:.0%}",
        fontsize=11,
    )


def default_figure() -> Figure:
    """The explorer's default state, as the static figure for the website."""
    return plot_routing(compute_routing())


def training_frames(
    state: RoutingState | None = None, *, clicks: int = 6, steps_per_click: int = 10, lr: float = 0.01
) -> dict[str, Figure]:
    """Figures of ``state`` after 0, 1, ..., ``clicks`` presses of the explorer's train button.

    Each press is a fresh :func:`train_router` call of ``steps_per_click`` steps, exactly as in the live
    explorer. Keys are the total router steps (for :func:`attnbook.viz.frame_slider`).
    """
    where = "training_frames"
    check_instance(state, "state", (RoutingState, type(None)), name=where, what="a RoutingState or None")
    clicks = check_int(clicks, "clicks", name=where, minimum=0)
    steps_per_click = check_int(steps_per_click, "steps_per_click", name=where, minimum=1)
    lr = check_number(lr, "lr", name=where, minimum=0.0, strict_minimum=True)
    state = compute_routing() if state is None else state
    frames = {"0": plot_routing(state)}
    history = None
    for _ in range(clicks):
        run = train_router(state, steps_per_click, lr)
        history = run if history is None else history.then(run)
        state = run.state
        frames[str(state.step)] = plot_routing(state, history)
    return frames


# ------------------------------------------------------------------------------------------- explorer


class RoutingExplorer(widgets.VBox):
    """The box :func:`routing_explorer` returns; its ``explorer`` attribute holds the state and controls."""

    explorer: _Explorer


class _Explorer:
    """The state and the callbacks behind :func:`routing_explorer` (kept off the widget itself)."""

    def __init__(self, n_tokens: int, dim: int, steps_per_click: int, lr: float):
        w = widgets
        style = {"description_width": "initial"}
        self.n_tokens, self.dim, self.lr = n_tokens, dim, lr
        self.heads = w.IntSlider(value=8, min=2, max=12, description="heads H", style=style, continuous_update=False)
        self.shared = w.IntSlider(value=2, min=0, max=8, description="shared h_s", style=style, continuous_update=False)
        self.top_k = w.IntSlider(value=2, min=1, max=6, description="routed h_r", style=style, continuous_update=False)
        self.temperature = w.FloatLogSlider(
            value=1.0,
            base=10,
            min=-1,
            max=1,
            step=0.1,
            description="router temperature",
            style=style,
            continuous_update=False,
        )
        self.seed = w.IntSlider(value=0, min=0, max=9, description="seed", style=style, continuous_update=False)
        self.steps = w.IntSlider(
            value=steps_per_click,
            min=1,
            max=max(100, steps_per_click),
            description="steps per click",
            style=style,
            continuous_update=False,
        )
        self.train = w.Button(
            description="train router",
            button_style="primary",
            tooltip="Adam steps on the router with the load-balancing loss alone",
        )
        self.reset = w.Button(description="reset router", tooltip="back to the initial router")
        self.status = w.HTML(value="")
        # PNG bytes in an Image widget: an Output widget stays empty in the classic notebook with ipywidgets 7.7.1
        self.image = w.Image(
            format="png", value=b"", layout=w.Layout(width=f"{PAGE_WIDTH * DPI:.0f}px", max_width="100%")
        )
        self.renders = 0
        self.state: RoutingState | None = None
        self.history: RouterTraining | None = None
        self.inactive: dict[str, str] = {}
        self._adjusting = False
        self.column_left = w.VBox([self.heads, self.shared, self.top_k])  # holds the re-ranged sliders
        self.layout = [
            w.HBox([self.column_left, w.VBox([self.temperature, self.seed, self.steps])]),
            w.HBox([self.train, self.reset]),
            self.status,
            self.image,
        ]
        for control in (self.heads, self.shared, self.top_k, self.temperature, self.seed):
            control.observe(self._on_setting, names="value")
        self.steps.observe(self._on_steps, names="value")
        self.train.on_click(self._on_train)
        self.reset.on_click(self._on_reset)
        self._recompute()

    @property
    def controls(self) -> dict[str, widgets.DOMWidget]:
        return {
            "heads": self.heads,
            "shared": self.shared,
            "top_k": self.top_k,
            "temperature": self.temperature,
            "seed": self.seed,
            "steps": self.steps,
            "train": self.train,
            "reset": self.reset,
        }

    def _set_bounds(self, name: str, lo: int, hi: int) -> None:
        """Re-range the slider ``name`` (a new slider when the range changes: ipywidgets 8's End key)."""
        old = getattr(self, name)
        new = set_slider_range(old, lo, hi, container=self.column_left)
        if new is not old:
            new.observe(self._on_setting, names="value")
            setattr(self, name, new)

    def _on_setting(self, change) -> None:
        if self._adjusting:
            return
        self._adjusting = True
        try:
            H = self.heads.value
            self._set_bounds("shared", 0, H)
            routed = H - self.shared.value
            self._set_bounds("top_k", 1 if routed else 0, routed)
        finally:
            self._adjusting = False
        self._recompute()

    def _on_steps(self, change) -> None:
        self.render()  # the training panel marks the steps the next click adds

    def _recompute(self) -> None:
        self.state = compute_routing(
            self.heads.value,
            self.shared.value,
            self.top_k.value,
            self.temperature.value,
            self.seed.value,
            self.n_tokens,
            self.dim,
        )
        self.history = None
        self.render()

    def _on_reset(self, _button) -> None:
        self._recompute()

    def _on_train(self, _button) -> None:
        if self.state is None or self.state.routed == 0:
            return
        run = train_router(self.state, self.steps.value, self.lr)
        self.history = run if self.history is None else self.history.then(run)
        self.state = run.state
        self.render()

    def inactive_controls(self) -> dict[str, str]:
        """The controls that cannot act in the current state, each with the reason (shown under the controls)."""
        s = self.state
        out = {}
        if s.routed == 0:
            why = f"all {s.n_heads} heads are shared (h_s = H): there is no routed head, so nothing to route or train"
            out["top_k"] = out["steps"] = out["train"] = why
        elif s.routed == 1:
            out["top_k"] = "there is one routed head (H − h_s = 1), so h_r can only be 1"
        if s.step == 0:
            out["reset"] = "the router is untrained (step 0): there is nothing to reset"
        return out

    def render(self) -> None:
        s = self.state
        self.inactive = self.inactive_controls()
        for name, control in self.controls.items():
            control.disabled = name in self.inactive
        fig = plot_routing(s, self.history, next_steps=self.steps.value if s.routed else None)
        self.image.value = figure_to_png(fig, dpi=DPI, tight=False)  # fixed layout: one draw, no crop
        note = "" if s.routed else " (all heads shared: plain multi-head attention, nothing to route)"
        greyed = "".join(
            f"<br>⊘ <b>{self.controls[name].description}</b> is greyed out: {reason}."
            for name, reason in self.inactive.items()
        )
        self.status.value = (
            f"<div style='font-family:sans-serif;font-size:0.9em;line-height:1.4'>"
            f"loss <b>{s.loss:.4f}</b> (balanced value k = {s.top_k}), "
            f"load imbalance <b>{s.imbalance:.1%}</b>, router step {s.step}{note}{greyed}</div>"
        )
        self.renders += 1


def routing_explorer(*, n_tokens: int = 128, dim: int = 32, steps_per_click: int = 10, lr: float = 0.01):
    """The live head-routing explorer: an ipywidgets ``VBox`` of controls, a status line and the figure.

    Controls: heads, shared heads h_s, routed heads per token h_r, router temperature, seed; "train router" runs
    ``steps_per_click`` router steps (:func:`train_router`) and redraws, "reset router" goes back to the
    initial router. The figure is :func:`plot_routing` drawn as PNG bytes into an ``Image`` widget, which
    renders in every supported front-end (JupyterLab 4, Notebook 7, the classic notebook with ipywidgets
    7.7.1 as on Colab). The ranges of "shared" and "routed h_r" follow "heads"; controls that cannot act in the
    current state are disabled and the status line says why. The object behind it is the box's ``explorer``
    attribute (its ``state``, ``history`` and controls), which is how the tests drive it.
    """
    where = "routing_explorer"
    n_tokens = check_int(n_tokens, "n_tokens", name=where, minimum=1)
    dim = check_int(dim, "dim", name=where, minimum=1)
    steps_per_click = check_int(steps_per_click, "steps_per_click", name=where, minimum=1)
    lr = check_number(lr, "lr", name=where, minimum=0.0, strict_minimum=True)
    ex = _Explorer(n_tokens, dim, steps_per_click, lr)
    enable_slider_keys()  # Notebook 7: the arrow keys would select cells instead of moving the sliders
    box = RoutingExplorer(children=ex.layout)
    box.explorer = ex
    return box


# ------------------------------------------------------------------------------ quality against heads used


def fraction_curve(source) -> tuple[list[tuple[float, float, float, float]], tuple[float, float, float] | None]:
    """``(rows, softmax)`` of a MoH study: one ``(fraction of heads active, mean, low, high)`` row per MoH
    split, in the study's order, and plain multi-head softmax's ``(mean, low, high)`` (None if not run).

    ``source`` is a :class:`attnbook.lab.claims.MoHStudy` (a live run) or its recording as parsed JSON
    (``benchmarks/results/claims/moh_cpu_recorded.json``: its ``"curve"`` and ``"softmax"`` rows); accuracy is
    summarised over the seeds (mean and range).
    """
    name = "fraction_curve"
    if isinstance(source, dict):
        check_found([k for k in ("curve", "softmax") if k in source], "source", name=name,
                    expected="hold 'curve' and 'softmax' (a MoH study's recording)", got=f"keys {sorted(source)}",
                    minimum=2)  # fmt: skip
        stats = ("mean", "low", "high")
        rows = [(float(r["fraction"]), *(float(r["accuracy"][k]) for k in stats)) for r in source["curve"]]
        soft = source["softmax"]
        softmax = None if soft is None else tuple(float(soft["accuracy"][k]) for k in stats)
        return rows, softmax
    what = "a MoHStudy (attnbook.lab.claims.moh_study) or its recording (a dict)"
    check_found([a for a in ("curve", "comparison") if hasattr(source, a)], "source", name=name, expected=f"be {what}",
                got=type(source).__name__, minimum=2)  # fmt: skip
    rows = [(float(f), s.mean, s.low, s.high) for f, s in source.curve()]
    softmax = None
    if "softmax" in source.comparison.runs:
        s = source.comparison.summary("softmax")
        softmax = (s.mean, s.low, s.high)
    return rows, softmax


def fraction_figure(
    curves: dict[str, list[tuple[float, float, float, float]]],
    *,
    softmax: tuple[float, float, float] | None = None,
    chance: float | None = None,
    claim: tuple[float, float] | None = (0.5, 0.9),
    ylabel: str = "held-out accuracy",
) -> Figure:
    """Quality against the fraction of heads each token activates, at the book's page width.

    ``curves``: label -> rows ``(fraction, mean, low, high)`` (:func:`fraction_curve`), drawn in MoH's colour
    with the range over seeds as error bars; the first curve solid with round markers, the others thinner
    with square ones (a live run beside its recording). ``softmax`` (mean, low, high) is plain multi-head
    attention with every head, a horizontal band; ``chance`` a grey dotted line; ``claim`` shades the range
    of fractions at which the paper claims multi-head quality (None: no shading).

    Returns:
        the Figure.
    """
    name = "fraction_figure"
    check_count(curves, "curves", name=name, item="curve")
    fig = _Figure(figsize=(PAGE_WIDTH, 4.4))
    with book_style():
        ax = fig.subplots()
        if claim is not None:
            lo, hi = (check_number(x, "claim", name=name, minimum=0.0, maximum=1.0) for x in claim)
            ax.axvspan(lo, hi, color="0.9", zorder=0, label=f"the paper's claim: {lo:.0%}-{hi:.0%} of the heads")
        if softmax is not None:
            mean, low, high = (check_number(x, "softmax", name=name) for x in softmax)
            ax.axhspan(low, high, color=colour("softmax"), alpha=0.25, lw=0)
            ax.axhline(mean, color=colour("softmax"), lw=1.2, label="multi-head softmax, every head")
        if chance is not None:
            chance = check_number(chance, "chance", name=name, minimum=0.0, maximum=1.0)
            ax.axhline(chance, color="grey", ls=":", lw=1.0, label="chance")
        for i, (label, rows) in enumerate(curves.items()):
            check_count(rows, f"curves[{label!r}]", name=name, item="row")
            f, mean, low, high = (np.array(col, dtype=float) for col in zip(*rows, strict=True))
            err = np.stack([mean - low, high - mean])
            ax.errorbar(f, mean, yerr=err, color=colour("moh"), marker="o" if i == 0 else "s", capsize=3,
                        lw=1.6 if i == 0 else 1.0, alpha=1.0 if i == 0 else 0.7, label=label)  # fmt: skip
        ax.set_xlabel("fraction of the heads each token activates")
        ax.set_ylabel(ylabel)
        ax.set_xlim(0.0, 1.05)
        ax.set_ylim(0.0, 1.05)
        ax.xaxis.set_major_formatter(lambda x, _: f"{x:.0%}")
        ax.grid(True, alpha=0.3)
        # the legend below the panel, so that it covers no point
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), ncols=2, frameon=False)
        fig.subplots_adjust(left=0.1, right=0.97, top=0.96, bottom=0.4)
    return fig
