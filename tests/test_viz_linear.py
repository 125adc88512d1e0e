"""Chapter 2's figure helpers: entropy of attention rows, relative errors, and the figures built on them."""

import math

import matplotlib
import pytest
import torch

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from attnbook.viz import (  # noqa: E402
    attention_heatmap,
    attention_maps_figure,
    colour,
    feature_error_plot,
    line_style,
    relative_error,
    row_entropy,
    scaling_plot,
)
from attnbook.viz.linear import retrieval_toy, selectivity  # noqa: E402
from attnbook.viz.style import PAGE_WIDTH  # noqa: E402


def test_row_entropy_is_zero_for_one_hot_and_log_m_for_uniform_rows():
    w = torch.stack([torch.eye(5)[2], torch.full((5,), 0.2)])  # (2, 5)
    h = row_entropy(w)
    assert h.shape == (2,)
    torch.testing.assert_close(h, torch.tensor([0.0, math.log(5)]), rtol=1e-6, atol=1e-7)


def test_row_entropy_keeps_leading_dimensions_and_orders_by_spread():
    sharp = torch.softmax(4.0 * torch.randn(2, 3, 7, 9), dim=-1)
    flat = torch.softmax(0.1 * torch.randn(2, 3, 7, 9), dim=-1)
    h_sharp, h_flat = row_entropy(sharp), row_entropy(flat)
    assert h_sharp.shape == (2, 3, 7)
    assert (h_sharp < h_flat).all()
    assert (h_flat <= math.log(9) + 1e-6).all() and (h_sharp >= 0).all()


def test_row_entropy_keeps_float64():
    assert row_entropy(torch.full((3,), 1 / 3, dtype=torch.float64)).dtype == torch.float64


def test_row_entropy_rejects_negative_weights():
    with pytest.raises(ValueError, match="^row_entropy: weights must be non-negative, got a minimum of -0.1$"):
        row_entropy(torch.tensor([0.5, -0.1, 0.6]))
    with pytest.raises(ValueError, match="^row_entropy: weights must be non-negative, got a minimum of nan$"):
        row_entropy(torch.tensor([0.5, float("nan")]))


@pytest.mark.parametrize(
    "weights, error, message",
    [
        ([0.5, 0.5], TypeError, "weights must be a torch.Tensor, got a list of length 2"),
        (torch.tensor(0.5), ValueError, r"weights must have at least 1 dimensions \(\.\.\., N, M\), got a float32"),
    ],
    ids=["not-a-tensor", "zero-dimensional"],
)
def test_row_entropy_rejects_what_is_not_rows_of_weights(weights, error, message):
    with pytest.raises(error, match=f"^row_entropy: {message}"):
        row_entropy(weights)


def test_relative_error_values():
    exact = torch.tensor([3.0, 4.0])  # norm 5
    assert relative_error(exact, exact).item() == 0.0
    torch.testing.assert_close(
        relative_error(exact + torch.tensor([0.0, 1.0]), exact), torch.tensor(0.2, dtype=torch.float64)
    )


@pytest.mark.parametrize(
    "approx, exact, message",
    [
        (
            torch.ones(2, 3),
            torch.ones(3, 2),
            r"exact must have the shape \(2, 3\) of approx, got a float32 tensor of shape \(3, 2\)",
        ),
        (torch.ones(2), torch.zeros(2), r"exact must not be all zeros \(the relative error would be undefined\)"),
    ],
    ids=["shape-mismatch", "zero-exact"],
)
def test_relative_error_rejects_bad_input(approx, exact, message):
    with pytest.raises(ValueError, match=f"^relative_error: {message}"):
        relative_error(approx, exact)


def test_attention_maps_figure_has_one_panel_per_map():
    maps = {"a": torch.rand(4, 6), "b": torch.rand(4, 6), "c": torch.rand(4, 6)}
    fig = attention_maps_figure(maps, suptitle="three")
    titles = [ax.get_title() for ax in fig.axes if ax.get_title()]
    assert titles == ["a", "b", "c"]
    plt.close(fig)
    with pytest.raises(ValueError, match="^attention_maps_figure: maps must hold at least 1 map, got 0 maps$"):
        attention_maps_figure({})


def test_feature_error_plot_draws_series_and_guide():
    ax = feature_error_plot([16, 64, 256], {"kernel": [0.4, 0.2, 0.1]})
    assert len(ax.lines) == 2  # the series and the R^(-1/2) guide
    guide = ax.lines[1].get_ydata()
    torch.testing.assert_close(torch.tensor(guide), torch.tensor([0.4, 0.2, 0.1], dtype=torch.float64))
    plt.close(ax.figure)
    message = r"^feature_error_plot: errors\['x'\] must hold 3 values \(one per feature count R\), got 2 values$"
    with pytest.raises(ValueError, match=message):
        feature_error_plot([1, 2, 3], {"x": [1.0, 2.0]})
    with pytest.raises(ValueError, match="^feature_error_plot: errors must hold at least 1 series, got 0 series$"):
        feature_error_plot([1, 2, 3], {})


# --- the retrieval toy shared by chapters 2 and 3 -------------------------------------------------------------


def _chapter_2_toy(n_toy=24, D=16):
    """The toy exactly as chapter 2 wrote it inline before it moved into the package."""
    gen = torch.Generator().manual_seed(0)
    base_k = torch.randn(1, 1, n_toy, D, dtype=torch.float64, generator=gen)
    base_q = base_k + 0.6 * torch.randn(base_k.shape, dtype=torch.float64, generator=gen)
    base_q, base_k = (x / x.norm(dim=-1, keepdim=True) * D**0.25 for x in (base_q, base_k))
    v = torch.randn(1, 1, n_toy, D, dtype=torch.float64, generator=gen)
    return base_q, base_k, v


def test_retrieval_toy_defaults_are_chapter_2s_numbers():
    for got, want in zip(retrieval_toy(), _chapter_2_toy(), strict=True):
        assert got.shape == (1, 1, 24, 16) and got.dtype == torch.float64
        assert torch.equal(got, want)


def test_retrieval_toy_refuses_a_dtype_that_is_not_floating():
    """dtype=torch.int64 rounded the toy to 0, -1 and 1 without a word; a string failed as a device string."""
    with pytest.raises(ValueError, match=r"^retrieval_toy: dtype must be a floating-point dtype, got torch.int64$"):
        retrieval_toy(dtype=torch.int64)
    with pytest.raises(TypeError, match=r"^retrieval_toy: dtype must be a torch.dtype, got 'float32'$"):
        retrieval_toy(dtype="float32")
    assert all(x.dtype == torch.float32 for x in retrieval_toy(dtype=torch.float32))


def test_retrieval_toy_scores_are_cosines_and_the_diagonal_is_the_best_match():
    q, k, _ = retrieval_toy(n_tokens=12, dim=8, noise=0.3, seed=3)
    scores = (q @ k.transpose(-2, -1))[0, 0] / math.sqrt(8)  # (12, 12)
    cos = torch.nn.functional.cosine_similarity(q[0, 0, :, None], k[0, 0, None, :], dim=-1)
    torch.testing.assert_close(scores, cos)
    assert torch.equal(scores.argmax(dim=-1), torch.arange(12))  # small noise: each query's own key wins


def test_retrieval_toy_is_reproducible_and_seeded():
    a, b, c = retrieval_toy(seed=5), retrieval_toy(seed=5), retrieval_toy(seed=6)
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert not torch.equal(a[1], c[1])
    assert retrieval_toy(dtype=torch.float32)[0].dtype == torch.float32


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"n_tokens": 0}, ValueError, "n_tokens must be an int >= 1, got 0"),
        ({"dim": 2.0}, TypeError, "dim must be an int"),
        ({"noise": -0.1}, ValueError, "noise must be"),
    ],
    ids=["no-tokens", "float-dim", "negative-noise"],
)
def test_retrieval_toy_rejects_bad_arguments(kwargs, error, message):
    with pytest.raises(error, match=message):
        retrieval_toy(**kwargs)


def test_selectivity_of_a_look_up_and_of_a_uniform_map():
    n = 6
    assert selectivity(torch.eye(n)) == (0.0, 1.0)
    h, d = selectivity(torch.full((2, n, n), 1 / n, dtype=torch.float64))
    assert math.isclose(h, math.log(n), rel_tol=1e-12) and math.isclose(d, 1 / n, rel_tol=1e-12)


@pytest.mark.parametrize(
    "weights, error",
    [(torch.rand(3, 4), ValueError), (torch.rand(4), ValueError), ([[1.0]], TypeError)],
    ids=["not-square", "one-dimensional", "not-a-tensor"],
)
def test_selectivity_rejects_what_is_not_a_square_map(weights, error):
    with pytest.raises(error, match="selectivity: weights must be"):
        selectivity(weights)


# --- figures drawn for the page --------------------------------------------------------------------------------


def test_shared_maps_use_one_colour_scale_and_one_colour_bar():
    flat, sharp = torch.full((5, 5), 0.2), torch.eye(5) * 0.9
    fig = attention_maps_figure({"flat": flat, "sharp": sharp}, shared=True)
    images = [ax.images[0] for ax in fig.axes if ax.images]
    assert len(images) == 2
    assert [im.get_clim() for im in images] == [(0.0, pytest.approx(0.9))] * 2
    assert len(fig.axes) == 3  # two panels and a single colour bar
    plt.close(fig)
    fig = attention_maps_figure({"flat": flat, "sharp": sharp})
    assert [im.get_clim()[1] for ax in fig.axes for im in ax.images] == [pytest.approx(0.2), pytest.approx(0.9)]
    assert len(fig.axes) == 4  # a bar per panel
    plt.close(fig)


def test_maps_are_drawn_for_the_page_and_wrap_instead_of_shrinking():
    maps = {name: torch.rand(4, 4) for name in "abcde"}
    fig = attention_maps_figure(maps)
    assert fig.get_size_inches()[0] == pytest.approx(PAGE_WIDTH)
    rows = {round(ax.get_position().y0, 3) for ax in fig.axes if ax.images}
    assert len(rows) == 3  # 2 + 2 + 1 panels on three rows
    assert len([ax for ax in fig.axes if ax.images]) == 5  # the sixth, empty cell is removed
    plt.close(fig)
    fig = attention_maps_figure(maps, ncols=5, labels=list("pqrs"))
    assert len({round(ax.get_position().y0, 3) for ax in fig.axes if ax.images}) == 1
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == list("pqrs")
    plt.close(fig)
    with pytest.raises(ValueError, match="ncols must be an int >= 1"):
        attention_maps_figure(maps, ncols=0)


def test_heatmap_vmax_and_scaling_plot_styles():
    ax = attention_heatmap(torch.rand(3, 3) * 0.1, vmax=0.8, colorbar=False)
    assert ax.images[0].get_clim() == (0.0, 0.8) and len(ax.figure.axes) == 1
    plt.close(ax.figure)
    with pytest.raises(ValueError, match="vmax must be"):
        attention_heatmap(torch.rand(3, 3), vmax=0)
    ax = scaling_plot(
        [1, 2, 4],
        {"linear": [1.0, 2.0, 4.0], "linear, causal": [1.0, 2.0, float("nan")]},
        ylabel="s",
        styles={"linear": line_style("linear"), "linear, causal": line_style("linear_causal")},
    )
    solid, dashed = ax.lines
    assert solid.get_color() == colour("linear") == dashed.get_color()
    assert solid.get_linestyle() == "-" and dashed.get_linestyle() == "--"
    plt.close(ax.figure)


def test_guide_lines_are_grey_and_told_apart():
    ax = scaling_plot([1, 2, 4], {"linear": [1.0, 2.0, 4.0]}, ylabel="s", reference_slopes=[1, 2])
    guides = ax.lines[1:]
    assert [g.get_label() for g in guides] == ["∝ N^1", "∝ N^2"]
    assert len({g.get_linestyle() for g in guides}) == 2 and all(g.get_color() == "grey" for g in guides)
    plt.close(ax.figure)


def test_cost_figure_draws_one_panel_per_entry_at_the_page_width():
    from attnbook.viz.plots import cost_figure

    ns = [1, 2, 4]
    panels = {
        "time": ("seconds", {"softmax": [1.0, 4.0, 16.0], "linear": [1.0, 2.0, float("nan")]}),
        "memory": ("MiB", {"softmax": [1.0, 4.0, 16.0], "never": [float("nan")] * 3}),
        "third": ("x", {"linear": [1.0, 2.0, 4.0]}),
    }
    fig = cost_figure(ns, panels, styles={"softmax": line_style("softmax")}, reference_slopes=[2])
    assert fig.get_figwidth() == pytest.approx(PAGE_WIDTH) and len(fig.axes) == 3  # 2 per row, the 4th removed
    assert [ax.get_title() for ax in fig.axes] == ["time", "memory", "third"]
    memory = fig.axes[1]
    assert [line.get_label() for line in memory.lines] == ["softmax", "∝ N^2"]  # all-NaN series left out
    assert memory.lines[0].get_color() == colour("softmax")
    plt.close(fig)
    with pytest.raises(ValueError, match="panels must hold at least 1 panel"):
        cost_figure(ns, {})
    with pytest.raises(ValueError, match="must hold 2 parts"):
        cost_figure(ns, {"time": ("s",)})


def test_temperature_explorer_redraws_its_image_when_beta_moves():
    from attnbook.viz.linear import temperature_explorer

    seen = []

    def maps_at(beta):
        seen.append(beta)
        w = torch.softmax(beta * torch.eye(4), dim=-1)
        return {"softmax": w, "flat": torch.full((4, 4), 0.25)}

    open_before = len(plt.get_fignums())
    box = temperature_explorer(maps_at, value=8.0)
    slider, image = box.children
    assert slider.description == "β" and slider.value == pytest.approx(8.0) and seen == [8.0]
    first = bytes(image.value)
    assert first.startswith(b"\x89PNG")
    slider.value = 0.5
    assert seen[-1] == pytest.approx(0.5) and bytes(image.value) != first
    assert len(plt.get_fignums()) == open_before  # every figure closed after it was drawn
    with pytest.raises(ValueError, match="value must be"):
        temperature_explorer(maps_at, value=1000.0)
    with pytest.raises(TypeError, match="maps_at must be"):
        temperature_explorer(3)


def test_heat_maps_refuse_labels_that_do_not_match_and_a_list_of_maps():
    """One label on a 3 x 3 map, or 3 on a 3 x 4 one, mislabelled the ticks without a word; a list of maps failed
    with AttributeError 'items'."""
    from attnbook.viz.linear import attention_maps_figure
    from attnbook.viz.plots import attention_heatmap

    with pytest.raises(ValueError, match=r"^attention_heatmap: queries must hold 3 labels, got 1 label$"):
        attention_heatmap(torch.rand(3, 3), queries=["x"])
    with pytest.raises(ValueError, match=r"^attention_heatmap: keys must hold 4 labels, got 3 labels$"):
        attention_heatmap(torch.rand(3, 4), keys=list("abc"))
    with pytest.raises(TypeError, match=r"^attention_maps_figure: maps must be a mapping, got a list"):
        attention_maps_figure([torch.rand(3, 3)])
    with pytest.raises(ValueError, match=r"^attention_heatmap: queries must hold 3 labels"):
        attention_maps_figure({"a": torch.rand(3, 3)}, labels=["x"])


@pytest.mark.parametrize("shape", [(0, 0), (0, 3, 3)], ids=["no_rows", "empty_batch"])
def test_selectivity_refuses_empty_weights(shape):
    """Means over nothing are NaN: an empty map is refused, with its shape."""
    with pytest.raises(ValueError, match=r"^selectivity: weights must not be empty .*got a float32 tensor of shape"):
        selectivity(torch.zeros(shape))
