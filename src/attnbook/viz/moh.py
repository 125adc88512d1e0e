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
  website shows in place of the live widget.

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

from ..moh import MoHAttention

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
    """
    load = torch.as_tensor(load, dtype=torch.float64)
    if load.numel() == 0:
        return 0.0
    target = top_k / load.numel()
    return float((load - target).clamp_min(0).sum() / top_k)


def _check_settings(n_heads: int, shared: int, top_k: int, temperature: float) -> None:
    if n_heads < 1:
        raise ValueError(f"routing: n_heads must be at least 1, got {n_heads}")
    if not 0 <= shared <= n_heads:
        raise ValueError(f"routing: shared must be in 0..n_heads={n_heads}, got {shared}")
    routed = n_heads - shared
    if routed == 0 and top_k != 0:
        raise ValueError(
            f"routing: with all {n_heads} heads shared there is nothing to route; top_k must be 0, got {top_k}"
        )
    if routed > 0 and not 1 <= top_k <= routed:
        raise ValueError(
            f"routing: top_k must be in 1..{routed} (the routed heads, n_heads - shared = "
            f"{n_heads} - {shared}), got {top_k}"
        )
    if not temperature > 0:
        raise ValueError(f"routing: temperature must be positive, got {temperature}")


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
        n_heads: H, the heads of the layer.
        shared: h_s, the heads every token uses.
        top_k: k, the routed heads each token activates (0 exactly when all heads are shared).
        temperature: divides the router logits.
        seed: seeds the tokens and the layer's initialisation (the global RNG is left untouched).
        n_tokens: N, tokens routed (the load is measured over all of them).
        dim: C, the token width.
        offset: length, in standard deviations, of the mean direction shared by all tokens.
        head_dim: D, the width of a head.

    Returns:
        a :class:`RoutingState`.
    """
    _check_settings(n_heads, shared, top_k, temperature)
    if n_tokens < 1 or dim < 1:
        raise ValueError(f"compute_routing: n_tokens and dim must be positive, got {n_tokens}, {dim}")
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
    if isinstance(state_or_module, RoutingState):
        if tokens is not None:
            raise ValueError("train_router: tokens come with the RoutingState; do not pass them again")
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
    elif isinstance(state_or_module, MoHAttention):
        if tokens is None or tokens.dim() != 3:
            shape = None if tokens is None else tuple(tokens.shape)
            raise ValueError(f"train_router: a module needs tokens of shape (B, N, C), got {shape}")
        module = _clone(state_or_module)
        settings = dict(
            n_heads=module.num_heads, shared=module.shared_head, top_k=module.routed_head, temperature=1.0, seed=-1
        )  # the module's own router, as it is
        start = 0
    else:
        raise ValueError(
            f"train_router: expected a RoutingState or an MoHAttention, got {type(state_or_module).__name__}"
        )
    if settings["n_heads"] == settings["shared"]:
        raise ValueError("train_router: every head is shared, so there is no router to train")
    if steps < 0 or not lr > 0:
        raise ValueError(f"train_router: need steps >= 0 and lr > 0, got steps={steps}, lr={lr}")

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
    closing; ``_repr_png_`` is what lets ``display(fig)`` (a notebook, the widget's ``Output``) draw them.
    """

    def _repr_png_(self) -> bytes:
        from .static import figure_to_png

        return figure_to_png(self)


_SELECTION_COLOURS = ListedColormap(["#f4f4f4", "#7a9cc6", "#e8871e"])  # off, shared, routed + chosen


def _head_labels(n_heads: int, shared: int) -> list[str]:
    return [f"s{h}" for h in range(shared)] + [f"r{h}" for h in range(n_heads - shared)]


def plot_routing(state: RoutingState, history: RouterTraining | None = None, *, max_tokens: int = 24) -> Figure:
    """Draw a routing: gates (token x head), the heads each token activates, and the per-head load.

    With ``history`` a fourth panel shows the loss and the load imbalance over the router's training.
    The title carries the settings and the load-balancing loss. Only the first ``max_tokens`` tokens are
    drawn in the two matrices; the load and the loss are over all tokens.

    Returns:
        a matplotlib ``Figure`` (not registered with pyplot, so nothing needs closing).
    """
    n_panels = 3 if history is None else 4
    fig = _Figure(figsize=(3.3 * n_panels + 0.6, 3.9))
    # Fixed margins rather than a layout engine: drawing stays cheap (the website pre-renders many frames).
    fig.subplots_adjust(left=0.06, right=0.94 if history is not None else 0.98, bottom=0.16, top=0.83, wspace=0.45)
    axes = fig.subplots(1, n_panels, width_ratios=[1.15, 1.0, 1.2] + ([1.3] if history is not None else []))
    H, S = state.n_heads, state.shared
    labels = _head_labels(H, S)
    shown = min(max_tokens, state.gates.shape[0])

    ax = axes[0]
    image = ax.imshow(state.gates[:shown].numpy(), cmap="viridis", vmin=0.0, aspect="auto", interpolation="nearest")
    fig.colorbar(image, ax=ax, fraction=0.05, pad=0.02)
    ax.set_title("gate $g_{t,h}$", fontsize=10)
    ax.set_ylabel(f"token t (first {shown} of {state.gates.shape[0]})")

    ax = axes[1]
    code = state.selected[:shown].to(torch.int64).numpy().copy()
    code[:, S:] *= 2  # 0 off, 1 shared, 2 routed and chosen
    ax.imshow(code, cmap=_SELECTION_COLOURS, vmin=0, vmax=2, aspect="auto", interpolation="nearest")
    ax.set_title("heads each token activates", fontsize=10)
    ax.set_yticks([])
    for ax, separator in zip(axes[:2], ("white", "#333333"), strict=True):
        ax.set_xticks(range(H), labels, fontsize=8, rotation=90 if H > 10 else 0)
        ax.set_xlabel("head (s = shared, r = routed)")
        if 0 < S < H:
            ax.axvline(S - 0.5, color=separator, lw=1.5)

    ax = axes[2]
    shared_load = np.ones(S)
    colours = ["#7a9cc6"] * S + ["#e8871e"] * (H - S)
    ax.bar(range(H), np.concatenate([shared_load, state.load.numpy()]), color=colours)
    if H > S:
        ax.hlines(
            state.target,
            S - 0.45,
            H - 0.55,
            colors="black",
            linestyles="--",
            label=f"balanced k/E = {state.target:.2f}",
        )
        ax.legend(fontsize=8, loc="upper right")
    ax.set_ylim(0, 1.12)
    ax.set_xticks(range(H), labels, fontsize=8, rotation=90 if H > 10 else 0)
    ax.set_ylabel("share of tokens using the head")
    ax.set_title(f"load (imbalance {state.imbalance:.0%})", fontsize=10)

    if history is not None:
        ax = axes[3]
        steps = np.arange(len(history.losses))
        ax.plot(steps, history.losses, color="#444444", label="loss")
        ax.axhline(history.top_k, color="black", ls=":", lw=1, label=f"balanced value k = {history.top_k}")
        ax.set_xlabel("router step")
        ax.set_ylabel("load-balancing loss")
        twin = ax.twinx()
        twin.plot(steps, history.imbalances, color="#e8871e", label="imbalance")
        twin.set_ylim(0, max(0.05, 1.1 * float(history.imbalances.max())))
        twin.set_ylabel("load imbalance", color="#e8871e")
        lines = ax.get_lines() + twin.get_lines()
        ax.legend(lines, [line.get_label() for line in lines], fontsize=7, loc="upper right")
        ax.set_title("training the router", fontsize=10)

    routed = f"top-k = {state.top_k} of {state.routed} routed" if state.routed else "no routed heads"
    fig.suptitle(
        f"H = {H}: {S} shared, {routed}, temperature {state.temperature:g}, step {state.step}"
        f"  |  load-balancing loss {state.loss:.3f}",
        fontsize=11,
    )
    return fig


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
        self.top_k = w.IntSlider(value=2, min=1, max=6, description="top-k", style=style, continuous_update=False)
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
            value=steps_per_click, min=1, max=100, description="steps per click", style=style, continuous_update=False
        )
        self.train = w.Button(
            description="train router",
            button_style="primary",
            tooltip="Adam steps on the router with the load-balancing loss alone",
        )
        self.reset = w.Button(description="reset router", tooltip="back to the initial router")
        self.status = w.HTML(value="")
        self.out = w.Output()
        self.renders = 0
        self.state: RoutingState | None = None
        self.history: RouterTraining | None = None
        self._adjusting = False
        for control in (self.heads, self.shared, self.top_k, self.temperature, self.seed):
            control.observe(self._on_setting, names="value")
        self.train.on_click(self._on_train)
        self.reset.on_click(self._on_reset)
        self._recompute()

    def _set_bounds(self, slider, lo: int, hi: int) -> None:
        # Widen before narrowing so that min <= max holds at every moment (traitlets checks it).
        slider.max = max(hi, slider.min)
        slider.min = lo
        slider.max = hi

    def _on_setting(self, change) -> None:
        if self._adjusting:
            return
        self._adjusting = True
        try:
            H = self.heads.value
            self._set_bounds(self.shared, 0, H)
            routed = H - self.shared.value
            self._set_bounds(self.top_k, 1 if routed else 0, routed)
        finally:
            self._adjusting = False
        self._recompute()

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
        self.train.disabled = self.state.routed == 0
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

    def render(self) -> None:
        from IPython.display import clear_output, display

        fig = plot_routing(self.state, self.history)
        with self.out:
            clear_output(wait=True)
            display(fig)
        s = self.state
        note = "" if s.routed else " (all heads shared: plain multi-head attention, nothing to route)"
        self.status.value = (
            f"loss <b>{s.loss:.4f}</b> (balanced value k = {s.top_k}), "
            f"load imbalance <b>{s.imbalance:.1%}</b>, router step {s.step}{note}"
        )
        self.renders += 1


def routing_explorer(*, n_tokens: int = 128, dim: int = 32, steps_per_click: int = 10, lr: float = 0.01):
    """The live head-routing explorer: an ipywidgets ``VBox`` of controls, a status line and the figure.

    Controls: number of heads, shared heads, top-k, router temperature, seed; "train router" runs
    ``steps_per_click`` router steps (:func:`train_router`) and redraws, "reset router" goes back to the
    initial router. The object behind it is the box's ``explorer`` attribute (its ``state``, ``history``
    and controls), which is how the tests drive it.
    """
    w = widgets
    ex = _Explorer(n_tokens, dim, steps_per_click, lr)
    box = RoutingExplorer(
        children=[
            w.HBox([w.VBox([ex.heads, ex.shared, ex.top_k]), w.VBox([ex.temperature, ex.seed, ex.steps])]),
            w.HBox([ex.train, ex.reset]),
            ex.status,
            ex.out,
        ]
    )
    box.explorer = ex
    return box
