"""attnbook.viz.lm: chapter 7's figures summarise the runs they are given and are drawn for the page."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from attnbook.lab import generation  # noqa: E402
from attnbook.lab.lm import Run, Setup  # noqa: E402
from attnbook.viz import lm as lm_plots  # noqa: E402
from attnbook.viz.style import PAGE_WIDTH, colour  # noqa: E402


def runs():
    out = []
    for name, base in (("softmax", 4.0), ("flow", 4.2)):
        for seed, shift in enumerate((0.0, 0.2)):
            out.append(Run(name, seed, steps=[0, 10, 20], wall_s=[0.0, 1.0 + seed, 2.0 + seed],
                           valid_bpb=[8.0, base + 1 + shift, base + shift]))  # fmt: skip
    return out


def test_the_summary_is_mean_min_and_max_over_seeds_and_accepts_recorded_dicts():
    s = lm_plots.curve_summary(runs())
    assert s["softmax"]["mean"] == pytest.approx([8.0, 5.1, 4.1])
    assert s["flow"]["low"] == pytest.approx([8.0, 5.2, 4.2]) and s["flow"]["high"] == pytest.approx([8.0, 5.4, 4.4])
    assert s["softmax"]["wall_s"] == pytest.approx([0.0, 1.5, 2.5]) and s["softmax"]["seeds"] == 2
    recorded = [
        {"mechanism": r.mechanism, "steps": r.steps, "wall_s": r.wall_s, "valid_bpb": r.valid_bpb} for r in runs()
    ]
    assert lm_plots.curve_summary(recorded) == s


def test_runs_evaluated_at_different_steps_cannot_be_averaged():
    bad = runs()
    bad[1].steps = [0, 5, 20]
    message = r"^curve_summary: the steps of the 'softmax' runs must be equal, "
    message += r"got \[0, 10, 20\] for run 0 but \[0, 5, 20\] for run 1$"
    with pytest.raises(ValueError, match=message):
        lm_plots.curve_summary(bad)


def test_the_bpb_figure_is_page_wide_with_a_line_per_mechanism_in_its_colour():
    fig = lm_plots.plot_bpb(runs(), baselines={"unigram": 4.5, "bigram": 3.5})
    assert fig.get_size_inches()[0] == pytest.approx(PAGE_WIDTH)
    top, bottom = fig.axes
    lines = {ln.get_label(): ln for ln in top.get_lines()}
    assert lines["softmax"].get_color() == colour("softmax") and lines["flow"].get_color() == colour("flow")
    assert "bigram (3.50)" in lines
    low, high = top.get_ylim()
    assert low < 3.5 and 4.4 < high < 8.0  # the baselines show, the untrained 8 bits do not squash the rest
    plt.close(fig)


def test_the_generation_figure_plots_time_and_state_on_log_axes():
    result = generation.measure(Setup(dim=8, n_heads=2, n_layers=1), mechanism_names=["softmax", "linear"],
                                positions=[2, 16], repeats=1, warmup=0, progress=False)  # fmt: skip
    fig = lm_plots.plot_generation(result)
    assert fig.get_size_inches()[0] == pytest.approx(PAGE_WIDTH)
    assert all(ax.get_xscale() == "log" and ax.get_yscale() == "log" for ax in fig.axes)
    state = {ln.get_label(): ln.get_ydata() for ln in fig.axes[1].get_lines()}
    assert state["softmax"][1] / state["softmax"][0] == pytest.approx(16 / 2)  # the cache grows like t
    assert state["linear"][0] == state["linear"][1]
    plt.close(fig)


def test_the_generation_figure_draws_a_second_decoder_dotted_in_the_same_colours():
    result = generation.measure(Setup(dim=8, n_heads=2, n_layers=1), mechanism_names=["softmax", "linear"],
                                positions=[2, 16], repeats=1, warmup=0, decoders=("compiled", "eager"),
                                progress=False)  # fmt: skip
    fig = lm_plots.plot_generation(result, decoder="compiled", also="eager")
    top = fig.axes[0].get_lines()
    dotted = [ln for ln in top if ln.get_linestyle() == ":" and len(ln.get_xdata())]
    assert {ln.get_color() for ln in dotted} == {colour("softmax"), colour("linear")}
    _, eager = generation.series(result, "median_s", "eager")
    assert sorted(tuple(ln.get_ydata()) for ln in dotted) == sorted(tuple(1e3 * y for y in v) for v in eager.values())
    assert "dotted: eager" in [ln.get_label() for ln in top]
    plt.close(fig)
