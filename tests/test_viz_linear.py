"""Chapter 2's figure helpers: entropy of attention rows, relative errors, and the figures built on them."""

import math

import matplotlib
import pytest
import torch

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from attnbook.viz import attention_maps_figure, feature_error_plot, relative_error, row_entropy  # noqa: E402


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
    with pytest.raises(ValueError, match="non-negative"):
        row_entropy(torch.tensor([0.5, -0.1, 0.6]))


def test_relative_error_values():
    exact = torch.tensor([3.0, 4.0])  # norm 5
    assert relative_error(exact, exact).item() == 0.0
    torch.testing.assert_close(
        relative_error(exact + torch.tensor([0.0, 1.0]), exact), torch.tensor(0.2, dtype=torch.float64)
    )


@pytest.mark.parametrize(
    "approx, exact, message",
    [
        (torch.ones(2, 3), torch.ones(3, 2), "shapes differ"),
        (torch.ones(2), torch.zeros(2), "all zeros"),
    ],
    ids=["shape-mismatch", "zero-exact"],
)
def test_relative_error_rejects_bad_input(approx, exact, message):
    with pytest.raises(ValueError, match=message):
        relative_error(approx, exact)


def test_attention_maps_figure_has_one_panel_per_map():
    maps = {"a": torch.rand(4, 6), "b": torch.rand(4, 6), "c": torch.rand(4, 6)}
    fig = attention_maps_figure(maps, suptitle="three")
    titles = [ax.get_title() for ax in fig.axes if ax.get_title()]
    assert titles == ["a", "b", "c"]
    plt.close(fig)
    with pytest.raises(ValueError, match="no maps"):
        attention_maps_figure({})


def test_feature_error_plot_draws_series_and_guide():
    ax = feature_error_plot([16, 64, 256], {"kernel": [0.4, 0.2, 0.1]})
    assert len(ax.lines) == 2  # the series and the R^(-1/2) guide
    guide = ax.lines[1].get_ydata()
    torch.testing.assert_close(torch.tensor(guide), torch.tensor([0.4, 0.2, 0.1], dtype=torch.float64))
    plt.close(ax.figure)
    with pytest.raises(ValueError, match="3 feature counts"):
        feature_error_plot([1, 2, 3], {"x": [1.0, 2.0]})
