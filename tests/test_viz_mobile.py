"""Chapter 4's figures and their plumbing (attnbook.viz.mobile): what they compute, that they are drawn for the
page (PAGE_WIDTH, readable text, nothing cut off), and that wrong input gets a message instead of a traceback
from inside matplotlib."""

import json

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from test_viz_static import assert_readable  # noqa: E402

import attnbook  # noqa: E402
from attnbook.viz import mobile as vm  # noqa: E402


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def _span(mean, spread=0.01):
    return (mean, mean - spread, mean + spread)


def _spans(acc, rank):
    return {d: {"accuracy": _span(a), "rank": _span(r)} for d, a, r in zip((2, 4, 8), acc, rank, strict=True)}


LIVE = {"linear": _spans((0.5, 0.77, 0.94), (1.0, 2.1, 3.3)), "mobile": _spans((0.37, 0.47, 0.55), (1.2, 1.6, 2.4))}
RECORDED = {"linear": _spans((0.67, 0.95, 1.0), (1.0, 2.2, 3.6)), "mobile": _spans((0.92, 1.0, 1.0), (1.3, 1.9, 2.6))}


# ------------------------------------------------------------------------------------------- output_sizes


def test_output_sizes_is_the_rms_ratio_of_the_registry_layer():
    sizes = vm.output_sizes([4, 16], mechanisms=["linear", "mobile"], d_model=8, n_heads=2, seed=3)
    assert set(sizes) == {"linear", "mobile"} and all(len(v) == 2 for v in sizes.values())
    x = torch.randn(1, 16, 8, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    torch.manual_seed(3)
    layer = attnbook.mechanisms.get("mobile").module(8, 2, dtype=torch.float64).eval()
    with torch.no_grad():
        out = layer(x[:, :4])
    expected = (out.pow(2).mean().sqrt() / x[:, :4].pow(2).mean().sqrt()).item()
    assert sizes["mobile"][0] == pytest.approx(expected, rel=1e-12)


def test_mobile_outputs_grow_with_the_length_and_linear_ones_do_not():
    sizes = vm.output_sizes([16, 256], d_model=16, n_heads=4)
    assert sizes["mobile"][1] / sizes["mobile"][0] > 4  # rows sum to about a N / H
    for name in ("linear", "flow"):
        assert 0.5 < sizes[name][1] / sizes[name][0] < 2  # rows sum to about one (or a)


def test_output_sizes_leaves_the_global_random_state_alone_and_repeats():
    torch.manual_seed(123)
    before = torch.random.get_rng_state()
    first = vm.output_sizes([8], d_model=8, n_heads=2, seed=1)
    assert torch.equal(torch.random.get_rng_state(), before)
    assert vm.output_sizes([8], d_model=8, n_heads=2, seed=1) == first


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(lengths=[]), "lengths"),
        (dict(lengths=[0]), "lengths"),
        (dict(lengths=[4], mechanisms=["nope"]), "nope"),
        (dict(lengths=[4], n_heads=0), "n_heads"),
    ],
)
def test_output_sizes_rejects_bad_input_with_a_message(kwargs, message):
    with pytest.raises((ValueError, TypeError), match=message):
        vm.output_sizes(**kwargs)


# ------------------------------------------------------------------------------------------------ figures


def test_head_outputs_figure_draws_one_panel_per_head_with_anchors_and_ranks():
    g = torch.Generator().manual_seed(0)
    pts = {"linear, D = 2": torch.rand(50, 2, generator=g), "mobile, D = 2": torch.rand(50, 2, generator=g)}
    fig = vm.head_outputs_figure(
        pts, mechanism="linear", anchors={"linear, D = 2": torch.eye(2)}, ranks={"linear, D = 2": 1.0}
    )
    assert_readable(fig)
    axes = [ax for ax in fig.axes if ax.get_visible()]
    assert len(axes) == 2
    assert "effective rank 1.00" in axes[0].get_title()
    assert "effective rank" not in axes[1].get_title()
    assert len(axes[0].lines) == 1 and len(axes[1].lines) == 0  # the segment between the fixed vectors


def test_head_outputs_figure_hides_the_spare_panel_of_an_odd_count():
    pts = {f"head {h}": torch.rand(20, 2) for h in range(3)}
    fig = vm.head_outputs_figure(pts, mechanism="mobile")
    assert_readable(fig)
    assert sum(ax.get_visible() for ax in fig.axes) == 3


def test_head_outputs_figure_rejects_points_that_are_not_two_dimensional():
    with pytest.raises(ValueError, match="shape"):
        vm.head_outputs_figure({"x": torch.rand(5, 3)}, mechanism="linear")


def test_output_growth_figure_draws_each_mechanism_and_the_guide():
    lengths = [16, 64, 256]
    sizes = {"linear": [0.15, 0.14, 0.12], "mobile": [0.3, 1.0, 2.7]}
    fig = vm.output_growth_figure(lengths, sizes, reference=[0.3, 1.2, 4.8], reference_label="grows like N")
    assert_readable(fig)
    ax = fig.axes[0]
    assert [line.get_label() for line in ax.lines] == ["linear", "mobile", "grows like N"]
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"


def test_head_width_figure_live_and_recorded():
    fig = vm.head_width_figure(LIVE, RECORDED, chance=0.125)
    assert_readable(fig)
    acc, rank = fig.axes[:2]
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert {"linear, live", "mobile, live", "linear, recorded", "mobile, recorded"} <= set(labels)
    assert any("chance" in s for s in labels) and any("D - 1" in s for s in labels)
    assert acc.get_ylim()[1] == pytest.approx(1.05)
    assert len(rank.containers) == 4  # one error-bar series per mechanism and source


def test_head_width_figure_live_only():
    fig = vm.head_width_figure(LIVE)
    assert_readable(fig)
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert not any("recorded" in s for s in labels)


def test_head_width_figure_reads_the_recording_through_claims():
    from attnbook.lab import claims, recordings

    recorded = recordings.load("claims/heads_cpu_recorded.json")
    if recorded is None:
        pytest.skip("no recording in this checkout")
    spans = claims.head_width_spans(recorded)
    assert spans["linear"][2]["rank"][0] == pytest.approx(1.0, abs=0.01)
    assert_readable(vm.head_width_figure(spans, spans, chance=recorded["chance"]))
    json.dumps(spans)  # plain numbers


def test_head_width_figure_rejects_an_empty_input():
    with pytest.raises((ValueError, TypeError), match="live"):
        vm.head_width_figure({})


def test_every_figure_is_closed_from_pyplot_so_a_notebook_shows_it_once():
    figs = [
        vm.head_outputs_figure({"a": torch.rand(5, 2)}, mechanism="linear"),
        vm.output_growth_figure([1, 2], {"linear": [1.0, 2.0]}),
        vm.head_width_figure(LIVE),
    ]
    open_numbers = plt.get_fignums()
    assert all(f.number not in open_numbers for f in figs)
    for f in figs:  # still renders: a closed figure keeps its canvas
        assert_readable(f)
