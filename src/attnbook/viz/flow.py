"""The flow-allocation explorer (chapters 3 and 4): attention as a flow network, small enough to look at.

Flow-Attention (Wu et al., "Flowformer: Linearizing Transformers with Conservation Flows", ICML 2022) reads
attention as a flow network: keys are *sources* that send flow, queries are *sinks* that receive it, and
the flow from source j to sink i is proportional to phi(q_i) . phi(k_j) with phi = sigmoid. Conservation
turns each source's outgoing flow into a *competition* weight (a softmax over sources) and each sink's
incoming flow into an *allocation* gate (a sigmoid). Mobile-Attention (Yao et al., ICML 2024) moves the
flow budget from the sequence axis to the head axis, so the heads at one position compete for it.

Pure, tested compute functions

- :func:`make_toy_input` -- a few tokens with a knob for how similar they are and how large q and k are;
- :func:`compute_flow_state` -- everything the explorer shows, as a :class:`FlowPicture`, computed by
  :func:`attnbook.flow_attention` / :func:`attnbook.mobile_attention` with ``return_flows=True``; only the
  source -> sink edge matrix (N x M, toy sizes only) is formed here from their statistics;

and views built on them

- :func:`plot_flow` -- a matplotlib Figure: bipartite diagram (sources left, sinks right, edge width =
  flow), bars of conserved outgoing flow and competition per source, of conserved incoming flow and
  allocation per sink, and in head mode how the heads share each token's budget;
- :func:`flow_explorer` -- an ipywidgets container (core widgets only, ipywidgets 7.7 and 8) with sliders
  for the toy input, toggles for competition, allocation, causality and head mode;
- :func:`default_figure` and :func:`explorer_frames` -- the static figure of the default state and frames
  over one parameter for :func:`attnbook.viz.frame_slider`, so the website needs no kernel.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import ipywidgets as widgets
import matplotlib
import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib.collections import LineCollection
from matplotlib.ticker import NullFormatter

from .._checks import (
    check_bool,
    check_choice,
    check_dtype,
    check_eps,
    check_exclusive,
    check_instance,
    check_int,
    check_max_size,
    check_number,
    check_sequence,
    check_subset,
    check_unbatched,
)
from .static import enable_slider_keys, figure_to_png, set_slider_range
from .style import DPI, MIN_FONT, PAGE_WIDTH, book_style, colour

__all__ = [
    "FlowPicture",
    "DEFAULTS",
    "make_toy_input",
    "compute_flow_state",
    "plot_flow",
    "default_figure",
    "explorer_frames",
    "explorer_summary",
    "inactive_controls",
    "flow_explorer",
    "FlowExplorer",
    "weight_maps",
    "right_key_figure",
    "lookup_share_figure",
    "clamp_figure",
    "accuracy_figure",
]

# The explorer's starting point; default_figure() draws exactly this state.
DEFAULTS = dict(
    n_tokens=6,
    similarity=0.3,
    magnitude=3.0,
    n_heads=4,
    seed=0,
    head=0,
    causal=False,
    competition=True,
    allocation=True,
    heads_compete=False,
)

MAX_TOKENS = 64  # the edge matrix is (H, N, M): a picture, not a computation


@dataclass(frozen=True)
class FlowPicture:
    """Everything the flow explorer shows for one toy input, per head, as float64 CPU tensors.

    Sources are the M keys, sinks the N queries; ``edges @ v`` is the attention output.

    Attributes:
        mode: ``"flow"`` (tokens compete: Flow-Attention) or ``"mobile"`` (heads compete: Mobile-Attention).
        causal, competition_on, allocation_on: the switches the picture was computed with.
        incoming: (H, N) incoming flow I_i of each sink, as returned by the package.
        outgoing: (H, M) outgoing flow O_j of each source.
        conserved_incoming: (H, N) conserved incoming flow (drives the allocation).
        conserved_outgoing: (H, M) conserved outgoing flow after the clamp to [-1, 1] (drives competition).
        conserved_outgoing_raw: (H, M) the same before the clamp, when the package reports it, else None.
        competition: (H, M) competition weight of each source; all ones when ``competition_on`` is False.
        allocation: (H, N) allocation gate of each sink; all ones when ``allocation_on`` is False.
        flow: (H, N, M) normalised flow phi(q_i) . phi(k_j) / (sink normaliser), zero above the diagonal
            when causal.
        edges: (H, N, M) the flow that reaches sink i from source j: allocation_i * flow_ij * competition_j.
        output: (H, N, Dv) ``edges @ v``; with both factors on, equal to the package's output.
        head_flow: head mode only, (N, H, H): at token n, the flow from key head g (source) to query head h
            (sink), phi(q^h_n) . phi(k^g_n) / I^h_n -- the network Mobile-Attention conserves; else None.
        computed_competition: (H, M) the competition weights the package computed, whether or not
            ``competition_on`` (so a view can tell when ablating them changes nothing: all ones).
    """

    mode: str
    causal: bool
    competition_on: bool
    allocation_on: bool
    incoming: torch.Tensor
    outgoing: torch.Tensor
    conserved_incoming: torch.Tensor
    conserved_outgoing: torch.Tensor
    conserved_outgoing_raw: torch.Tensor | None
    competition: torch.Tensor
    allocation: torch.Tensor
    flow: torch.Tensor
    edges: torch.Tensor
    output: torch.Tensor
    head_flow: torch.Tensor | None
    computed_competition: torch.Tensor | None = None

    @property
    def n_heads(self) -> int:
        return self.edges.shape[0]

    @property
    def n_sinks(self) -> int:
        return self.edges.shape[1]

    @property
    def n_sources(self) -> int:
        return self.edges.shape[2]


def make_toy_input(
    n_tokens: int = DEFAULTS["n_tokens"],
    similarity: float = DEFAULTS["similarity"],
    magnitude: float = DEFAULTS["magnitude"],
    n_heads: int = DEFAULTS["n_heads"],
    seed: int = DEFAULTS["seed"],
    *,
    d_head: int = 4,
    d_token: int = 8,
    dtype: torch.dtype = torch.float64,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A few tokens projected to per-head queries, keys and values (self-attention, so N = M).

    Token t is ``x_t = s * base + sqrt(1 - s^2) * noise_t`` with one shared random ``base`` and independent
    ``noise_t`` (all standard normal in ``d_token`` dimensions), so ``similarity`` s = 0 gives unrelated
    tokens and s = 1 identical ones. Each head projects the tokens with its own random matrices; q and k are
    multiplied by ``magnitude`` (how far the logits reach into the sigmoid's saturation), v is not.
    Growing ``n_tokens`` keeps the earlier tokens unchanged.

    Returns:
        q, k of shape (1, H, N, d_head) and v of shape (1, H, N, d_head), on the CPU, in ``dtype``.
    """
    where = "make_toy_input"
    n_tokens = check_int(n_tokens, "n_tokens", name=where, minimum=1, maximum=MAX_TOKENS)
    similarity = check_number(similarity, "similarity", name=where, minimum=0.0, maximum=1.0)
    magnitude = check_number(magnitude, "magnitude", name=where, minimum=0.0)
    n_heads = check_int(n_heads, "n_heads", name=where, minimum=1)
    seed = check_int(seed, "seed", name=where, minimum=0)
    d_head = check_int(d_head, "d_head", name=where, minimum=1)
    d_token = check_int(d_token, "d_token", name=where, minimum=1)
    check_dtype(dtype, "dtype", name=where)
    g = torch.Generator().manual_seed(int(seed))
    scale = 1.0 / math.sqrt(d_token)
    wq, wk, wv = (
        torch.randn(n_heads, d_token, d_head, generator=g, dtype=torch.float64) * scale for _ in range(3)
    )  # (H, d_token, d_head)
    base = torch.randn(d_token, generator=g, dtype=torch.float64)
    # one row at a time, so that token t does not depend on how many tokens come after it
    noise = torch.stack([torch.randn(d_token, generator=g, dtype=torch.float64) for _ in range(n_tokens)])
    x = similarity * base + math.sqrt(max(0.0, 1.0 - similarity**2)) * noise  # (N, d_token)
    q = magnitude * torch.einsum("nc,hcd->hnd", x, wq)  # (H, N, d_head)
    k = magnitude * torch.einsum("nc,hcd->hnd", x, wk)  # (H, N, d_head)
    v = torch.einsum("nc,hcd->hnd", x, wv)  # (H, N, d_head)
    return q[None].to(dtype), k[None].to(dtype), v[None].to(dtype)


def _cpu64(x: torch.Tensor) -> torch.Tensor:
    return x.detach().to("cpu", torch.float64)


def compute_flow_state(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    competition: bool = True,
    allocation: bool = True,
    heads_compete: bool = False,
    eps: float = 1e-6,
) -> FlowPicture:
    """The flow network of one small input, as computed by the package, for the explorer to draw.

    The statistics (incoming and outgoing flow, their conserved versions, competition, allocation) come from
    ``attnbook.flow_attention(..., return_flows=True)``, or from ``attnbook.mobile_attention`` when
    ``heads_compete``. Only the per-edge flow is formed here, which is why this is for toy sizes:

        flow_ij  = phi(q_i) . phi(k_j) / (I_i [t_i])          (zero for j > i when causal)
        edges_ij = allocation_i * flow_ij * competition_j,   output = edges @ v

    Switching ``competition`` or ``allocation`` off sets that factor to one: the ablations of the
    Flowformer paper (Wu et al., 2022, Sec. 4.4).

    Args:
        q, k, v: (H, N, D), (H, M, D), (H, M, Dv) or the same with a leading batch of 1.
        causal: causal Flow-Attention (N == M); not available with ``heads_compete``.
        competition, allocation: keep (True) or ablate (False) the two factors.
        heads_compete: Mobile-Attention (flow sums over the heads at one position; N == M).

    Returns:
        a :class:`FlowPicture`.
    """
    import attnbook  # deferred: attnbook.viz must stay importable on its own

    where = "compute_flow_state"
    causal = check_bool(causal, "causal", name=where)
    competition = check_bool(competition, "competition", name=where)
    allocation = check_bool(allocation, "allocation", name=where)
    heads_compete = check_bool(heads_compete, "heads_compete", name=where)
    eps = check_eps(eps, name=where)
    q, k, v = (
        check_unbatched(x, label, name=where, layout=f"(H, {n}, D)")
        for x, label, n in ((q, "q", "N"), (k, "k", "M"), (v, "v", "M"))
    )
    toy = " (it draws an (H, N, M) edge matrix and is meant for toy sizes)"
    check_max_size(q, "q", -2, MAX_TOKENS, name=where, label="N", why=toy)
    check_max_size(k, "k", -2, MAX_TOKENS, name=where, label="M", why=toy)
    N = q.shape[-2]
    why = " (Mobile-Attention has no causal version)"
    check_exclusive(heads_compete, causal, "heads_compete", "causal", name=where, why=why)
    if heads_compete:
        _, stats = attnbook.mobile_attention(q, k, v, eps=eps, return_flows=True)
    else:
        _, stats = attnbook.flow_attention(q, k, v, is_causal=causal, eps=eps, return_flows=True)

    qf = torch.sigmoid(_cpu64(q[0]))  # (H, N, D)
    kf = torch.sigmoid(_cpu64(k[0]))  # (H, M, D)
    incoming = _cpu64(stats.incoming[0])  # (H, N)
    normaliser = incoming
    if causal:  # the causal flows are averages over the prefix: I_i carries a 1 / t_i
        normaliser = incoming * torch.arange(1, N + 1, dtype=torch.float64)
    flow = qf @ kf.transpose(-2, -1) / normaliser[..., None]  # (H, N, M)
    if causal:
        flow = flow.tril()
    comp = computed = _cpu64(stats.competition[0])  # (H, M)
    alloc = _cpu64(stats.allocation[0])  # (H, N)
    if not competition:
        comp = torch.ones_like(comp)
    if not allocation:
        alloc = torch.ones_like(alloc)
    edges = alloc[..., None] * flow * comp[:, None, :]  # (H, N, M)
    output = edges @ _cpu64(v[0])  # (H, N, Dv)
    head_flow = None
    if heads_compete:  # at each token n: query head h receives from key head g
        head_flow = torch.einsum("hnd,gnd->nhg", qf, kf) / incoming.transpose(0, 1)[..., None]  # (N, H, H)
    raw = getattr(stats, "conserved_outgoing_raw", None)
    return FlowPicture(
        mode="mobile" if heads_compete else "flow",
        causal=bool(causal),
        competition_on=bool(competition),
        allocation_on=bool(allocation),
        incoming=incoming,
        outgoing=_cpu64(stats.outgoing[0]),
        conserved_incoming=_cpu64(stats.conserved_incoming[0]),
        conserved_outgoing=_cpu64(stats.conserved_outgoing[0]),
        conserved_outgoing_raw=None if raw is None else _cpu64(raw[0]),
        competition=comp,
        allocation=alloc,
        flow=flow,
        edges=edges,
        output=output,
        head_flow=head_flow,
        computed_competition=computed,
    )


# ----------------------------------------------------------------------------------------------- views

# Sources and sinks are roles, not mechanisms: neutral browns and greys, so that the one mechanism colour
# of attnbook.viz.style (Flow or Mobile, on the edges) stays the only colour that means a mechanism.
_SOURCE_COLOURS = ("#8c510a", "#dfc27d")  # conserved outgoing flow, competition
_SINK_COLOURS = ("#4d4d4d", "#bababa")  # conserved incoming flow, allocation


def _legend_above(ax, *, ncol: int, handlelength: float, **kwargs) -> None:
    """A frameless legend just above ``ax``, as wide as it, filled column by column: it covers nothing."""
    ax.legend(
        loc="lower left",
        bbox_to_anchor=(0.0, 1.0, 1.0, 0.1),
        mode="expand",
        ncol=ncol,
        frameon=False,
        borderaxespad=0.2,
        handlelength=handlelength,
        **kwargs,
    )


def _draw_bipartite(
    ax,
    weights: np.ndarray,
    *,
    source_size: np.ndarray,
    sink_size: np.ndarray,
    edge_colour: str,
    title: str,
) -> None:
    """Sources (keys) on the left at x = 0, sinks (queries) on the right at x = 1; width proportional to weight."""
    n_sinks, n_sources = weights.shape
    ys = lambda n: np.linspace(1.0, 0.0, n) if n > 1 else np.array([0.5])  # noqa: E731
    y_src, y_snk = ys(n_sources), ys(n_sinks)
    top = float(weights.max()) if weights.size and weights.max() > 0 else 1.0
    segments, widths, colours = [], [], []
    edge_rgb = matplotlib.colors.to_rgb(edge_colour)
    for i in range(n_sinks):
        for j in range(n_sources):
            w = float(weights[i, j]) / top
            if w > 1e-3:  # exact zeros (causal: future sources) draw nothing
                segments.append([(0.0, y_src[j]), (1.0, y_snk[i])])
                widths.append(0.3 + 5.0 * w)
                colours.append((*edge_rgb, 0.25 + 0.6 * w))
    # one collection instead of N * M lines: drawing stays fast enough for a live widget
    ax.add_collection(
        LineCollection(segments, linewidths=widths, colors=colours, capstyle="round", zorder=1, label="edges")
    )
    # marker area grows with the node's factor (competition / allocation); 1 = the neutral size
    for x, y, size, fill in ((0.0, y_src, source_size, _SOURCE_COLOURS[0]), (1.0, y_snk, sink_size, _SINK_COLOURS[0])):
        ax.scatter(
            np.full(len(y), x), y, s=90 * np.clip(size, 0.05, None), color=fill, zorder=2, edgecolor="white", lw=0.5
        )
    for j, y in enumerate(y_src):
        ax.text(-0.07, y, f"k{j}", ha="right", va="center", fontsize=MIN_FONT)
    for i, y in enumerate(y_snk):
        ax.text(1.07, y, f"q{i}", ha="left", va="center", fontsize=MIN_FONT)
    ax.set_xlim(-0.3, 1.3)
    ax.set_ylim(-0.06, 1.06)
    ax.axis("off")
    ax.set_title(title, fontsize=10)


def _grouped_bars(
    ax,
    first: np.ndarray,
    second: np.ndarray,
    *,
    labels: tuple[str, str],
    colours,
    xlabel: str,
    clamp: bool = False,
    raw: np.ndarray | None = None,
) -> None:
    """Two bars per node; the legend sits above the axes, where it cannot cover a bar."""
    x = np.arange(len(first))
    width = 0.4
    bars_first = ax.bar(x - width / 2, first, width, color=colours[0], label=labels[0])
    bars_second = ax.bar(x + width / 2, second, width, color=colours[1], label=labels[1], edgecolor=colours[0], lw=0.4)
    handles = [bars_first]
    if raw is not None:  # the part the clamp cut off, hatched
        handles.append(
            ax.bar(
                x - width / 2,
                raw,
                width,
                color="none",
                edgecolor=colours[0],
                hatch="///",
                lw=0.6,
                label=f"{labels[0].split(':')[0]} before the clamp",
            )
        )
    handles.append(bars_second)
    if clamp:
        handles.append(ax.axhline(1.0, color="black", lw=0.8, ls="--", label="clamp at 1"))
    # above the axes, as wide as they are, filled column by column: it can neither cover a bar nor widen the page
    _legend_above(ax, ncol=2, handlelength=1.4, handles=handles)
    ax.set_xticks(x, [str(i) for i in x])
    ax.set_xlim(-0.6, len(first) - 0.4)
    ax.set_xlabel(xlabel)
    top = max(
        float(np.max(first)),
        float(np.max(second)),
        1.0 if clamp else 0.0,
        float(np.max(raw)) if raw is not None else 0.0,
    )
    ax.set_ylim(0.0, 1.08 * top)
    ax.grid(True, axis="y", alpha=0.3)


def plot_flow(state: FlowPicture, *, head: int = 0, figsize: tuple[float, float] | None = None):
    """Draw a :class:`FlowPicture` for one head; returns the matplotlib Figure (drawn for the book's page).

    Panels: the bipartite flow diagram (keys = sources on the left, queries = sinks on the right, edge width
    proportional to ``edges``, marker size to competition / allocation; edges in the mechanism's colour of
    :mod:`attnbook.viz.style`); conserved outgoing flow and competition per source (dashed line: the clamp at
    1); conserved incoming flow and allocation per sink; in head mode also each token's conserved outgoing
    flow stacked over the heads (the heads share it). The figure is :data:`~attnbook.viz.style.PAGE_WIDTH`
    wide with text of at least :data:`~attnbook.viz.style.MIN_FONT` points: the panels wrap onto two rows
    instead of shrinking.
    """
    check_instance(state, "state", FlowPicture, name="plot_flow", what="a FlowPicture")
    head = check_int(head, "head", name="plot_flow", minimum=0, maximum=state.n_heads - 1)
    heads_mode = state.mode == "mobile"
    switches = []
    if state.causal:
        switches.append("causal")
    if not state.competition_on:
        switches.append("no competition")
    if not state.allocation_on:
        switches.append("no allocation")
    what = "Mobile-Attention: heads compete" if heads_mode else "Flow-Attention: tokens compete"
    title = f"{what}, head {head} of {state.n_heads}" + (f" ({', '.join(switches)})" if switches else "")
    with book_style():
        fig = plt.figure(figsize=figsize or (PAGE_WIDTH, 6.6 if heads_mode else 5.6))
        grid = fig.add_gridspec(2, 2, left=0.04, right=0.98, bottom=0.08, top=0.86, wspace=0.18, hspace=0.55)
        if heads_mode:
            ax_flow, ax_src = fig.add_subplot(grid[0, 0]), fig.add_subplot(grid[0, 1])
            ax_heads, ax_snk = fig.add_subplot(grid[1, 0]), fig.add_subplot(grid[1, 1])
        else:  # the diagram gets the whole left column
            ax_flow = fig.add_subplot(grid[:, 0])
            ax_src, ax_snk = fig.add_subplot(grid[0, 1]), fig.add_subplot(grid[1, 1])
        fig.suptitle(title, fontsize=11)
        _draw_bipartite(
            ax_flow,
            state.edges[head].numpy(),
            source_size=state.competition[head].numpy(),
            sink_size=state.allocation[head].numpy(),
            edge_colour=colour(state.mode),
            title="flow from keys (sources)\nto queries (sinks)",
        )
        raw = None if state.conserved_outgoing_raw is None else state.conserved_outgoing_raw[head].numpy()
        _grouped_bars(
            ax_src,
            state.conserved_outgoing[head].numpy(),
            state.competition[head].numpy(),
            labels=("Ô: conserved outgoing", "competition"),
            colours=_SOURCE_COLOURS,
            xlabel="source j (key)",
            clamp=True,
            raw=raw,
        )
        _grouped_bars(
            ax_snk,
            state.conserved_incoming[head].numpy(),
            state.allocation[head].numpy(),
            labels=("Î: conserved incoming", "allocation"),
            colours=_SINK_COLOURS,
            xlabel="sink i (query)",
        )
        if heads_mode:
            _draw_head_shares(ax_heads, state, head)
    return fig


def _draw_head_shares(ax, state: FlowPicture, head: int) -> None:
    """Each token's conserved outgoing flow stacked over the heads: Mobile-Attention's budget is per token."""
    shares = (
        state.conserved_outgoing_raw if state.conserved_outgoing_raw is not None else state.conserved_outgoing
    ).numpy()  # (H, N)
    H, N = shares.shape
    bottom = np.zeros(N)
    shades = plt.get_cmap("cividis")(np.linspace(0.15, 0.95, H))  # heads are not mechanisms: one ramp
    for h in range(H):
        ax.bar(
            np.arange(N),
            shares[h],
            bottom=bottom,
            color=shades[h],
            edgecolor="black" if h == head else "white",
            lw=1.2 if h == head else 0.3,
            label=f"head {h}" + (" (shown)" if h == head else ""),
        )
        bottom = bottom + shares[h]
    ax.axhline(H, color="black", lw=0.8, ls="--")
    ax.set_xticks(np.arange(N), [str(j) for j in range(N)])
    ax.set_xlim(-0.6, N - 0.4)
    ax.set_xlabel(f"token j: the H = {H} heads share its Ô (sum = H)")
    ax.set_ylim(0.0, 1.05 * max(H, float(bottom.max())))
    _legend_above(ax, ncol=3, handlelength=1.0)


_CHECKS = {  # explorer parameter -> its validation (one wording, from attnbook._checks)
    "n_tokens": lambda v, where: check_int(v, "n_tokens", name=where, minimum=1, maximum=MAX_TOKENS),
    "similarity": lambda v, where: check_number(v, "similarity", name=where, minimum=0.0, maximum=1.0),
    "magnitude": lambda v, where: check_number(v, "magnitude", name=where, minimum=0.0),
    "n_heads": lambda v, where: check_int(v, "n_heads", name=where, minimum=1),
    "seed": lambda v, where: check_int(v, "seed", name=where, minimum=0),
    "head": lambda v, where: check_int(v, "head", name=where, minimum=0),
    "causal": lambda v, where: check_bool(v, "causal", name=where),
    "competition": lambda v, where: check_bool(v, "competition", name=where),
    "allocation": lambda v, where: check_bool(v, "allocation", name=where),
    "heads_compete": lambda v, where: check_bool(v, "heads_compete", name=where),
}


def _params(where: str = "flow explorer", **overrides) -> dict:
    check_subset(sorted(overrides), "parameters", sorted(DEFAULTS), name=where)
    p = {**DEFAULTS, **overrides}
    p = {name: _CHECKS[name](value, where) for name, value in p.items()}
    check_int(p["head"], "head", name=where, minimum=0, maximum=p["n_heads"] - 1, why=" (n_heads - 1)")
    return p


def _state_from(params: dict) -> FlowPicture:
    q, k, v = make_toy_input(
        params["n_tokens"], params["similarity"], params["magnitude"], params["n_heads"], params["seed"]
    )
    heads = params["heads_compete"]
    return compute_flow_state(
        q,
        k,
        v,
        causal=params["causal"] and not heads,
        competition=params["competition"],
        allocation=params["allocation"],
        heads_compete=heads,
    )


def default_figure(**overrides):
    """The static figure of the explorer's default state (:data:`DEFAULTS`, changed by ``overrides``)."""
    p = _params("default_figure", **overrides)
    return plot_flow(_state_from(p), head=p["head"])


def explorer_frames(parameter: str, values: Sequence, **overrides) -> dict[str, object]:
    """Figures of the explorer with ``parameter`` set to each of ``values`` (others from :data:`DEFAULTS`
    and ``overrides``), keyed by the value's label: the input of :func:`attnbook.viz.frame_slider`."""
    check_choice(parameter, "parameter", sorted(DEFAULTS), name="explorer_frames")
    check_sequence(values, "values", name="explorer_frames", minimum=1, item="value")
    frames = {}
    for value in values:
        p = _params("explorer_frames", **{**overrides, parameter: value})
        frames[f"{value:g}" if isinstance(value, float) else str(value)] = plot_flow(_state_from(p), head=p["head"])
    return frames


_IDENTICAL = 1.0 - 1e-9  # similarity at or above this: every token is the same vector
_INVISIBLE = 5e-3  # a change of half a percent of a bar's height: no pixel of the figure moves


def inactive_controls(params: dict, state: FlowPicture) -> dict[str, str]:
    """The explorer's controls that cannot change the picture in this state, each with the reason.

    The explorer greys these out and prints the reasons under the controls, so that no control looks dead
    without an explanation. Keys are parameter names of :data:`DEFAULTS`.

    - ``causal`` in head mode: Mobile-Attention has no causal form.
    - ``head`` with one head.
    - At similarity 1 every token is the same vector, so every source sends, and every sink receives, the
      same flow in every head (all Ô and Î equal 1, competition 1, up to the normaliser's eps, which stays
      invisible over the explorer's magnitudes 0.25..4): ``magnitude``, ``seed``, ``n_heads`` and ``head``
      change nothing in Flow mode. In head mode the heads still differ (their projections do), so
      only with a single head is the picture fixed.
    - ``competition`` whenever every competition weight of the head shown is 1 (identical tokens, or a clamp
      that cuts every source's Ô to 1): ablating it multiplies by 1.
    """
    heads_mode = params["heads_compete"]
    H = params["n_heads"]
    out: dict[str, str] = {}
    if heads_mode:
        out["causal"] = (
            "Mobile-Attention has no causal form (its heads compete at each position), so this mode is never "
            "causal; your choice comes back in Flow mode"
        )
    if H == 1:
        out["head"] = "there is only one head (heads = 1)"
    if params["similarity"] >= _IDENTICAL and (not heads_mode or H == 1):
        why = (
            "at similarity 1 every token is the same vector, so every source sends and every sink receives the "
            "same flow" + (" in every head" if not heads_mode else "") + "; lower the similarity to see it change"
        )
        out["magnitude"] = out["seed"] = why
        if not heads_mode:
            out["n_heads"] = why
            if H > 1:
                out["head"] = why
    weights = state.computed_competition
    h = params["head"]
    if weights is not None and bool(((weights[h] - 1.0).abs() < _INVISIBLE).all()):
        raw = state.conserved_outgoing_raw
        if params["similarity"] >= _IDENTICAL:
            cause = "every token is the same vector"
        elif raw is not None and bool((raw[h] >= 1.0).all()):
            cause = "the clamp cuts every source's Ô to 1"
        else:
            cause = "all sources are alike"
        out["competition"] = f"every competition weight of head {h} is 1 here ({cause}), so ablating it changes nothing"
    return out


def explorer_summary(state: FlowPicture, *, head: int = 0, inactive: dict[str, str] | None = None) -> str:
    """One-line HTML summary of a state: the conservation sums and what the clamp did, for one head; then, if
    ``inactive`` is given (from :func:`inactive_controls`), why each greyed-out control cannot act."""
    H, N, M = state.n_heads, state.n_sinks, state.n_sources
    raw = state.conserved_outgoing_raw
    clipped = "" if raw is None else f", clamp clips {int((raw[head] > 1).sum())} of {M} sources"
    if state.mode == "mobile":
        per_token = (raw if raw is not None else state.conserved_outgoing).sum(0)  # (M,)
        budget = f"Σ<sub>heads</sub> Ô per token: {per_token.min():.3f} … {per_token.max():.3f} (H = {H})"
    elif state.causal:
        budget = "causal: conservation holds for every prefix"
    else:
        total = (raw if raw is not None else state.conserved_outgoing)[head].sum()
        budget = (
            f"Σ<sub>j</sub> Ô<sub>j</sub> = {total:.3f} (N = {N}), Σ<sub>i</sub> Î<sub>i</sub> = "
            f"{state.conserved_incoming[head].sum():.3f} (M = {M})"
        )
    notes = "".join(
        f"<br>⊘ <b>{_LABELS[name]}</b> is greyed out: {reason}." for name, reason in (inactive or {}).items()
    )
    return (
        f"<div style='font-family:sans-serif;font-size:0.9em;line-height:1.4'>head {head}: {budget}{clipped}; "
        f"competition {state.competition[head].min():.2f} … {state.competition[head].max():.2f}, "
        f"allocation {state.allocation[head].min():.2f} … {state.allocation[head].max():.2f}{notes}</div>"
    )


# the explorer's visible label of each parameter (its widget's description)
_LABELS = {
    "n_tokens": "tokens",
    "similarity": "similarity",
    "magnitude": "magnitude",
    "n_heads": "heads",
    "seed": "seed",
    "head": "head shown",
    "competition": "competition",
    "allocation": "allocation",
    "causal": "causal",
    "heads_compete": "mode",
}
_MODES = [("Flow: tokens compete", False), ("Mobile: heads compete", True)]


class FlowExplorer(widgets.VBox):
    """The box :func:`flow_explorer` returns; its ``explorer`` attribute holds the controls and the state."""

    explorer: _FlowController


class _FlowController:
    """The controls and the callback behind :func:`flow_explorer` (kept off the widget itself)."""

    def __init__(self, p: dict):
        w = widgets
        # continuous_update=False: one redraw when a drag ends, not a queue of them on a slow kernel
        slider = dict(style={"description_width": "initial"}, continuous_update=False)
        self.controls = {
            "n_tokens": w.IntSlider(value=p["n_tokens"], min=2, max=12, description="tokens", **slider),
            "similarity": w.FloatSlider(
                value=p["similarity"], min=0.0, max=1.0, step=0.05, description="similarity", **slider
            ),
            # from 0.25: at magnitude 0 every q and k is 0, every token alike, and the picture is fixed; up to 4:
            # beyond, sigmoid features near 0 let the normaliser's eps (1e-6) move the picture by percents
            "magnitude": w.FloatSlider(
                value=min(max(p["magnitude"], 0.25), 4.0),
                min=0.25,
                max=4.0,
                step=0.25,
                description="magnitude",
                **slider,
            ),
            "n_heads": w.IntSlider(value=p["n_heads"], min=1, max=6, description="heads", **slider),
            "seed": w.IntSlider(value=p["seed"], min=0, max=20, description="seed", **slider),
            "head": w.IntSlider(
                value=p["head"], min=0, max=max(p["n_heads"] - 1, 0), description="head shown", **slider
            ),
            "competition": w.Checkbox(value=p["competition"], description="competition", indent=False),
            "allocation": w.Checkbox(value=p["allocation"], description="allocation", indent=False),
            "causal": w.Checkbox(value=p["causal"] and not p["heads_compete"], description="causal", indent=False),
            # wide enough for the whole label in every front-end (the default width cut "Flow" off)
            "heads_compete": w.ToggleButtons(
                options=_MODES,
                value=p["heads_compete"],
                description="mode",
                style={"description_width": "initial", "button_width": "190px"},
            ),
        }
        self.summary = w.HTML(value="")
        # shown at the size it is drawn for (the page's width at DPI), never stretched to the output area
        self.image = w.Image(
            format="png", value=b"", layout=w.Layout(width=f"{PAGE_WIDTH * DPI:.0f}px", max_width="100%")
        )
        self.causal_choice = p["causal"]  # what the student ticked; head mode shows False without forgetting it
        self.state: FlowPicture | None = None
        self.inactive: dict[str, str] = {}
        self.renders = 0
        self._busy = False
        c = self.controls
        self.column_right = w.VBox([c["n_heads"], c["seed"], c["head"]])  # holds "head shown" (re-ranged)
        self.layout = [
            w.HBox([w.VBox([c["n_tokens"], c["similarity"], c["magnitude"]]), self.column_right]),
            w.HBox([c["competition"], c["allocation"], c["causal"]]),
            c["heads_compete"],
            self.summary,
            self.image,
        ]
        for control in c.values():
            control.observe(self._on_change, names="value")
        self.render()

    @property
    def params(self) -> dict:
        return {name: control.value for name, control in self.controls.items()}

    def _on_change(self, change) -> None:
        if self._busy:  # a value the explorer set itself (a clamped range, the causal box in head mode)
            return
        if change["owner"] is self.controls["causal"]:
            self.causal_choice = bool(change["new"])
        self.render()

    def render(self) -> None:
        self._busy = True
        try:
            c = self.controls
            heads_mode = c["heads_compete"].value
            head = set_slider_range(c["head"], 0, max(c["n_heads"].value - 1, 0), container=self.column_right)
            if head is not c["head"]:  # a new slider: ipywidgets 8's End key would stop at the old maximum
                head.observe(self._on_change, names="value")
                c["head"] = head
            c["causal"].value = False if heads_mode else self.causal_choice
            params = self.params
            self.state = _state_from(params)
            self.inactive = inactive_controls(params, self.state)
            for name, control in c.items():
                control.disabled = name in self.inactive
            fig = plot_flow(self.state, head=params["head"])
            try:
                # the fixed layout keeps everything inside the canvas (tests: assert_readable), so no tight crop,
                # which would draw the figure twice
                self.image.value = figure_to_png(fig, dpi=DPI, tight=False)
            finally:
                plt.close(fig)
            self.summary.value = explorer_summary(self.state, head=params["head"], inactive=self.inactive)
            self.renders += 1
        finally:
            self._busy = False


def flow_explorer(**overrides) -> FlowExplorer:
    """The live flow-allocation explorer: an ``ipywidgets.VBox`` (core widgets only; ipywidgets 7.7 and 8).

    Sliders for the toy input (tokens, similarity, magnitude, heads, seed) and the head shown, checkboxes
    for competition, allocation and causality, and a toggle between Flow-Attention (tokens compete) and
    Mobile-Attention (heads compete). Every change recomputes :func:`compute_flow_state` and redraws
    :func:`plot_flow` as PNG bytes into an ``Image`` widget, which renders in every supported front-end
    (JupyterLab 4, Notebook 7, the classic notebook with ipywidgets 7.7.1 as on Colab). The range of "head
    shown" follows "heads"; controls that cannot change the picture in the current state are disabled and the
    summary line says why (:func:`inactive_controls`).

    ``overrides`` set the starting state (names of :data:`DEFAULTS`). The controller behind the box (its
    ``controls``, ``state``, ``inactive`` and ``render``) is the box's ``explorer`` attribute.
    """
    controller = _FlowController(_params("flow_explorer", **overrides))
    enable_slider_keys()  # Notebook 7: the arrow keys would select cells instead of moving the sliders
    box = FlowExplorer(children=controller.layout)
    box.explorer = controller
    return box


# --------------------------------------------------------------------- figures of chapters 3 and 4
#
# Each takes plain numbers (tensors, arrays, (mean, low, high) spans), so that a chapter computes what it
# shows in a visible cell and hands the drawing to one call. Every figure is PAGE_WIDTH wide, its text at
# least MIN_FONT points; each is closed before it is returned, so that a notebook shows it once (as the
# cell's result), never a second time through the inline backend.

_NEUTRALS = ("#4d4d4d", "#8c510a", "#bababa", "#dfc27d")  # settings that are not mechanisms


def _np(x) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        return x.detach().to("cpu", torch.float64).numpy()
    return np.asarray(x, dtype=np.float64)


def weight_maps(
    maps: dict,
    *,
    decimals: int = 2,
    annotate: bool = True,
    row_sums: bool = False,
    xlabel: str = "key j (source)",
    ylabel: str = "query i (sink)",
    title: str | None = None,
):
    """Weight matrices side by side on one colour scale, each cell labelled with its value.

    Args:
        maps: title -> an (N, M) matrix (tensor or array); two per row, wrapping onto more rows.
        decimals: digits of the printed values.
        annotate: print every value in its cell (small matrices); exact zeros (masked entries) stay blank.
        row_sums: print each row's sum at its right ("Σ 0.78").
        xlabel, ylabel: the axes' names; title: the figure's.

    Returns:
        the matplotlib Figure.
    """
    where = "weight_maps"
    check_sequence(maps, "maps", name=where, mapping=True, minimum=1, item="matrix")
    decimals = check_int(decimals, "decimals", name=where, minimum=0, maximum=4)
    arrays = {str(name): _np(m) for name, m in maps.items()}
    for name, m in arrays.items():
        check_int(m.ndim, f"maps[{name!r}].dim()", name=where, minimum=2, maximum=2)
    scale = {"vmin": 0.0, "vmax": max(float(np.nanmax(m)) for m in arrays.values()) or 1.0}
    cols = 1 if len(arrays) == 1 else 2
    rows = math.ceil(len(arrays) / cols)
    side = max(m.shape[0] for m in arrays.values())
    height = 0.9 + rows * (2.6 if side <= 4 else 3.0)
    with book_style():
        fig, axes = plt.subplots(rows, cols, figsize=(PAGE_WIDTH, height), squeeze=False)
        fig.subplots_adjust(left=0.1, right=0.86 if not row_sums else 0.84, wspace=0.55 if row_sums else 0.3,
                            bottom=0.6 / height, top=1 - (0.75 if title else 0.4) / height, hspace=0.5)  # fmt: skip
        image = None
        for ax, (name, m) in zip(axes.flat, arrays.items(), strict=False):
            image = ax.imshow(m, cmap="viridis", aspect="auto", interpolation="nearest", **scale)
            n, k = m.shape
            if annotate:
                for (i, j), value in np.ndenumerate(m):
                    if value == 0:  # a masked entry (causal): left blank
                        continue
                    dark = value < 0.6 * scale["vmax"]
                    ax.text(j, i, f"{value:.{decimals}f}", ha="center", va="center", fontsize=MIN_FONT,
                            color="white" if dark else "black")  # fmt: skip
            if row_sums:
                for i in range(n):
                    ax.text(k - 0.4, i, f"Σ {m[i].sum():.{decimals}f}", ha="left", va="center", fontsize=MIN_FONT)
            step = 1 if max(n, k) <= 8 else max(1, max(n, k) // 6)
            ax.set_xticks(range(0, k, step))
            ax.set_yticks(range(0, n, step))
            ax.set_xlabel(xlabel)
            ax.set_ylabel(ylabel)
            ax.set_title(name)
        for ax in list(axes.flat)[len(arrays) :]:
            ax.set_visible(False)
        fig.colorbar(image, ax=axes.ravel().tolist(), fraction=0.035, pad=0.12 if row_sums else 0.04)
        if title:
            fig.suptitle(title)
    plt.close(fig)  # shown once, by the cell's result (not again by the inline backend)
    return fig


def right_key_figure(
    betas: Sequence[float],
    shares: dict,
    *,
    mechanisms: dict | None = None,
    bound: Sequence[float] | None = None,
    uniform: float | None = None,
):
    """The weight a query puts on its right key against the inverse temperature beta (log scale).

    Args:
        betas: the inverse temperatures.
        shares: label -> the mean weight on the right key at each beta.
        mechanisms: label -> the mechanism whose colour it gets (default: the label itself); labels that map
            to the same mechanism get different markers.
        bound: the best any shared reweighting by factors within e could reach (dashed grey).
        uniform: 1 / N, the weight of a uniform average (dotted).
    """
    where = "right_key_figure"
    check_sequence(betas, "betas", name=where, minimum=1, item="beta")
    check_sequence(shares, "shares", name=where, mapping=True, minimum=1, item="curve")
    mechanisms = dict(mechanisms or {})
    markers = ["o", "s", "^", "D"]
    used: dict[str, int] = {}
    with book_style():
        fig, ax = plt.subplots(figsize=(PAGE_WIDTH, 3.6))
        fig.subplots_adjust(left=0.1, right=0.7, bottom=0.16, top=0.95)
        for label, values in shares.items():
            m = mechanisms.get(label, label)
            n = used[m] = used.get(m, -1) + 1
            ax.plot(betas, _np(values), color=colour(m), marker=markers[n % 4], lw=1.6,
                    mfc="white" if n else colour(m), label=label)  # fmt: skip
        if bound is not None:
            ax.plot(betas, _np(bound), color="#777777", ls=(0, (4, 2)), lw=1.2, label="bound for Flow")
        if uniform is not None:
            ax.axhline(uniform, color="black", ls=":", lw=1.0, label=f"uniform 1/N = {uniform:.2f}")
        ax.set_xscale("log", base=2)
        ax.set_xticks(list(betas), [f"{b:g}" for b in betas])
        ax.set_xlabel("inverse temperature β (q and k scaled by √β)")
        ax.set_ylabel("weight on the right key")
        ax.set_ylim(0.0, 1.05)
        ax.grid(True, alpha=0.3)
        ax.legend(loc="center left", bbox_to_anchor=(1.02, 0.5), frameon=False)
    plt.close(fig)  # shown once, by the cell's result (not again by the inline backend)
    return fig


def _get(demo, name: str):
    return demo[name] if isinstance(demo, dict) else getattr(demo, name)


def lookup_share_figure(live: Sequence, recorded: Sequence | None = None):
    """Rescaling against training on chapter 2's retrieval toy: the weight on the right key, per toy shape.

    One panel per toy shape (a :class:`attnbook.lab.claims.LookupShareDemo` of ``live``, matched by shape in
    ``recorded``, the recording's ``demos``). Per mechanism: the best over every rescaling of q and k, then
    after training W_q, W_k live (its steps) and recorded (its steps); the dotted line is a uniform average.
    """
    where = "lookup_share_figure"
    check_sequence(live, "live", name=where, minimum=1, item="demo")
    by_shape = {(_get(d, "n_tokens"), _get(d, "dim")): d for d in (recorded or [])}
    with book_style():
        fig, axes = plt.subplots(1, len(live), figsize=(PAGE_WIDTH, 3.7), squeeze=False)
        fig.subplots_adjust(left=0.09, right=0.98, bottom=0.14, top=0.74, wspace=0.25)
        handles = {}
        for ax, demo in zip(axes[0], live, strict=True):
            shape = (_get(demo, "n_tokens"), _get(demo, "dim"))
            rec = by_shape.get(shape)
            names = list(_get(demo, "rescaled"))
            width = 0.26
            for i, m in enumerate(names):
                kinds = [("best rescaling", max(_get(demo, "rescaled")[m]), 0.35, "")]
                kinds.append((f"trained, {_get(demo, 'steps')} steps (live)", _get(demo, "trained")[m], 0.65, ""))
                if rec is not None:
                    kinds.append((f"trained, {_get(rec, 'steps')} steps (recorded)", _get(rec, "trained")[m], 1.0, ""))
                for j, (kind, value, alpha, _) in enumerate(kinds):
                    x = i + (j - (len(kinds) - 1) / 2) * width
                    bar = ax.bar(x, value, width * 0.92, color=colour(m), alpha=alpha, edgecolor="black", lw=0.4)
                    handles.setdefault(kind, bar)
                    ax.text(x, value + 0.02, f"{value:.2f}", ha="center", va="bottom", fontsize=MIN_FONT)
            ax.axhline(1.0 / shape[0], color="black", ls=":", lw=1.0)
            labels = {"linear": "elu + 1", "flow": "Flow", "mobile": "Mobile"}
            ax.set_xticks(range(len(names)), [labels.get(m, m) for m in names])
            ax.set_ylim(0.0, 1.12)
            ax.set_title(f"{shape[0]} keys, D = {shape[1]} (uniform: {1 / shape[0]:.2f})")
            ax.grid(True, axis="y", alpha=0.3)
        axes[0][0].set_ylabel("weight on the right key")
        fig.legend(list(handles.values()), list(handles), loc="upper center", ncol=2, frameon=False,
                   bbox_to_anchor=(0.5, 1.0))  # fmt: skip
    plt.close(fig)  # shown once, by the cell's result (not again by the inline backend)
    return fig


def clamp_figure(samples: dict, *, clamp: float = 1.0):
    """Histograms of the conserved outgoing flow before the clamp (log scale), one per setting, with the clamp.

    Args:
        samples: label -> the values of Ô (any shape), e.g. ``"N = M = 256"``.
        clamp: the clamp's upper bound (dashed): everything to its right is cut to it.
    """
    where = "clamp_figure"
    check_sequence(samples, "samples", name=where, mapping=True, minimum=1, item="setting")
    values = {str(k): _np(v).ravel() for k, v in samples.items()}
    low = min(float(v.min()) for v in values.values())
    high = max(float(v.max()) for v in values.values())
    edges = np.geomspace(max(low, 1e-3) * 0.9, high * 1.1, 60)
    with book_style():
        fig, ax = plt.subplots(figsize=(PAGE_WIDTH, 3.4))
        fig.subplots_adjust(left=0.1, right=0.97, bottom=0.16, top=0.8)
        for i, (label, v) in enumerate(values.items()):
            cut = float((v > clamp).mean())
            ax.hist(v, bins=edges, histtype="step", lw=1.6, color=_NEUTRALS[i % len(_NEUTRALS)],
                    weights=np.full(v.shape, 1.0 / v.size), label=f"{label}: {cut:.0%} cut")  # fmt: skip
        ax.axvline(clamp, color="black", ls="--", lw=1.0, label=f"clamp at {clamp:g}")
        ax.set_xscale("log")
        ticks = [t for t in (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50) if edges[0] <= t <= edges[-1]]
        ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("conserved outgoing flow Ô of a source, before the clamp")
        ax.set_ylabel("share of sources")
        ax.grid(True, alpha=0.3)
        _legend_above(ax, ncol=2, handlelength=1.6)
    plt.close(fig)  # shown once, by the cell's result (not again by the inline backend)
    return fig


def accuracy_figure(
    rows: Sequence,
    *,
    chance: float | None = None,
    majority: float | None = None,
    xlabel: str = "held-out accuracy",
):
    """Horizontal bars of accuracy per variant: the live run (light) and the recording (full), each with the
    range over its seeds, and dotted lines at chance and at the majority class.

    Args:
        rows: ``(label, mechanism, live_span, recorded_span)`` per variant; a span is ``(mean, low, high)`` or
            None; ``mechanism`` gives the colour.
        chance, majority: where to draw the reference lines.
    """
    where = "accuracy_figure"
    check_sequence(rows, "rows", name=where, minimum=1, item="row")
    with book_style():
        fig, ax = plt.subplots(figsize=(PAGE_WIDTH, 1.3 + 0.5 * len(rows)))
        fig.subplots_adjust(left=0.36, right=0.97, bottom=0.3 if len(rows) < 5 else 0.16, top=0.85)
        handles = {}
        for i, (_label, mechanism, live, recorded) in enumerate(rows):
            y = len(rows) - 1 - i
            for offset, span, alpha, kind in ((0.18, live, 0.4, "live run"), (-0.18, recorded, 1.0, "recorded")):
                if span is None:
                    continue
                mean, lo, hi = span
                bar = ax.barh(y + offset, mean, 0.34, color=colour(mechanism), alpha=alpha, edgecolor="black", lw=0.4)
                ax.errorbar(mean, y + offset, xerr=[[mean - lo], [hi - mean]], color="black", lw=1.0, capsize=2)
                handles.setdefault(kind, bar)
        for value, style_, name in ((chance, ":", "chance"), (majority, (0, (4, 2)), "majority class")):
            if value is not None:
                handles[f"{name} {value:.2f}"] = ax.axvline(value, color="black", ls=style_, lw=1.0)
        ax.set_yticks(range(len(rows)), [r[0] for r in reversed(rows)])
        ax.set_xlabel(xlabel)
        ax.set_xlim(0.0, 1.0)
        ax.grid(True, axis="x", alpha=0.3)
        _legend_above(ax, ncol=2, handlelength=1.6, handles=list(handles.values()), labels=list(handles))
    plt.close(fig)  # shown once, by the cell's result (not again by the inline backend)
    return fig
