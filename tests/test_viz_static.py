"""The kernel-free frame slider and the shared static plots."""

import html
import re

import matplotlib
import pytest
import torch

matplotlib.use("Agg")
import ipywidgets as widgets  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from attnbook.viz import attention_heatmap, frame_slider, scaling_plot  # noqa: E402
from attnbook.viz.plots import curves_and_maps, scaling_panels  # noqa: E402
from attnbook.viz.static import (  # noqa: E402
    enable_slider_keys,
    figure_to_png,
    frame_slider_html,
    set_slider_range,
)
from attnbook.viz.style import MIN_FONT, PAGE_WIDTH  # noqa: E402


def assert_readable(fig, *, min_panel_width: float = 1.8) -> None:
    """A figure drawn for the book's page: PAGE_WIDTH wide, nothing outside the canvas, every text at least
    MIN_FONT points, panels that do not overlap and keep a readable width, legends that cover no panel."""
    assert fig.get_figwidth() == pytest.approx(PAGE_WIDTH), f"drawn {fig.get_figwidth()} in wide"
    if not hasattr(fig.canvas, "get_renderer"):  # a Figure built without pyplot
        from matplotlib.backends.backend_agg import FigureCanvasAgg

        FigureCanvasAgg(fig)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    dpi = fig.dpi
    tight = fig.get_tightbbox(renderer)  # inches
    slack = 0.05
    assert tight.x0 >= -slack and tight.y0 >= -slack, f"something is drawn outside the canvas: {tight}"
    assert tight.x1 <= fig.get_figwidth() + slack and tight.y1 <= fig.get_figheight() + slack, f"cut off: {tight}"
    small = sorted(
        {
            (t.get_text(), t.get_fontsize())
            for t in fig.findobj(matplotlib.text.Text)
            if t.get_visible() and t.get_text().strip() and t.get_fontsize() < MIN_FONT
        }
    )
    assert not small, f"text below {MIN_FONT} pt: {small}"
    areas = [ax.get_window_extent(renderer) for ax in fig.axes if ax.get_visible()]
    panels = [a for a in areas if a.width / dpi >= 0.5]  # colour bars are thin on purpose
    for a in panels:
        assert a.width / dpi >= min_panel_width, f"a panel is squeezed to {a.width / dpi:.2f} in"
    for i, a in enumerate(areas):
        for b in areas[i + 1 :]:
            same = abs(a.x0 - b.x0) < 1 and abs(a.y0 - b.y0) < 1 and abs(a.x1 - b.x1) < 1 and abs(a.y1 - b.y1) < 1
            if not same:  # twin axes share their area
                assert not a.overlaps(b) or a.intersection(a, b).width < 1 or a.intersection(a, b).height < 1, (
                    f"panels overlap: {a} and {b}"
                )
    for legend in [lg for ax in fig.axes for lg in [ax.get_legend()] if lg is not None] + list(fig.legends):
        box = legend.get_window_extent(renderer)
        for a in areas:
            cut = a.intersection(a, box)
            assert cut is None or cut.width < 1 or cut.height < 1, f"a legend covers a panel: {box} over {a}"


def test_one_image_per_frame_and_only_the_start_frame_visible():
    out = frame_slider_html({"a": b"\x89PNG1", "b": b"\x89PNG2", "c": b"\x89PNG3"}, label="k", start=1)
    styles = re.findall(r'<img alt="[^"]*" style="display:(\w+)', out)
    assert styles == ["none", "block", "none"]
    assert 'max="2"' in out and 'value="1"' in out
    assert 'data-label-2="c"' in out
    assert "http" not in out  # self-contained: nothing loaded from anywhere


def test_labels_are_escaped():
    out = frame_slider_html({"<b>": b"x"}, label='a "quoted" label')
    assert "&lt;b&gt;" in out and "<b>" not in out
    assert html.escape('a "quoted" label') in out


@pytest.mark.parametrize(
    "frames, start, error, message",
    [
        ({}, 0, ValueError, "^frame_slider: frames must hold at least 1 frame, got 0 frames$"),
        ([b"x"], 0, TypeError, "^frame_slider: frames must be a mapping, got a list of length 1$"),
        ({"a": b"x"}, 3, ValueError, r"start must be an int in 0..0, got 3"),
        ({"a": b"x"}, 0.5, TypeError, "start must be an int"),
        ({"a": b"x"}, -1, ValueError, "start must be an int in 0..0"),
    ],
    ids=["no_frames", "frames_not_a_mapping", "start_past_the_end", "fractional_start", "negative_start"],
)
def test_bad_arguments(frames, start, error, message):
    with pytest.raises(error, match=message):
        frame_slider_html(frames, label="x", start=start)


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (dict(frames=[1, 2]), TypeError, "frames must be a mapping from labels to Figures, got a list of length 2$"),
        (dict(frames={}), ValueError, "frames must hold at least 1 figure, got 0 figures$"),
        (dict(label=3), TypeError, "label must be a str"),
        (dict(dpi=0), ValueError, "dpi must be an int >= 1"),
        (dict(dpi=float("nan")), TypeError, "dpi must be an int"),
        (dict(start="1"), TypeError, "start must be an int"),
    ],
    ids=["frames_not_a_mapping", "no_figures", "label_not_str", "zero_dpi", "nan_dpi", "string_start"],
)
def test_frame_slider_rejects_bad_arguments_with_one_wording(kwargs, error, message):
    fig = Figure()
    args = {"frames": {"a": fig}, "label": "x", **kwargs}
    with pytest.raises(error, match=rf"^frame_slider: {message}"):
        frame_slider(args.pop("frames"), **args)


def test_figure_to_png_checks_its_arguments():
    fig = Figure(figsize=(1, 1))
    assert figure_to_png(fig, dpi=20).startswith(b"\x89PNG")
    assert figure_to_png(fig, dpi=20, tight=False).startswith(b"\x89PNG")
    with pytest.raises(ValueError, match="dpi must be an int >= 1, got 0"):
        figure_to_png(fig, dpi=0)
    with pytest.raises(TypeError, match="^figure_to_png: fig must be a matplotlib Figure, got 'figure'$"):
        figure_to_png("figure")
    with pytest.raises(TypeError, match="tight must be True or False"):
        figure_to_png(fig, tight="no")


def test_set_slider_range_in_place_and_by_replacement():
    """In place without a container; with one, a new slider (same description and settings) replaces the old in
    the box, its value clamped: ipywidgets 8's End key only knows a slider's first range."""
    s = widgets.IntSlider(value=5, min=0, max=8, description="k", continuous_update=False)
    assert set_slider_range(s, 0, 8) is s
    assert set_slider_range(s, 0, 3) is s and (s.min, s.max, s.value) == (0, 3, 3)
    assert set_slider_range(s, 4, 10) is s and (s.min, s.max, s.value) == (4, 10, 4)
    box = widgets.VBox([widgets.Label("x"), s])
    new = set_slider_range(s, 0, 2, container=box)
    assert new is not s and box.children[1] is new and box.children[0].value == "x"
    assert (new.min, new.max, new.value, new.description, new.continuous_update) == (0, 2, 2, "k", False)
    with pytest.raises(ValueError, match=r"^set_slider_range: hi must be a finite number >= 3 \(lo\), got 1.0$"):
        set_slider_range(new, 3, 1)
    with pytest.raises(TypeError, match="^set_slider_range: lo must be a number, got '0'$"):
        set_slider_range(new, "0", 1)


def test_enable_slider_keys_outside_a_kernel_does_nothing(capsys):
    enable_slider_keys()
    assert capsys.readouterr().out == ""


def test_frame_slider_renders_and_closes_figures():
    figs = {}
    for a in (1, 2):
        fig, ax = plt.subplots()
        ax.plot([0, a])
        figs[str(a)] = fig
    before = len(plt.get_fignums())
    out = frame_slider(figs, label="slope")
    assert out.data.count("data:image/png;base64,") == 2
    assert len(plt.get_fignums()) == before - 2


def test_attention_heatmap_rejects_non_matrix():
    with pytest.raises(ValueError, match=r"^attention_heatmap: weights must have 2 dimensions \(N, M\), got a numpy"):
        attention_heatmap(torch.rand(2, 3, 4))
    ax = attention_heatmap(torch.rand(3, 4))
    assert ax.images[0].get_array().shape == (3, 4)
    plt.close("all")


def test_scaling_plot_checks_lengths():
    with pytest.raises(
        ValueError, match=r"^scaling_plot: series\['x'\] must hold 3 values \(one per N\), got 2 values$"
    ):
        scaling_plot([1, 2, 4], {"x": [1.0, 2.0]}, ylabel="s")
    ax = scaling_plot([1, 2, 4], {"x": [1.0, 2.0, 4.0]}, ylabel="s", reference_slopes=[1, 2])
    assert len(ax.lines) == 3
    plt.close("all")


def test_panel_figures_count_their_panels():
    with pytest.raises(ValueError, match="^scaling_panels: panels must hold 1 to 3 panels, got 4 panels$"):
        scaling_panels([1, 2], {str(i): {"flow": [1.0, 2.0]} for i in range(4)})
    with pytest.raises(ValueError, match="^scaling_panels: panels must hold 1 to 3 panels, got 0 panels$"):
        scaling_panels([1, 2], {})
    with pytest.raises(ValueError, match="^curves_and_maps: curves must hold at least 1 curve, got 0 curves$"):
        curves_and_maps({}, {"m": [[1.0]]})
    with pytest.raises(ValueError, match="^curves_and_maps: maps must hold at least 1 map, got 0 maps$"):
        curves_and_maps({"c": [1.0, 2.0]}, {})
    plt.close(scaling_panels([1, 2], {"time": {"flow": [1.0, 2.0]}}))


def test_explorer_images_show_at_the_size_they_are_drawn_for():
    """The Image widgets keep the figure's own width (PAGE_WIDTH at DPI): front-ends stretch images otherwise."""
    from attnbook.viz import flow, moh
    from attnbook.viz.style import DPI

    for image in (flow.flow_explorer().explorer.image, moh.routing_explorer(n_tokens=16).explorer.image):
        assert image.layout.width == f"{PAGE_WIDTH * DPI:.0f}px" and image.layout.max_width == "100%"
