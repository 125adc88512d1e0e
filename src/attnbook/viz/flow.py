"""The flow-allocation explorer (chapters 3 and 4): attention as a flow network, small enough to look at.

Flow-Attention (Wu et al., "Flowformer: Linearizing Transformers with Conservation Flows", ICML 2022) reads
attention as a flow network: keys are *sources* that send flow, queries are *sinks* that receive it, and
the flow from source j to sink i is proportional to phi(q_i) . phi(k_j) with phi = sigmoid. Conservation
turns each source's outgoing flow into a *competition* weight (a softmax over sources) and each sink's
incoming flow into an *allocation* gate (a sigmoid). Mobile-Attention (Yao et al., ICML 2024) moves the
flow budget from the sequence axis to the head axis, so the heads at one position compete for it.

:func:`compute_flow_state` gives a :class:`FlowPicture` of :func:`make_toy_input`'s tokens, :func:`plot_flow`
draws it, :func:`flow_explorer` explores it live and :func:`explorer_frames` shows it on the website.
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
    check_distinct,
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
from .plots import ABOVE, ON_TOP, RIGHT, field, page_figure, to_numpy, wrapped_panels
from .static import Explorer, slider, status_html
from .style import MIN_FONT, PAGE_WIDTH, book_style, colour

__all__ = ["FlowPicture", "DEFAULTS", "make_toy_input", "compute_flow_state", "plot_flow", "default_figure"]
__all__ += ["explorer_frames", "explorer_summary", "inactive_controls", "flow_explorer", "FlowExplorer"]
__all__ += ["weight_maps", "right_key_figure", "lookup_share_figure", "clamp_figure", "accuracy_figure"]

# The explorer's starting point (the toy input, the head shown, the switches); default_figure() draws it.
DEFAULTS = dict(n_tokens=6, similarity=0.3, magnitude=3.0, n_heads=4, seed=0, head=0)
DEFAULTS |= dict(causal=False, competition=True, allocation=True, heads_compete=False)

MAX_TOKENS = 64  # the edge matrix is (H, N, M): a picture, not a computation

# The bounds of the explorer's numbers (floats) and ints; its other parameters are switches (True or False).
_BOUNDS = {"n_tokens": (1, MAX_TOKENS), "similarity": (0.0, 1.0), "magnitude": (0.0, None), "n_heads": (1, None)}
_BOUNDS |= {"seed": (0, None), "head": (0, None)}


def _check(name: str, value, where: str, bounds: dict = _BOUNDS, why: str = ""):
    """Explorer parameter ``name`` checked against ``bounds``, with the one wording of :mod:`attnbook._checks`."""
    if name not in bounds:
        return check_bool(value, name, name=where)
    low, high = bounds[name]
    check = check_number if isinstance(low, float) else check_int
    return check(value, name, name=where, minimum=low, maximum=high, why=why)


@dataclass(frozen=True)
class FlowPicture:
    """Everything the flow explorer shows for one toy input, per head, as float64 CPU tensors: sources are the M
    keys, sinks the N queries, and ``edges @ v`` is the attention output."""

    mode: str  # "flow" (tokens compete: Flow-Attention) or "mobile" (heads compete: Mobile-Attention)
    causal: bool  # causal, competition_on, allocation_on: the switches the picture was computed with
    competition_on: bool
    allocation_on: bool
    incoming: torch.Tensor  # (H, N) incoming flow I_i of each sink, as returned by the package
    outgoing: torch.Tensor  # (H, M) outgoing flow O_j of each source
    conserved_incoming: torch.Tensor  # (H, N) conserved incoming flow (drives the allocation)
    conserved_outgoing: torch.Tensor  # (H, M) the same, outgoing, after the clamp to [-1, 1] (drives competition)
    conserved_outgoing_raw: torch.Tensor | None  # (H, M) the same before the clamp, if the package reports it
    competition: torch.Tensor  # (H, M) competition weight of each source; all ones when not competition_on
    allocation: torch.Tensor  # (H, N) allocation gate of each sink; all ones when not allocation_on
    flow: torch.Tensor  # (H, N, M) phi(q_i) . phi(k_j) / (sink normaliser), zero above the diagonal when causal
    edges: torch.Tensor  # (H, N, M) the flow from source j to sink i: allocation_i * flow_ij * competition_j
    output: torch.Tensor  # (H, N, Dv) edges @ v; with both factors on, equal to the package's output
    # head mode only, (N, H, H): at token n the flow from key head g (source) to query head h (sink),
    # phi(q^h_n) . phi(k^g_n) / I^h_n -- the network Mobile-Attention conserves; else None
    head_flow: torch.Tensor | None
    # (H, M) the competition the package computed, even when ablated (a view can tell that ablating it changes
    # nothing: all ones)
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
    multiplied by ``magnitude`` (how far the logits reach into the sigmoid's saturation), v is not. More
    tokens keep the earlier ones. Returns q, k, v, each (1, H, N, d_head), on the CPU, in ``dtype``.
    """
    where = "make_toy_input"
    toy = dict(n_tokens=n_tokens, similarity=similarity, magnitude=magnitude, n_heads=n_heads, seed=seed)
    n_tokens, similarity, magnitude, n_heads, seed = (_check(name, value, where) for name, value in toy.items())
    d_head = check_int(d_head, "d_head", name=where, minimum=1)
    d_token = check_int(d_token, "d_token", name=where, minimum=1)
    check_dtype(dtype, "dtype", name=where)
    g = torch.Generator().manual_seed(int(seed))
    scale = 1.0 / math.sqrt(d_token)
    wq, wk, wv = (torch.randn(n_heads, d_token, d_head, generator=g, dtype=torch.float64) * scale for _ in range(3))
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
    ``attnbook.flow_attention(..., return_flows=True)`` (``is_causal=causal``), or from
    ``attnbook.mobile_attention`` when ``heads_compete`` (N == M, never causal). Only the per-edge flow is
    formed here, which is why this is for toy sizes:

        flow_ij  = phi(q_i) . phi(k_j) / (I_i [t_i])          (zero for j > i when causal)
        edges_ij = allocation_i * flow_ij * competition_j,   output = edges @ v

    ``q, k, v`` are (H, N, D), (H, M, D), (H, M, Dv) or the same with a leading batch of 1. Switching
    ``competition`` or ``allocation`` off sets that factor to one: the ablations of the Flowformer paper (Wu
    et al., 2022, Sec. 4.4).
    """
    import attnbook  # deferred: attnbook.viz must stay importable on its own

    where = "compute_flow_state"
    switches = dict(causal=causal, competition=competition, allocation=allocation, heads_compete=heads_compete)
    causal, competition, allocation, heads_compete = (check_bool(x, n, name=where) for n, x in switches.items())
    eps = check_eps(eps, name=where)
    q, k, v = (
        check_unbatched(x, label, name=where, layout=f"(H, {n}, D)")
        for x, label, n in ((q, "q", "N"), (k, "k", "M"), (v, "v", "M"))
    )
    toy = " (it draws an (H, N, M) edge matrix and is meant for toy sizes)"
    check_max_size(q, "q", -2, MAX_TOKENS, name=where, label="N", why=toy)
    check_max_size(k, "k", -2, MAX_TOKENS, name=where, label="M", why=toy)
    why = " (Mobile-Attention has no causal version)"
    check_exclusive(heads_compete, causal, "heads_compete", "causal", name=where, why=why)
    if heads_compete:
        _, stats = attnbook.mobile_attention(q, k, v, eps=eps, return_flows=True)
    else:
        _, stats = attnbook.flow_attention(q, k, v, is_causal=causal, eps=eps, return_flows=True)
    measured = ("incoming", "outgoing", "conserved_incoming", "conserved_outgoing", "competition", "allocation")
    s = {name: _cpu64(getattr(stats, name)[0]) for name in measured}  # (H, N) or (H, M)
    qf, kf = torch.sigmoid(_cpu64(q[0])), torch.sigmoid(_cpu64(k[0]))  # (H, N, D), (H, M, D)
    normaliser = s["incoming"]
    if causal:  # the causal flows are averages over the prefix: I_i carries a 1 / t_i
        normaliser = normaliser * torch.arange(1, q.shape[-2] + 1, dtype=torch.float64)
    flow = qf @ kf.transpose(-2, -1) / normaliser[..., None]  # (H, N, M)
    if causal:
        flow = flow.tril()
    computed = s["competition"]
    for factor, on in (("competition", competition), ("allocation", allocation)):
        s[factor] = s[factor] if on else torch.ones_like(s[factor])
    edges = s["allocation"][..., None] * flow * s["competition"][:, None, :]  # (H, N, M)
    head_flow = None
    if heads_compete:  # at each token n: query head h receives from key head g
        head_flow = torch.einsum("hnd,gnd->nhg", qf, kf) / s["incoming"].transpose(0, 1)[..., None]  # (N, H, H)
    raw = getattr(stats, "conserved_outgoing_raw", None)
    return FlowPicture(
        "mobile" if heads_compete else "flow",
        causal,
        competition,
        allocation,
        conserved_outgoing_raw=None if raw is None else _cpu64(raw[0]),
        flow=flow,
        edges=edges,
        output=edges @ _cpu64(v[0]),  # (H, N, Dv)
        head_flow=head_flow,
        computed_competition=computed,
        **s,
    )


# Sources and sinks are roles, not mechanisms: neutral browns and greys, so that the one mechanism colour
# of attnbook.viz.style (Flow or Mobile, on the edges) stays the only colour that means a mechanism.
_SOURCE_COLOURS = ("#8c510a", "#dfc27d")  # conserved outgoing flow, competition
_SINK_COLOURS = ("#4d4d4d", "#bababa")  # conserved incoming flow, allocation


def _draw_bipartite(ax, state: FlowPicture, head: int) -> None:
    """Sources (keys) on the left at x = 0, sinks (queries) on the right at x = 1, edges as wide as their flow in
    the mechanism's colour, and each node's marker area its factor (competition / allocation; 1 = neutral)."""
    weights = state.edges[head].numpy()  # (N, M)
    ys = lambda n: np.linspace(1.0, 0.0, n) if n > 1 else np.array([0.5])  # noqa: E731
    y_src, y_snk = ys(weights.shape[1]), ys(weights.shape[0])
    top = float(weights.max()) if weights.size and weights.max() > 0 else 1.0
    segments, widths, colours = [], [], []
    edge_rgb = matplotlib.colors.to_rgb(colour(state.mode))
    for (i, j), w in np.ndenumerate(weights / top):
        if w > 1e-3:  # exact zeros (causal: future sources) draw nothing
            segments.append([(0.0, y_src[j]), (1.0, y_snk[i])])
            widths.append(0.3 + 5.0 * w)
            colours.append((*edge_rgb, 0.25 + 0.6 * w))
    # one collection instead of N * M lines: drawing stays fast enough for a live widget
    edges = LineCollection(segments, linewidths=widths, colors=colours, capstyle="round", zorder=1, label="edges")
    ax.add_collection(edges)
    nodes = ((0.0, y_src, state.competition, _SOURCE_COLOURS[0]), (1.0, y_snk, state.allocation, _SINK_COLOURS[0]))
    for x, y, factor, fill in nodes:
        area = 90 * np.clip(factor[head].numpy(), 0.05, None)
        ax.scatter(np.full(len(y), x), y, s=area, color=fill, zorder=2, edgecolor="white", lw=0.5)
    for x, ys, ha, name in ((-0.07, y_src, "right", "k"), (1.07, y_snk, "left", "q")):
        for i, y in enumerate(ys):
            ax.text(x, y, f"{name}{i}", ha=ha, va="center", fontsize=MIN_FONT)
    ax.set(xlim=(-0.3, 1.3), ylim=(-0.06, 1.06))
    ax.axis("off")
    ax.set_title("flow from keys (sources)\nto queries (sinks)", fontsize=10)


def _grouped_bars(ax, state: FlowPicture, head: int, *, sources: bool) -> None:
    """Two bars per node: per source the conserved outgoing flow (hatched: what the clamp cut off) and the
    competition, per sink the conserved incoming flow and the allocation; the legend above the axes."""
    if sources:
        first, second, raw = state.conserved_outgoing, state.competition, state.conserved_outgoing_raw
        labels, colours = ("Ô: conserved outgoing", "competition"), _SOURCE_COLOURS
    else:
        first, second, raw = state.conserved_incoming, state.allocation, None
        labels, colours = ("Î: conserved incoming", "allocation"), _SINK_COLOURS
    first, second, raw = first[head].numpy(), second[head].numpy(), None if raw is None else raw[head].numpy()
    x = np.arange(len(first))
    width = 0.4
    handles = [ax.bar(x - width / 2, first, width, color=colours[0], label=labels[0])]
    second_bars = ax.bar(x + width / 2, second, width, color=colours[1], label=labels[1], edgecolor=colours[0], lw=0.4)
    if raw is not None:
        cut = f"{labels[0].split(':')[0]} before the clamp"
        handles.append(
            ax.bar(x - width / 2, raw, width, color="none", edgecolor=colours[0], hatch="///", lw=0.6, label=cut)
        )
    handles.append(second_bars)
    if sources:
        handles.append(ax.axhline(1.0, color="black", lw=0.8, ls="--", label="clamp at 1"))
    ax.legend(**ABOVE, ncol=2, handlelength=1.4, handles=handles)
    ax.set_xticks(x, [str(i) for i in x])
    ax.set_xlim(-0.6, len(first) - 0.4)
    ax.set_xlabel("source j (key)" if sources else "sink i (query)")
    ax.set_ylim(0.0, 1.08 * max(first.max(), second.max(), 1.0 if sources else 0.0, 0.0 if raw is None else raw.max()))
    ax.grid(True, axis="y", alpha=0.3)


def plot_flow(state: FlowPicture, *, head: int = 0, figsize: tuple[float, float] | None = None):
    """Draw a :class:`FlowPicture` for one head, page wide: the flow network (keys = sources on the left,
    queries = sinks on the right), conserved outgoing flow and competition per source, conserved incoming flow
    and allocation per sink, and in head mode how the heads share each token's budget. Returns the Figure.
    """
    check_instance(state, "state", FlowPicture, name="plot_flow", what="a FlowPicture")
    head = check_int(head, "head", name="plot_flow", minimum=0, maximum=state.n_heads - 1)
    heads_mode = state.mode == "mobile"
    flags = {"causal": state.causal, "no competition": not state.competition_on}
    flags["no allocation"] = not state.allocation_on
    switches = ", ".join(name for name, on in flags.items() if on)
    what = "Mobile-Attention: heads compete" if heads_mode else "Flow-Attention: tokens compete"
    title = f"{what}, head {head} of {state.n_heads}" + (f" ({switches})" if switches else "")
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
        _draw_bipartite(ax_flow, state, head)
        _grouped_bars(ax_src, state, head, sources=True)
        _grouped_bars(ax_snk, state, head, sources=False)
        if heads_mode:
            _draw_head_shares(ax_heads, state, head)
    return fig


def _draw_head_shares(ax, state: FlowPicture, head: int) -> None:
    """Each token's conserved outgoing flow stacked over the heads: Mobile-Attention's budget is per token."""
    raw = state.conserved_outgoing_raw
    shares = (raw if raw is not None else state.conserved_outgoing).numpy()  # (H, N)
    H, N = shares.shape
    x, bottom = np.arange(N), np.zeros(N)
    shades = plt.get_cmap("cividis")(np.linspace(0.15, 0.95, H))  # heads are not mechanisms: one ramp
    for h in range(H):
        label, edge, lw = (f"head {h} (shown)", "black", 1.2) if h == head else (f"head {h}", "white", 0.3)
        ax.bar(x, shares[h], bottom=bottom, color=shades[h], edgecolor=edge, lw=lw, label=label)
        bottom = bottom + shares[h]
    ax.axhline(H, color="black", lw=0.8, ls="--")
    ax.set_xticks(x, [str(j) for j in range(N)])
    ax.set_xlim(-0.6, N - 0.4)
    ax.set_xlabel(f"token j: the H = {H} heads share its Ô (sum = H)")
    ax.set_ylim(0.0, 1.05 * max(H, float(bottom.max())))
    ax.legend(**ABOVE, ncol=3, handlelength=1.0)


def _params(where: str, **overrides) -> dict:
    check_subset(sorted(overrides), "parameters", sorted(DEFAULTS), name=where)
    p = {name: _check(name, value, where) for name, value in {**DEFAULTS, **overrides}.items()}
    check_int(p["head"], "head", name=where, minimum=0, maximum=p["n_heads"] - 1, why=" (n_heads - 1)")
    return p


def _state_from(p: dict) -> FlowPicture:
    toy = make_toy_input(*(p[name] for name in ("n_tokens", "similarity", "magnitude", "n_heads", "seed")))
    switches = {name: p[name] for name in ("competition", "allocation", "heads_compete")}
    return compute_flow_state(*toy, causal=p["causal"] and not p["heads_compete"], **switches)


def default_figure(**overrides):
    """The static figure of the explorer's default state (:data:`DEFAULTS`, changed by ``overrides``)."""
    p = _params("default_figure", **overrides)
    return plot_flow(_state_from(p), head=p["head"])


def explorer_frames(parameter: str, values: Sequence, **overrides) -> dict[str, object]:
    """Figures of the explorer with ``parameter`` set to each of ``values`` (others from :data:`DEFAULTS`
    and ``overrides``), keyed by the value's label: the input of :func:`attnbook.viz.frame_slider`."""
    check_choice(parameter, "parameter", sorted(DEFAULTS), name="explorer_frames")
    check_sequence(values, "values", name="explorer_frames", minimum=1, item="value")
    why = " as labels (one frame replaced another)"
    check_distinct(values, "values", name="explorer_frames", key=_frame_label, why=why)
    frames = {}
    for value in values:
        p = _params("explorer_frames", **{**overrides, parameter: value})
        frames[_frame_label(value)] = plot_flow(_state_from(p), head=p["head"])
    return frames


def _frame_label(value: object) -> str:
    """A frame's key: 0.3 as "0.3", 4 as "4"."""
    return f"{value:g}" if isinstance(value, float) else str(value)


_IDENTICAL = 1.0 - 1e-9  # similarity at or above this: every token is the same vector
_INVISIBLE = 5e-3  # a change of half a percent of a bar's height: no pixel of the figure moves


def inactive_controls(params: dict, state: FlowPicture) -> dict[str, str]:
    """The explorer's controls (parameter names of :data:`DEFAULTS`) that cannot change the picture in this
    state, each with the reason, which the explorer prints under the controls it greys out.

    - ``causal`` in head mode: Mobile-Attention has no causal form; ``head`` with one head.
    - At similarity 1 every token is the same vector, so every source sends, and every sink receives, the
      same flow in every head (all Ô and Î equal 1, competition 1, up to the normaliser's eps, invisible over
      the explorer's magnitudes 0.25..4): ``magnitude``, ``seed``, ``n_heads`` and ``head`` change nothing in
      Flow mode. In head mode the heads still differ (their projections do): only one head fixes the picture.
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
    H, N, M = state.edges.shape
    head = check_int(head, "head", name="explorer_summary", minimum=0, maximum=H - 1, why=" (the state's heads)")
    raw = state.conserved_outgoing_raw
    conserved = raw if raw is not None else state.conserved_outgoing
    clipped = "" if raw is None else f", clamp clips {int((raw[head] > 1).sum())} of {M} sources"
    if state.mode == "mobile":
        per_token = conserved.sum(0)  # (M,)
        budget = f"Σ<sub>heads</sub> Ô per token: {per_token.min():.3f} … {per_token.max():.3f} (H = {H})"
    elif state.causal:
        budget = "causal: conservation holds for every prefix"
    else:
        budget = (
            f"Σ<sub>j</sub> Ô<sub>j</sub> = {conserved[head].sum():.3f} (N = {N}), Σ<sub>i</sub> Î<sub>i</sub> = "
            f"{state.conserved_incoming[head].sum():.3f} (M = {M})"
        )
    comp, alloc = state.competition[head], state.allocation[head]
    text = f"head {head}: {budget}{clipped}; competition {comp.min():.2f} … {comp.max():.2f}, "
    return status_html(text + f"allocation {alloc.min():.2f} … {alloc.max():.2f}", inactive or {}, _LABELS)


# the explorer's visible label of each parameter (its widget's description)
_LABELS = {name: name for name in DEFAULTS} | dict(n_tokens="tokens", n_heads="heads", head="head shown")
_LABELS["heads_compete"] = "mode"
_MODES = [("Flow: tokens compete", False), ("Mobile: heads compete", True)]


# The explorer's slider ranges, which flow_explorer's overrides must keep to (a slider would move a value outside
# its range without a word). Magnitude from 0.25: at 0 every q and k is 0, every token alike, and the picture is
# fixed; up to 4: beyond, sigmoid features near 0 let the normaliser's eps (1e-6) move the picture by percents.
_SLIDER_RANGES = {"n_tokens": (2, 12), "magnitude": (0.25, 4.0), "n_heads": (1, 6), "seed": (0, 20)}


class FlowExplorer(widgets.VBox):
    """The box :func:`flow_explorer` returns; its ``explorer`` attribute holds the controls and the state."""

    explorer: _FlowController


class _FlowController(Explorer):
    """The controls and the callback behind :func:`flow_explorer` (kept off the widget itself)."""

    def __init__(self, p: dict):
        w = widgets
        # wide enough for the whole label in every front-end (the default width cut "Flow" off)
        wide = {"description_width": "initial", "button_width": "190px"}
        r = _SLIDER_RANGES
        controls = {
            "n_tokens": slider(w.IntSlider, "tokens", p["n_tokens"], *r["n_tokens"]),
            "similarity": slider(w.FloatSlider, "similarity", p["similarity"], 0.0, 1.0, step=0.05),
            "magnitude": slider(w.FloatSlider, "magnitude", p["magnitude"], *r["magnitude"], step=0.25),
            "n_heads": slider(w.IntSlider, "heads", p["n_heads"], *r["n_heads"]),
            "seed": slider(w.IntSlider, "seed", p["seed"], *r["seed"]),
            "head": slider(w.IntSlider, "head shown", p["head"], 0, max(p["n_heads"] - 1, 0)),
            "competition": w.Checkbox(value=p["competition"], description="competition", indent=False),
            "allocation": w.Checkbox(value=p["allocation"], description="allocation", indent=False),
            "causal": w.Checkbox(value=p["causal"] and not p["heads_compete"], description="causal", indent=False),
            "heads_compete": w.ToggleButtons(options=_MODES, value=p["heads_compete"], description="mode", style=wide),
        }
        super().__init__(controls)
        self.summary = self.status  # explorer_summary() of the state shown
        self.causal_choice = p["causal"]  # what the student ticked; head mode shows False without forgetting it
        self.state: FlowPicture | None = None
        c = controls
        self.column_right = w.VBox([c["n_heads"], c["seed"], c["head"]])  # holds "head shown" (re-ranged)
        sliders = w.HBox([w.VBox([c["n_tokens"], c["similarity"], c["magnitude"]]), self.column_right])
        switches = w.HBox([c["competition"], c["allocation"], c["causal"]])
        self.layout = [sliders, switches, c["heads_compete"], self.status, self.image]
        for control in c.values():
            control.observe(self._on_change, names="value")
        self.render()

    @property
    def params(self) -> dict:
        return {name: control.value for name, control in self.controls.items()}

    def _on_change(self, change) -> None:
        if self.busy:  # a value the explorer set itself (a clamped range, the causal box in head mode)
            return
        if change["owner"] is self.controls["causal"]:
            self.causal_choice = bool(change["new"])
        self.render()

    def render(self) -> None:
        self.busy = True
        try:
            c = self.controls
            self.rerange("head", 0, max(c["n_heads"].value - 1, 0), self.column_right, self._on_change)
            c["causal"].value = False if c["heads_compete"].value else self.causal_choice
            params = self.params
            self.state = _state_from(params)
            inactive = inactive_controls(params, self.state)
            fig = plot_flow(self.state, head=params["head"])
            try:
                self.show(fig, inactive, explorer_summary(self.state, head=params["head"], inactive=inactive))
            finally:
                plt.close(fig)
        finally:
            self.busy = False


def flow_explorer(**overrides) -> FlowExplorer:
    """The live flow-allocation explorer (:class:`attnbook.viz.static.Explorer`), starting at :data:`DEFAULTS`
    changed by ``overrides``: sliders for the toy input and the head shown, checkboxes for competition,
    allocation and causality, a toggle between Flow (tokens compete) and Mobile (heads compete), and
    :func:`plot_flow` of the state. The range of "head shown" follows "heads"; controls that cannot change the
    picture are disabled (:func:`inactive_controls`). The box's ``explorer`` holds the controls and the state.
    """
    p = _params("flow_explorer", **overrides)
    for name in _SLIDER_RANGES:
        _check(name, p[name], "flow_explorer", _SLIDER_RANGES, why=" (the slider's range)")
    return _FlowController(p).box(FlowExplorer)


# Chapters 3 and 4's figures take plain numbers, so that a chapter computes what it shows in a visible cell and
# hands the drawing to one call.

_NEUTRALS = ("#4d4d4d", "#8c510a", "#bababa", "#dfc27d")  # settings that are not mechanisms


@page_figure
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
    """Weight matrices (``maps``: title -> (N, M)) two per row on one colour scale; ``annotate`` prints each
    value (``decimals`` digits) in its cell, exact zeros (masked entries) left blank, and ``row_sums`` each
    row's sum at its right ("Σ 0.78")."""
    where = "weight_maps"
    check_sequence(maps, "maps", name=where, mapping=True, minimum=1, item="matrix")
    decimals = check_int(decimals, "decimals", name=where, minimum=0, maximum=4)
    arrays = {str(name): to_numpy(m) for name, m in maps.items()}
    for name, m in arrays.items():
        check_int(m.ndim, f"maps[{name!r}].dim()", name=where, minimum=2, maximum=2)
    vmax = max(float(np.nanmax(m)) for m in arrays.values()) or 1.0
    side = max(m.shape[0] for m in arrays.values())
    fig, axes = wrapped_panels(len(arrays), 2.6 if side <= 4 else 3.0, extra=0.9)
    height = fig.get_figheight()
    fig.subplots_adjust(left=0.1, right=0.86 if not row_sums else 0.84, wspace=0.55 if row_sums else 0.3,
                        bottom=0.6 / height, top=1 - (0.75 if title else 0.4) / height, hspace=0.5)  # fmt: skip
    for ax, (name, m) in zip(axes.flat, arrays.items(), strict=False):
        image = ax.imshow(m, cmap="viridis", aspect="auto", interpolation="nearest", vmin=0.0, vmax=vmax)
        n, k = m.shape
        for (i, j), value in np.ndenumerate(m):
            if annotate and value != 0:  # an exact zero is a masked entry (causal): left blank
                ax.text(j, i, f"{value:.{decimals}f}", ha="center", va="center", fontsize=MIN_FONT,
                        color="white" if value < 0.6 * vmax else "black")  # fmt: skip
        for i in range(n) if row_sums else ():
            ax.text(k - 0.4, i, f"Σ {m[i].sum():.{decimals}f}", ha="left", va="center", fontsize=MIN_FONT)
        step = 1 if max(n, k) <= 8 else max(1, max(n, k) // 6)
        ax.set_xticks(range(0, k, step))
        ax.set_yticks(range(0, n, step))
        ax.set(xlabel=xlabel, ylabel=ylabel, title=name)
    fig.colorbar(image, ax=axes.ravel().tolist(), fraction=0.035, pad=0.12 if row_sums else 0.04)
    if title:
        fig.suptitle(title)
    return fig


@page_figure
def right_key_figure(
    betas: Sequence[float],
    shares: dict,
    *,
    mechanisms: dict | None = None,
    bound: Sequence[float] | None = None,
    uniform: float | None = None,
):
    """The mean weight a query puts on its right key (``shares``: label -> one per beta) against the inverse
    temperature beta (log scale), in the colour of ``mechanisms[label]`` (default: the label; curves of one
    mechanism get different markers), with ``bound`` (the best any shared reweighting by factors within e could
    reach, dashed) and ``uniform`` (1 / N, dotted)."""
    where = "right_key_figure"
    check_sequence(betas, "betas", name=where, minimum=1, item="beta")
    check_sequence(shares, "shares", name=where, mapping=True, minimum=1, item="curve")
    mechanisms = dict(mechanisms or {})
    used: dict[str, int] = {}
    fig, ax = plt.subplots(figsize=(PAGE_WIDTH, 3.6))
    fig.subplots_adjust(left=0.1, right=0.7, bottom=0.16, top=0.95)
    for label, values in shares.items():
        m = mechanisms.get(label, label)
        n = used[m] = used.get(m, -1) + 1  # the n-th curve in this colour: the n-th marker, hollow after the first
        style = dict(color=colour(m), marker="os^D"[n % 4], mfc="white" if n else colour(m))
        ax.plot(betas, to_numpy(values), lw=1.6, label=label, **style)
    if bound is not None:
        ax.plot(betas, to_numpy(bound), color="#777777", ls=(0, (4, 2)), lw=1.2, label="bound for Flow")
    if uniform is not None:
        ax.axhline(uniform, color="black", ls=":", lw=1.0, label=f"uniform 1/N = {uniform:.2f}")
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(betas), [f"{b:g}" for b in betas])
    ax.set(xlabel="inverse temperature β (q and k scaled by √β)", ylabel="weight on the right key", ylim=(0.0, 1.05))
    ax.grid(True, alpha=0.3)
    ax.legend(**RIGHT)
    return fig


_TICK_LABELS = {"linear": "elu + 1", "flow": "Flow", "mobile": "Mobile"}


@page_figure
def lookup_share_figure(live: Sequence, recorded: Sequence | None = None):
    """Rescaling against training on chapter 2's retrieval toy: per toy shape (a ``LookupShareDemo`` of ``live``,
    matched by shape in the ``recorded`` demos) and mechanism, the weight on the right key at the best rescaling
    of q and k, and after training W_q, W_k live and recorded; dotted: a uniform average."""
    check_sequence(live, "live", name="lookup_share_figure", minimum=1, item="demo")
    by_shape = {(field(d, "n_tokens"), field(d, "dim")): d for d in (recorded or [])}
    fig, axes = plt.subplots(1, len(live), figsize=(PAGE_WIDTH, 3.7), squeeze=False)
    fig.subplots_adjust(left=0.09, right=0.98, bottom=0.14, top=0.74, wspace=0.25)
    handles, width = {}, 0.26
    for ax, demo in zip(axes[0], live, strict=True):
        shape = (field(demo, "n_tokens"), field(demo, "dim"))
        runs = [(demo, "live", 0.65)] + ([(by_shape[shape], "recorded", 1.0)] if shape in by_shape else [])
        names = list(field(demo, "rescaled"))
        for i, m in enumerate(names):
            kinds = [("best rescaling", max(field(demo, "rescaled")[m]), 0.35)]
            kinds += [(f"trained, {field(r, 'steps')} steps ({k})", field(r, "trained")[m], a) for r, k, a in runs]
            for j, (kind, value, alpha) in enumerate(kinds):
                x = i + (j - (len(kinds) - 1) / 2) * width
                bar = ax.bar(x, value, width * 0.92, color=colour(m), alpha=alpha, edgecolor="black", lw=0.4)
                handles.setdefault(kind, bar)
                ax.text(x, value + 0.02, f"{value:.2f}", ha="center", va="bottom", fontsize=MIN_FONT)
        ax.axhline(1.0 / shape[0], color="black", ls=":", lw=1.0)
        ax.set_xticks(range(len(names)), [_TICK_LABELS.get(m, m) for m in names])
        ax.set_ylim(0.0, 1.12)
        ax.set_title(f"{shape[0]} keys, D = {shape[1]} (uniform: {1 / shape[0]:.2f})")
        ax.grid(True, axis="y", alpha=0.3)
    axes[0][0].set_ylabel("weight on the right key")
    fig.legend(list(handles.values()), list(handles), ncol=2, **ON_TOP)
    return fig


@page_figure
def clamp_figure(samples: dict, *, clamp: float = 1.0):
    """Histograms of the conserved outgoing flow Ô before the clamp (``samples``: label -> values, any shape),
    log scale, and the ``clamp`` (dashed) that cuts everything to its right."""
    check_sequence(samples, "samples", name="clamp_figure", mapping=True, minimum=1, item="setting")
    values = {str(k): to_numpy(v).ravel() for k, v in samples.items()}
    low = min(float(v.min()) for v in values.values())
    high = max(float(v.max()) for v in values.values())
    edges = np.geomspace(max(low, 1e-3) * 0.9, high * 1.1, 60)
    fig, ax = plt.subplots(figsize=(PAGE_WIDTH, 3.4))
    fig.subplots_adjust(left=0.1, right=0.97, bottom=0.16, top=0.8)
    for i, (label, v) in enumerate(values.items()):
        share = np.full(v.shape, 1.0 / v.size)
        label = f"{label}: {float((v > clamp).mean()):.0%} cut"
        ax.hist(v, bins=edges, histtype="step", lw=1.6, color=_NEUTRALS[i % len(_NEUTRALS)], weights=share, label=label)
    ax.axvline(clamp, color="black", ls="--", lw=1.0, label=f"clamp at {clamp:g}")
    ax.set_xscale("log")
    ticks = [t for t in (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50) if edges[0] <= t <= edges[-1]]
    ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set(xlabel="conserved outgoing flow Ô of a source, before the clamp", ylabel="share of sources")
    ax.grid(True, alpha=0.3)
    ax.legend(**ABOVE, ncol=2, handlelength=1.6)
    return fig


@page_figure
def accuracy_figure(
    rows: Sequence, *, chance: float | None = None, majority: float | None = None, xlabel: str = "held-out accuracy"
):
    """Horizontal bars of accuracy per variant, ``rows`` of ``(label, mechanism, live_span, recorded_span)``
    (a span: ``(mean, low, high)`` or None): the live run light, the recording full, in the mechanism's colour,
    with the range over the seeds, and lines at ``chance`` and at the ``majority`` class."""
    check_sequence(rows, "rows", name="accuracy_figure", minimum=1, item="row")
    fig, ax = plt.subplots(figsize=(PAGE_WIDTH, 1.3 + 0.5 * len(rows)))
    fig.subplots_adjust(left=0.36, right=0.97, bottom=0.3 if len(rows) < 5 else 0.16, top=0.85)
    handles = {}
    for i, (_label, mechanism, live, recorded) in enumerate(rows):
        y = len(rows) - 1 - i
        for offset, span, alpha, kind in ((0.18, live, 0.4, "live run"), (-0.18, recorded, 1.0, "recorded")):
            if span is not None:
                mean, lo, hi = span
                bar = ax.barh(y + offset, mean, 0.34, color=colour(mechanism), alpha=alpha, edgecolor="black", lw=0.4)
                ax.errorbar(mean, y + offset, xerr=[[mean - lo], [hi - mean]], color="black", lw=1.0, capsize=2)
                handles.setdefault(kind, bar)
    for value, style_, name in ((chance, ":", "chance"), (majority, (0, (4, 2)), "majority class")):
        if value is not None:
            handles[f"{name} {value:.2f}"] = ax.axvline(value, color="black", ls=style_, lw=1.0)
    ax.set_yticks(range(len(rows)), [r[0] for r in reversed(rows)])
    ax.set(xlabel=xlabel, xlim=(0.0, 1.0))
    ax.grid(True, axis="x", alpha=0.3)
    ax.legend(**ABOVE, ncol=2, handlelength=1.6, handles=list(handles.values()), labels=list(handles))
    return fig
