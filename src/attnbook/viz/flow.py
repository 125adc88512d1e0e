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

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib.collections import LineCollection

from .static import figure_to_png

__all__ = [
    "FlowPicture",
    "DEFAULTS",
    "make_toy_input",
    "compute_flow_state",
    "plot_flow",
    "default_figure",
    "explorer_frames",
    "explorer_summary",
    "flow_explorer",
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
    if not isinstance(n_tokens, int) or not 1 <= n_tokens <= MAX_TOKENS:
        raise ValueError(f"make_toy_input: n_tokens must be an int in 1..{MAX_TOKENS}, got {n_tokens!r}")
    if not isinstance(n_heads, int) or n_heads < 1:
        raise ValueError(f"make_toy_input: n_heads must be a positive int, got {n_heads!r}")
    if not 0.0 <= similarity <= 1.0:
        raise ValueError(f"make_toy_input: similarity must be in [0, 1], got {similarity!r}")
    if not (magnitude >= 0.0 and math.isfinite(magnitude)):
        raise ValueError(f"make_toy_input: magnitude must be finite and >= 0, got {magnitude!r}")
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


def _single_batch(x: torch.Tensor, label: str) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"compute_flow_state: {label} must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() == 3:
        return x[None]
    if x.dim() == 4 and x.shape[0] == 1:
        return x
    raise ValueError(f"compute_flow_state: {label} must have shape (H, N, D) or (1, H, N, D), got {tuple(x.shape)}")


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

    q, k, v = (_single_batch(x, label) for x, label in ((q, "q"), (k, "k"), (v, "v")))
    N, M = q.shape[-2], k.shape[-2]
    if max(N, M) > MAX_TOKENS:
        raise ValueError(
            f"compute_flow_state draws an (H, N, M) edge matrix and is meant for toy sizes "
            f"(N, M <= {MAX_TOKENS}); got q {tuple(q.shape)}, k {tuple(k.shape)}"
        )
    if heads_compete and causal:
        raise ValueError("compute_flow_state: Mobile-Attention (heads_compete=True) has no causal version")
    if heads_compete:
        _, stats = attnbook.mobile_attention(q, k, v, eps=eps, return_flows=True)
    else:
        _, stats = attnbook.flow_attention(q, k, v, causal=causal, eps=eps, return_flows=True)

    qf = torch.sigmoid(_cpu64(q[0]))  # (H, N, D)
    kf = torch.sigmoid(_cpu64(k[0]))  # (H, M, D)
    incoming = _cpu64(stats.incoming[0])  # (H, N)
    normaliser = incoming
    if causal:  # the causal flows are averages over the prefix: I_i carries a 1 / t_i
        normaliser = incoming * torch.arange(1, N + 1, dtype=torch.float64)
    flow = qf @ kf.transpose(-2, -1) / normaliser[..., None]  # (H, N, M)
    if causal:
        flow = flow.tril()
    comp = _cpu64(stats.competition[0])  # (H, M)
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
    )


# ----------------------------------------------------------------------------------------------- views

_SOURCE_COLOUR = "#d95f02"
_SINK_COLOUR = "#1b9e77"
_EDGE_COLOUR = "#7570b3"


def _draw_bipartite(
    ax,
    weights: np.ndarray,
    *,
    source_size: np.ndarray,
    sink_size: np.ndarray,
    source_label: str,
    sink_label: str,
    title: str,
) -> None:
    """Sources on the left (x = 0), sinks on the right (x = 1); line width proportional to the weight."""
    n_sinks, n_sources = weights.shape
    ys = lambda n: np.linspace(1.0, 0.0, n) if n > 1 else np.array([0.5])  # noqa: E731
    y_src, y_snk = ys(n_sources), ys(n_sinks)
    top = float(weights.max()) if weights.size and weights.max() > 0 else 1.0
    segments, widths, colours = [], [], []
    edge_rgb = matplotlib.colors.to_rgb(_EDGE_COLOUR)
    for i in range(n_sinks):
        for j in range(n_sources):
            w = float(weights[i, j]) / top
            if w > 1e-3:  # exact zeros (causal: future sources) draw nothing
                segments.append([(0.0, y_src[j]), (1.0, y_snk[i])])
                widths.append(0.3 + 6.0 * w)
                colours.append((*edge_rgb, 0.25 + 0.6 * w))
    # one collection instead of N * M lines: drawing stays fast enough for a live widget
    ax.add_collection(
        LineCollection(segments, linewidths=widths, colors=colours, capstyle="round", zorder=1, label="edges")
    )
    # marker area grows with the node's factor (competition / allocation); 1 = the neutral size
    ax.scatter(
        np.zeros(n_sources),
        y_src,
        s=120 * np.clip(source_size, 0.05, None),
        color=_SOURCE_COLOUR,
        zorder=2,
        edgecolor="black",
        linewidth=0.5,
    )
    ax.scatter(
        np.ones(n_sinks),
        y_snk,
        s=120 * np.clip(sink_size, 0.05, None),
        color=_SINK_COLOUR,
        zorder=2,
        edgecolor="black",
        linewidth=0.5,
    )
    for j, y in enumerate(y_src):
        ax.text(-0.08, y, f"{source_label}{j}", ha="right", va="center", fontsize=8)
    for i, y in enumerate(y_snk):
        ax.text(1.08, y, f"{sink_label}{i}", ha="left", va="center", fontsize=8)
    ax.set_xlim(-0.35, 1.35)
    ax.set_ylim(-0.1, 1.1)
    ax.axis("off")
    ax.set_title(title, fontsize=10)


def _grouped_bars(
    ax,
    first: np.ndarray,
    second: np.ndarray,
    *,
    labels: tuple[str, str],
    colours,
    prefix: str,
    title: str,
    clamp: bool = False,
    raw: np.ndarray | None = None,
) -> None:
    x = np.arange(len(first))
    width = 0.4
    if raw is not None:  # the part the clamp cut off, hatched
        ax.bar(
            x - width / 2,
            raw,
            width,
            color="none",
            edgecolor=colours[0],
            hatch="///",
            lw=0.6,
            label=f"{labels[0]} before clamp",
        )
    ax.bar(x - width / 2, first, width, color=colours[0], label=labels[0])
    ax.bar(x + width / 2, second, width, color=colours[1], label=labels[1])
    if clamp:
        ax.axhline(1.0, color="black", lw=0.8, ls="--")
        ax.text(len(first) - 0.5, 1.0, "clamp", ha="right", va="bottom", fontsize=7)
    ax.set_xticks(x, [f"{prefix}{i}" for i in x], fontsize=8)
    top = max(
        float(np.max(first)),
        float(np.max(second)),
        1.0 if clamp else 0.0,
        float(np.max(raw)) if raw is not None else 0.0,
    )
    ax.set_ylim(0.0, 1.4 * top)  # headroom for the legend
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7, loc="upper left", framealpha=0.7, ncol=2 if raw is None else 1)
    ax.grid(True, axis="y", alpha=0.3)


def plot_flow(state: FlowPicture, *, head: int = 0, figsize: tuple[float, float] | None = None):
    """Draw a :class:`FlowPicture` for one head; returns the matplotlib Figure.

    Panels: the bipartite flow diagram (keys = sources on the left, queries = sinks on the right, edge width
    proportional to ``edges``, marker size to competition / allocation); conserved outgoing flow and
    competition per source (dashed line: the clamp at 1); conserved incoming flow and allocation per sink;
    in head mode also each token's conserved outgoing flow stacked over the heads (the heads share it).
    """
    if not isinstance(state, FlowPicture):
        raise ValueError(f"plot_flow: expected a FlowPicture, got {type(state).__name__}")
    if not 0 <= head < state.n_heads:
        raise ValueError(f"plot_flow: head={head} is outside 0..{state.n_heads - 1}")
    heads_mode = state.mode == "mobile"
    n_panels = 4 if heads_mode else 3
    fig, axes = plt.subplots(
        1,
        n_panels,
        figsize=figsize or (3.6 * n_panels + 0.6, 3.6),
        gridspec_kw=dict(width_ratios=[1.1] + [1.0] * (n_panels - 1)),
    )
    switches = []
    if state.causal:
        switches.append("causal")
    if not state.competition_on:
        switches.append("no competition")
    if not state.allocation_on:
        switches.append("no allocation")
    what = "Mobile-Attention: heads compete" if heads_mode else "Flow-Attention: tokens compete"
    fig.suptitle(f"{what}, head {head}" + (f" ({', '.join(switches)})" if switches else ""), fontsize=11)

    _draw_bipartite(
        axes[0],
        state.edges[head].numpy(),
        source_size=state.competition[head].numpy(),
        sink_size=state.allocation[head].numpy(),
        source_label="k",
        sink_label="q",
        title="flow from sources (keys) to sinks (queries)",
    )
    raw = None if state.conserved_outgoing_raw is None else state.conserved_outgoing_raw[head].numpy()
    _grouped_bars(
        axes[1],
        state.conserved_outgoing[head].numpy(),
        state.competition[head].numpy(),
        labels=("conserved outgoing Ô", "competition"),
        colours=(_SOURCE_COLOUR, "#fdb863"),
        prefix="k",
        title="sources",
        clamp=True,
        raw=raw,
    )
    _grouped_bars(
        axes[2],
        state.conserved_incoming[head].numpy(),
        state.allocation[head].numpy(),
        labels=("conserved incoming Î", "allocation"),
        colours=(_SINK_COLOUR, "#a6dba0"),
        prefix="q",
        title="sinks",
    )
    if heads_mode:
        ax = axes[3]
        shares = (
            state.conserved_outgoing_raw if state.conserved_outgoing_raw is not None else state.conserved_outgoing
        ).numpy()  # (H, N)
        bottom = np.zeros(shares.shape[1])
        colours = plt.get_cmap("tab10")
        for h in range(state.n_heads):
            ax.bar(
                np.arange(shares.shape[1]),
                shares[h],
                bottom=bottom,
                color=colours(h % 10),
                edgecolor="black" if h == head else "none",
                lw=1.0,
                label=f"head {h}",
            )
            bottom = bottom + shares[h]
        ax.axhline(state.n_heads, color="black", lw=0.8, ls="--")
        ax.set_xticks(np.arange(shares.shape[1]), [f"k{j}" for j in range(shares.shape[1])], fontsize=8)
        ax.set_ylim(0.0, 1.3 * max(state.n_heads, float(bottom.max())))
        ax.set_title(f"heads share each token (sum = H = {state.n_heads})", fontsize=10)
        ax.legend(fontsize=7, loc="upper left", framealpha=0.7, ncol=min(state.n_heads, 3))
    # fixed margins instead of tight_layout(): the layout search dominated the drawing time
    fig.subplots_adjust(left=0.02, right=0.99, bottom=0.1, top=0.82, wspace=0.22)
    return fig


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


def _params(**overrides) -> dict:
    unknown = set(overrides) - set(DEFAULTS)
    if unknown:
        raise ValueError(f"unknown explorer parameter(s) {sorted(unknown)}; known: {sorted(DEFAULTS)}")
    return {**DEFAULTS, **overrides}


def default_figure(**overrides):
    """The static figure of the explorer's default state (:data:`DEFAULTS`, changed by ``overrides``)."""
    p = _params(**overrides)
    return plot_flow(_state_from(p), head=p["head"])


def explorer_frames(parameter: str, values: Sequence, **overrides) -> dict[str, object]:
    """Figures of the explorer with ``parameter`` set to each of ``values`` (others from :data:`DEFAULTS`
    and ``overrides``), keyed by the value's label: the input of :func:`attnbook.viz.frame_slider`."""
    if parameter not in DEFAULTS:
        raise ValueError(f"explorer_frames: unknown parameter {parameter!r}; known: {sorted(DEFAULTS)}")
    frames = {}
    for value in values:
        p = _params(**{**overrides, parameter: value})
        frames[f"{value:g}" if isinstance(value, float) else str(value)] = plot_flow(_state_from(p), head=p["head"])
    return frames


def explorer_summary(state: FlowPicture, *, head: int = 0) -> str:
    """One-line HTML summary of a state: the conservation sums and what the clamp did, for one head."""
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
    return (
        f"<span style='font-family:sans-serif;font-size:0.85em'>head {head}: {budget}{clipped}; "
        f"competition {state.competition[head].min():.2f} … {state.competition[head].max():.2f}, "
        f"allocation {state.allocation[head].min():.2f} … {state.allocation[head].max():.2f}</span>"
    )


def flow_explorer(**overrides):
    """The live flow-allocation explorer: an ``ipywidgets.VBox`` (core widgets only; ipywidgets 7.7 and 8).

    Sliders for the toy input (tokens, similarity, magnitude, heads, seed) and the head shown, checkboxes
    for competition, allocation and causality, and a toggle between Flow-Attention (tokens compete) and
    Mobile-Attention (heads compete). Every change recomputes :func:`compute_flow_state` and redraws
    :func:`plot_flow` into an ``Image`` widget, so it works without a kernel-side ``Output`` capture.
    """
    import ipywidgets as widgets

    p = _params(**overrides)
    style = {"description_width": "initial"}
    n_tokens = widgets.IntSlider(value=p["n_tokens"], min=2, max=12, description="tokens", style=style)
    similarity = widgets.FloatSlider(
        value=p["similarity"], min=0.0, max=1.0, step=0.05, description="similarity", style=style
    )
    magnitude = widgets.FloatSlider(
        value=p["magnitude"], min=0.0, max=6.0, step=0.25, description="magnitude", style=style
    )
    n_heads = widgets.IntSlider(value=p["n_heads"], min=1, max=6, description="heads", style=style)
    seed = widgets.IntSlider(value=p["seed"], min=0, max=20, description="seed", style=style)
    head = widgets.IntSlider(value=p["head"], min=0, max=p["n_heads"] - 1, description="head shown", style=style)
    competition = widgets.Checkbox(value=p["competition"], description="competition", indent=False)
    allocation = widgets.Checkbox(value=p["allocation"], description="allocation", indent=False)
    causal = widgets.Checkbox(value=p["causal"], description="causal", indent=False)
    mode = widgets.ToggleButtons(
        options=[("tokens compete (Flow)", False), ("heads compete (Mobile)", True)],
        value=p["heads_compete"],
        description="mode",
        style=style,
    )
    summary = widgets.HTML(value="")
    image = widgets.Image(format="png", value=b"")
    controls = {
        "n_tokens": n_tokens,
        "similarity": similarity,
        "magnitude": magnitude,
        "n_heads": n_heads,
        "seed": seed,
        "head": head,
        "competition": competition,
        "allocation": allocation,
        "causal": causal,
        "heads_compete": mode,
    }

    busy = []  # re-entrancy guard: lowering head.max below head.value fires a nested change

    def render(change=None):
        if busy:
            return
        busy.append(True)
        try:
            _render()
        finally:
            busy.pop()

    def _render():
        head.max = n_heads.value - 1  # clamps head.value if it was larger
        causal.disabled = mode.value  # Mobile-Attention has no causal form
        params = {name: w.value for name, w in controls.items()}
        params["causal"] = params["causal"] and not params["heads_compete"]
        state = _state_from(params)
        fig = plot_flow(state, head=params["head"])
        try:
            image.value = figure_to_png(fig, dpi=80)
        finally:
            plt.close(fig)
        summary.value = explorer_summary(state, head=params["head"])

    for w in controls.values():
        w.observe(render, names="value")
    render()
    return widgets.VBox(
        [
            widgets.HBox([widgets.VBox([n_tokens, similarity, magnitude]), widgets.VBox([n_heads, seed, head])]),
            widgets.HBox([competition, allocation, causal]),
            mode,
            summary,
            image,
        ]
    )
