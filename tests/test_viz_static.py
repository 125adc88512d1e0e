"""The kernel-free frame slider and the shared static plots."""

import html
import re

import matplotlib
import pytest
import torch

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from attnbook.viz import attention_heatmap, frame_slider, scaling_plot  # noqa: E402
from attnbook.viz.static import frame_slider_html  # noqa: E402


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


@pytest.mark.parametrize("frames, start, message", [({}, 0, "no frames"), ({"a": b"x"}, 3, "start=3")])
def test_bad_arguments(frames, start, message):
    with pytest.raises(ValueError, match=message):
        frame_slider_html(frames, label="x", start=start)


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
    with pytest.raises(ValueError, match=r"\(N, M\) matrix"):
        attention_heatmap(torch.rand(2, 3, 4))
    ax = attention_heatmap(torch.rand(3, 4))
    assert ax.images[0].get_array().shape == (3, 4)
    plt.close("all")


def test_scaling_plot_checks_lengths():
    with pytest.raises(ValueError, match="has 2 values for 3 lengths"):
        scaling_plot([1, 2, 4], {"x": [1.0, 2.0]}, ylabel="s")
    ax = scaling_plot([1, 2, 4], {"x": [1.0, 2.0, 4.0]}, ylabel="s", reference_slopes=[1, 2])
    assert len(ax.lines) == 3
    plt.close("all")
