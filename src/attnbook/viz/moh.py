"""The head-routing explorer for chapter 5: mixture-of-head attention (MoH; Jin et al., "MoH: Multi-Head
Attention as Mixture-of-Head Attention", arXiv 2410.11842).

A small :class:`attnbook.MoHAttention` routes a batch of tokens to its heads. :func:`compute_routing` reads the
routing from its forward pass (``return_routing=True``) and :func:`train_router` trains the router alone with
the load-balancing loss; :func:`plot_routing` draws a routing, :func:`routing_explorer` explores it live and
:func:`training_frames` shows it on the website. :func:`fraction_figure` draws quality against the fraction
of heads each token activates (the MoH paper's claim). The tokens are Gaussian around a shared mean direction
(``offset``), as real token embeddings tend to be: it gives a fresh router a preference for a few heads, the
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
from .static import Explorer, figure_to_png, slider, status_html
from .style import DPI, PAGE_WIDTH, book_style, colour

__all__ = ["RoutingState", "RouterTraining", "compute_routing", "load_imbalance", "train_router", "plot_routing"]
__all__ += ["default_figure", "training_frames", "routing_explorer", "RoutingExplorer", "fraction_curve"]
__all__ += ["fraction_figure", "fewer_heads_curve"]

_ROUTER_LAYERS = ("wg", "wg_0", "wg_1")  # MoH's router: routed heads, shared-vs-routed split, shared heads
_SETTINGS = ("n_heads", "shared", "top_k", "temperature", "seed")  # of a RoutingState, as compute_routing takes them
_RECORDED = ("losses", "loads", "imbalances")  # what RouterTraining records at every step


@dataclass(frozen=True)
class RoutingState:
    """One routing of ``tokens`` by ``module``: CPU float64 copies of the :class:`attnbook.HeadRouting` its
    forward pass returns, nothing recomputed. The per-token matrices are the first sequence's; load and loss
    are over all tokens."""

    module: nn.Module  # the attnbook.MoHAttention that routed the tokens (in training mode)
    tokens: torch.Tensor  # (1, N, C) the routed tokens
    n_heads: int  # n_heads, shared, top_k, temperature, seed: the settings it was built with
    shared: int
    top_k: int
    temperature: float
    seed: int
    gates: torch.Tensor  # (N, H) the weight of every head for every token (0 for heads a token does not use)
    selected: torch.Tensor  # (N, H) bool, the heads each token activates (shared heads always)
    routed_probs: torch.Tensor  # (N, E) the router's softmax over the E = H - shared routed heads
    load: torch.Tensor  # (E,) fraction of the tokens that activate each routed head; sums to top_k
    target: float  # the balanced load top_k / E (every routed head equally busy)
    loss: float  # the load-balancing loss of this routing (0 when there are no routed heads)
    step: int = 0  # router optimiser steps taken since compute_routing

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
    """What :func:`train_router` recorded: index 0 is before the first step, index s after step s."""

    losses: np.ndarray  # (S + 1,) the load-balancing loss
    loads: np.ndarray  # (S + 1, E) the load of every routed head
    imbalances: np.ndarray  # (S + 1,) load_imbalance of each load
    target: float  # the balanced load top_k / E
    top_k: int  # k, the balanced value of the loss
    state: RoutingState  # the routing after the last step

    @property
    def steps(self) -> int:
        return len(self.losses) - 1

    def then(self, later: RouterTraining) -> RouterTraining:
        """This training followed by ``later`` (which must start where this one ended)."""
        joined = (np.concatenate([getattr(self, name), getattr(later, name)[1:]]) for name in _RECORDED)
        return RouterTraining(*joined, later.target, later.top_k, later.state)


def load_imbalance(load, top_k: int) -> float:
    """The fraction of all head choices that would have to move to another head to balance the load.

    ``sum_e max(load_e - k/E, 0) / k`` of ``load`` (E,), the share of tokens that chose each routed head (a
    tensor or numbers >= 0; empty for a layer without routed heads: 0), and ``top_k`` = k in 1..E (0 when E = 0):
    0 when every routed head is chosen by the same share of tokens, 1 - k/E when all tokens choose the same k.
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
    return float((load - top_k / E).clamp_min(0).sum() / top_k)


def _clone(module: nn.Module) -> nn.Module:
    """A deep copy of ``module`` without the tensors attached to an autograd graph (a training forward leaves
    its loss on the layer, which ``copy.deepcopy`` refuses to copy; the copy's next forward sets it again)."""
    values = (value for m in module.modules() for value in vars(m).values())
    return copy.deepcopy(module, {id(v): None for v in values if isinstance(v, torch.Tensor) and not v.is_leaf})


def _router_parameters(module: nn.Module) -> list[nn.Parameter]:
    return [getattr(module, name).weight for name in _ROUTER_LAYERS if hasattr(module, name)]


def _read_routing(module: nn.Module, tokens: torch.Tensor, **settings) -> RoutingState:
    """Run ``module`` on ``tokens`` (training mode, no gradients) and keep what its routing says."""
    module.train()
    with torch.no_grad():
        _, routing = module(tokens, return_routing=True)
    gates = routing.gates[0].detach().to("cpu", torch.float64)  # (N, H)
    routed = gates.shape[-1] - settings["shared"]
    return RoutingState(
        module=module,
        tokens=tokens,
        gates=gates,
        selected=routing.selected[0].detach().to("cpu"),  # (N, H)
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
    """Route ``n_tokens`` random tokens (width ``dim``) through a fresh MoH layer and read the routing.

    ``n_heads``, ``shared`` and ``top_k`` are MoH's ``num_heads``, ``shared_head`` and ``routed_head`` (top_k is 0
    exactly when all heads are shared); the router's logits are divided by ``temperature`` (a high one flattens
    every token's head probabilities); ``seed`` seeds tokens and layer, leaving the global RNG alone; ``offset``
    is the length, in standard deviations, of the mean direction shared by all tokens.
    """
    where = "compute_routing"
    # MoH's own head rules (those MoHAttention applies), naming its arguments
    rules = f"{where} (n_heads, shared, top_k are MoH's num_heads, shared_head, routed_head)"
    n_heads, shared, top_k = check_moh_heads(n_heads, shared, top_k, name=rules)
    temperature = check_number(temperature, "temperature", name=where, minimum=0.0, strict_minimum=True)
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
    settings = dict(n_heads=n_heads, shared=shared, top_k=top_k, temperature=float(temperature), seed=seed)
    return _read_routing(module, tokens, **settings)


def train_router(
    state_or_module: RoutingState | nn.Module, steps: int = 30, lr: float = 0.01, *, tokens: torch.Tensor | None = None
) -> RouterTraining:
    """Train only the router of a copy of a :class:`RoutingState`'s module (or of an :class:`attnbook.MoHAttention`
    given with its ``tokens``, (B, N, C)), with the load-balancing loss alone; record loss and load at every step.

    The attention weights are frozen; the router layers (``wg``, ``wg_0``, ``wg_1``) get ``steps`` Adam steps at
    learning rate ``lr`` on the loss of ``module.route`` (the router its forward runs, without the attention).
    That loss depends on ``wg`` alone, so only ``wg`` moves. Returns a :class:`RouterTraining`.
    """
    where = "train_router"
    steps = check_int(steps, "steps", name=where, minimum=0)
    lr = check_number(lr, "lr", name=where, minimum=0.0, strict_minimum=True)
    kinds = (RoutingState, MoHAttention)
    check_instance(state_or_module, "state_or_module", kinds, name=where, what="a RoutingState or an MoHAttention")
    if isinstance(state_or_module, RoutingState):
        check_not_both(state_or_module, tokens, "a RoutingState", "tokens", name=where, why=" (its tokens are used)")
        state = state_or_module
        module, tokens, start = _clone(state.module), state.tokens, state.step
        settings = {name: getattr(state, name) for name in _SETTINGS}
    else:
        check_instance(tokens, "tokens", torch.Tensor, name=where, what="a (B, N, C) tensor with a module")
        check_tensor(tokens, "tokens", name=where, dims=3, layout="(B, N, C)")
        module, start = _clone(state_or_module), 0
        settings = dict(n_heads=module.num_heads, shared=module.shared_head, top_k=module.routed_head)
        settings.update(temperature=1.0, seed=-1)  # the module's own router, as it is
    check_moh_routed(settings["n_heads"], settings["shared"], name=where, why=" to have a router to train")

    router = _router_parameters(module)
    trainable = {name: p.requires_grad for name, p in module.named_parameters()}
    for p in module.parameters():
        p.requires_grad_(any(p is r for r in router))
    optimiser = torch.optim.Adam(router, lr=lr)
    losses, loads = [], []
    module.train()
    for _ in range(steps):
        routing = module.route(tokens)  # the layer's own router; the attention is not needed here
        losses.append(float(routing.loss.detach()))
        loads.append(routing.load.detach().to("cpu", torch.float64))
        optimiser.zero_grad()
        routing.loss.backward()
        optimiser.step()
    for name, p in module.named_parameters():
        p.requires_grad_(trainable[name])
    final = replace(_read_routing(module, tokens, **settings), step=start + steps)
    losses.append(final.loss)
    loads.append(final.load)
    loads_np = torch.stack(loads).cpu().numpy()
    imbalances = np.asarray([load_imbalance(row, settings["top_k"]) for row in loads_np])
    return RouterTraining(np.asarray(losses), loads_np, imbalances, final.target, settings["top_k"], final)


class _Figure(Figure):
    """A Figure that shows itself as a PNG in IPython (``display(fig)``) without pyplot: nothing accumulates in
    pyplot's registry and nothing needs closing."""

    def _repr_png_(self) -> bytes:
        return figure_to_png(self, dpi=DPI)


# Heads are shared or routed; the routed ones carry MoH's colour of attnbook.viz.style, shared ones a grey.
_SHARED_COLOUR = "#7f7f7f"
_ROUTED_COLOUR = colour("moh")
_SELECTION_COLOURS = ListedColormap(["#f2f2f2", _SHARED_COLOUR, _ROUTED_COLOUR])  # off, shared, routed + chosen


def plot_routing(
    state: RoutingState, history: RouterTraining | None = None, *, max_tokens: int = 24, next_steps: int | None = None
) -> Figure:
    """Draw a routing: gates (token x head) and the heads each token activates (its first ``max_tokens``
    tokens), the load of each head, and the router's training so far (``history``, from :func:`train_router`
    chained with ``then``: loss and load imbalance against router steps; ``next_steps`` marks what the next
    click adds). The layout is the same with or without ``history``, so a widget's image keeps its size; the
    legends sit outside the panels. Returns a page-wide ``Figure`` that needs no closing.
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
        grid = fig.add_gridspec(2, 2, left=0.09, right=0.91, bottom=0.2, top=0.87, wspace=0.42, hspace=0.62,
                                width_ratios=[1.1, 1.0])  # fmt: skip
        axes = [fig.add_subplot(grid[r, c]) for r in range(2) for c in range(2)]
        _draw_routing(fig, axes, state, history, max_tokens, next_steps)
    return fig


def _draw_routing(fig, axes, state, history, max_tokens, next_steps) -> None:
    H, S = state.n_heads, state.shared
    labels = [f"s{h}" for h in range(S)] + [f"r{h}" for h in range(H - S)]
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

    ax = axes[2]
    colours = [_SHARED_COLOUR] * S + [_ROUTED_COLOUR] * (H - S)
    ax.bar(range(H), np.concatenate([np.ones(S), state.load.numpy()]), color=colours)
    if H > S:
        ax.hlines(state.target, S - 0.45, H - 0.55, colors="black", linestyles="--")
    ax.set_ylim(0, 1.15)
    ax.set_ylabel("share of tokens using it")
    load = f"load (dashed: balanced k/E = {state.target:.2f})" if H > S else "load (every head is shared)"
    ax.set_title(load, fontsize=10)
    for ax, separator in zip(axes[:3], ("white", "#333333", None), strict=True):
        ax.set_xticks(range(H), labels, rotation=90 if H > 8 else 0)
        ax.set_xlabel("head (s = shared, r = routed)")
        if separator and 0 < S < H:
            ax.axvline(S - 0.5, color=separator, lw=1.5)

    ax = axes[3]
    if history is None:  # the untrained router: step 0 only
        losses, imbalances, top_k = np.array([state.loss]), np.array([state.imbalance]), state.top_k
    else:
        losses, imbalances, top_k = history.losses, history.imbalances, history.top_k
    steps = np.arange(len(losses))
    last = int(steps[-1])
    marker = "o" if len(steps) == 1 else None
    ax.plot(steps, losses, color="black", marker=marker, label="loss (left axis)")
    if state.routed:
        ax.axhline(top_k, color="black", ls=":", lw=1, label=f"balanced loss = k = {top_k}")
    twin = ax.twinx()
    twin.plot(steps, imbalances, color=_ROUTED_COLOUR, marker=marker, label="load imbalance (right axis)")
    twin.set_ylim(0, max(0.05, 1.1 * float(np.max(imbalances))))
    twin.set_ylabel("load imbalance", color=_ROUTED_COLOUR)
    twin.tick_params(axis="y", colors=_ROUTED_COLOUR)
    handles = ax.get_lines() + twin.get_lines()
    if next_steps is not None and state.routed:
        label = f"next click: +{next_steps} steps"
        handles.append(ax.axvspan(last, last + next_steps, color="#dddddd", zorder=0, label=label))
    ax.set_xlim(0, max(last + (next_steps or 0), 1))
    low, high = float(np.min(losses)), float(np.max(losses))
    pad = max(0.05 * (high - low), 0.02 * max(abs(high), 1.0))
    ax.set_ylim(min(low, top_k) - pad, max(high, top_k) + pad)
    ax.set_xlabel("router step")
    ax.set_ylabel("load-balancing loss")
    ax.set_title("training the router" if state.routed else "no router to train", fontsize=10)
    # below the axes and their label: a legend there cannot cover a curve
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(-0.62, -0.3), ncol=2, frameon=False,
              borderaxespad=0.0, handlelength=1.6)  # fmt: skip

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
    """Figures of ``state`` after 0, 1, ..., ``clicks`` presses of the explorer's train button (each a
    :func:`train_router` call of ``steps_per_click`` steps), keyed by the total steps, for ``frame_slider``."""
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
        history, state = (run if history is None else history.then(run)), run.state
        frames[str(state.step)] = plot_routing(state, history)
    return frames


class RoutingExplorer(widgets.VBox):
    """The box :func:`routing_explorer` returns; its ``explorer`` attribute holds the state and controls."""

    explorer: _RoutingController


class _RoutingController(Explorer):
    """The state and the callbacks behind :func:`routing_explorer` (kept off the widget itself)."""

    def __init__(self, n_tokens: int, dim: int, steps_per_click: int, lr: float):
        w = widgets
        adam = "Adam steps on the router with the load-balancing loss alone"
        controls = {
            "heads": slider(w.IntSlider, "heads H", 8, 2, 12),
            "shared": slider(w.IntSlider, "shared h_s", 2, 0, 8),
            "top_k": slider(w.IntSlider, "routed h_r", 2, 1, 6),
            "temperature": slider(w.FloatLogSlider, "router temperature", 1.0, -1, 1, base=10, step=0.1),
            "seed": slider(w.IntSlider, "seed", 0, 0, 9),
            "steps": slider(w.IntSlider, "steps per click", steps_per_click, 1, max(100, steps_per_click)),
            "train": w.Button(description="train router", button_style="primary", tooltip=adam),
            "reset": w.Button(description="reset router", tooltip="back to the initial router"),
        }
        super().__init__(controls)
        self.n_tokens, self.dim, self.lr = n_tokens, dim, lr
        self.state: RoutingState | None = None
        self.history: RouterTraining | None = None
        c = controls
        self.column_left = w.VBox([c["heads"], c["shared"], c["top_k"]])  # holds the re-ranged sliders
        settings = w.HBox([self.column_left, w.VBox([c["temperature"], c["seed"], c["steps"]])])
        self.layout = [settings, w.HBox([c["train"], c["reset"]]), self.status, self.image]
        for name in ("heads", "shared", "top_k", "temperature", "seed"):
            c[name].observe(self._on_setting, names="value")
        c["steps"].observe(lambda change: self.render(), names="value")  # the training panel marks the next click
        c["train"].on_click(self._on_train)
        c["reset"].on_click(lambda button: self._recompute())
        self._recompute()

    def _on_setting(self, change) -> None:
        if self.busy:
            return
        self.busy = True
        try:  # the ranges of "shared" and "routed h_r" follow "heads"
            self.rerange("shared", 0, self.heads.value, self.column_left, self._on_setting)
            routed = self.heads.value - self.shared.value
            self.rerange("top_k", 1 if routed else 0, routed, self.column_left, self._on_setting)
        finally:
            self.busy = False
        self._recompute()

    def _recompute(self) -> None:
        settings = [self.controls[name].value for name in ("heads", "shared", "top_k", "temperature", "seed")]
        self.state = compute_routing(*settings, self.n_tokens, self.dim)
        self.history = None
        self.render()

    def _on_train(self, _button) -> None:
        if self.state is None or self.state.routed == 0:
            return
        run = train_router(self.state, self.steps.value, self.lr)
        self.history, self.state = (run if self.history is None else self.history.then(run)), run.state
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
        fig = plot_routing(s, self.history, next_steps=self.steps.value if s.routed else None)
        note = "" if s.routed else " (all heads shared: plain multi-head attention, nothing to route)"
        text = (
            f"loss <b>{s.loss:.4f}</b> (balanced value k = {s.top_k}), "
            f"load imbalance <b>{s.imbalance:.1%}</b>, router step {s.step}{note}"
        )
        inactive = self.inactive_controls()
        labels = {name: control.description for name, control in self.controls.items()}
        self.show(fig, inactive, status_html(text, inactive, labels))


def routing_explorer(*, n_tokens: int = 128, dim: int = 32, steps_per_click: int = 10, lr: float = 0.01):
    """The live head-routing explorer (:class:`attnbook.viz.static.Explorer`): sliders for H, h_s, h_r, the
    router temperature and the seed, "train router" (``steps_per_click`` steps of :func:`train_router`) and
    "reset router", a status line and :func:`plot_routing`. The ranges of h_s and h_r follow H; controls that
    cannot act are disabled, and the status line says why. The box's ``explorer`` holds state and controls.
    """
    where = "routing_explorer"
    n_tokens = check_int(n_tokens, "n_tokens", name=where, minimum=1)
    dim = check_int(dim, "dim", name=where, minimum=1)
    steps_per_click = check_int(steps_per_click, "steps_per_click", name=where, minimum=1)
    lr = check_number(lr, "lr", name=where, minimum=0.0, strict_minimum=True)
    return _RoutingController(n_tokens, dim, steps_per_click, lr).box(RoutingExplorer)


def fraction_curve(source) -> tuple[list[tuple[float, float, float, float]], tuple[float, float, float] | None]:
    """``(rows, softmax)`` of a MoH study (a :class:`attnbook.lab.claims.MoHStudy` or its recording, parsed
    JSON): one ``(fraction of heads active, mean, low, high)`` row of accuracy over the seeds per MoH split, and
    plain multi-head softmax's ``(mean, low, high)`` (None if not run)."""
    name = "fraction_curve"
    if isinstance(source, dict):
        check_found([k for k in ("curve", "softmax") if k in source], "source", name=name,
                    expected="hold 'curve' and 'softmax' (a MoH study's recording)", got=f"keys {sorted(source)}",
                    minimum=2)  # fmt: skip
        stats = ("mean", "low", "high")
        rows = [(float(r["fraction"]), *(float(r["accuracy"][k]) for k in stats)) for r in source["curve"]]
        soft = source["softmax"]
        return rows, None if soft is None else tuple(float(soft["accuracy"][k]) for k in stats)
    what = "a MoHStudy (attnbook.lab.claims.moh_study) or its recording (a dict)"
    check_found([a for a in ("curve", "comparison") if hasattr(source, a)], "source", name=name, expected=f"be {what}",
                got=type(source).__name__, minimum=2)  # fmt: skip
    rows = [(float(f), s.mean, s.low, s.high) for f, s in source.curve()]
    if "softmax" not in source.comparison.runs:
        return rows, None
    s = source.comparison.summary("softmax")
    return rows, (s.mean, s.low, s.high)


def fewer_heads_curve(recording: dict) -> list[tuple[float, float, float, float]]:
    """The control of a MoH study's recording (parsed JSON): one ``(fraction, mean, low, high)`` row of accuracy
    over the seeds per plain multi-head softmax attention with only that many of the heads (its ``fewer_heads``;
    an empty list when the study ran without them)."""
    check_found([k for k in ("curve", "softmax") if k in recording], "recording", name="fewer_heads_curve",
                expected="hold 'curve' and 'softmax' (a MoH study's recording)", got=f"keys {sorted(recording)}",
                minimum=2)  # fmt: skip
    stats = ("mean", "low", "high")
    return [(float(r["fraction"]), *(float(r["accuracy"][k]) for k in stats)) for r in recording.get("fewer_heads", [])]


def fraction_figure(
    curves: dict[str, list[tuple[float, float, float, float]]],
    *,
    fewer: list[tuple[float, float, float, float]] | None = None,
    softmax: tuple[float, float, float] | None = None,
    chance: float | None = None,
    claim: tuple[float, float] | None = (0.5, 0.9),
    ylabel: str = "held-out accuracy",
) -> Figure:
    """Quality against the fraction of heads each token activates, at the book's page width.

    ``curves``: label -> rows ``(fraction, mean, low, high)`` (:func:`fraction_curve`) in MoH's colour with the
    range over seeds as error bars, the first bolder; ``fewer``: plain multi-head attention with only that fraction
    of the heads (:func:`fewer_heads_curve`), in softmax's colour, dashed; ``softmax`` (mean, low, high): every
    head, a band;
    ``chance``: a dotted line; ``claim``: the fractions at which the paper claims multi-head quality, shaded.
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
            first = dict(marker="o", lw=1.6, alpha=1.0) if i == 0 else dict(marker="s", lw=1.0, alpha=0.7)
            ax.errorbar(
                f, mean, yerr=np.stack([mean - low, high - mean]), color=colour("moh"), capsize=3, label=label, **first
            )
        if fewer:
            f, mean, low, high = (np.array(col, dtype=float) for col in zip(*fewer, strict=True))
            label = "recorded: plain attention, that many heads"
            ax.errorbar(f, mean, yerr=np.stack([mean - low, high - mean]), color=colour("softmax"), ls="--",
                        marker="^", lw=1.2, capsize=3, label=label)  # fmt: skip
        ax.set(xlabel="fraction of the heads each token activates", ylabel=ylabel, xlim=(0.0, 1.05), ylim=(0.0, 1.05))
        ax.xaxis.set_major_formatter(lambda x, _: f"{x:.0%}")
        ax.grid(True, alpha=0.3)
        # the legend below the panel, so that it covers no point
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), ncols=2, frameon=False)
        fig.subplots_adjust(left=0.1, right=0.97, top=0.96, bottom=0.4)
    return fig
