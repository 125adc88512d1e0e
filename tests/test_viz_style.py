"""attnbook.viz.style: the page's width and text rules, and the stamp that lets the browser tests measure
figure text on the built pages."""

import io

import matplotlib

matplotlib.use("Agg")

import matplotlib as mpl  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
from matplotlib.backend_bases import FigureCanvasBase  # noqa: E402
from PIL import Image  # noqa: E402

from attnbook.viz import static, style  # noqa: E402


@pytest.fixture
def book_style(monkeypatch):
    """use_book_style() for one test: matplotlib's print_figure and rcParams are restored afterwards."""
    monkeypatch.setattr(FigureCanvasBase, "print_figure", FigureCanvasBase.print_figure)
    with mpl.rc_context():
        style.use_book_style()
        yield
    plt.close("all")


def _png_text(data: bytes) -> dict:
    return Image.open(io.BytesIO(data)).text


def test_a_figure_drawn_for_the_page_passes():
    with style.book_style():
        fig, ax = plt.subplots(figsize=(style.PAGE_WIDTH, 3))
        ax.plot([0, 1], [0, 1], **style.line_style("flow"))
        ax.set_title("flow")
    fig.draw_without_rendering()
    assert style.check_figure(fig) == []
    assert style.smallest_text(fig) == style.MIN_FONT  # tick labels
    plt.close(fig)


def test_a_figure_wider_than_the_page_is_reported():
    fig = plt.figure(figsize=(style.PAGE_WIDTH + 2, 3))
    problems = style.check_figure(fig)
    assert len(problems) == 1 and "wider than the page" in problems[0]
    plt.close(fig)


def test_text_below_the_minimum_is_reported_with_the_text():
    fig, ax = plt.subplots(figsize=(4, 3))
    ax.set_title("tiny title", fontsize=style.MIN_FONT - 2)
    problems = style.check_figure(fig)
    assert len(problems) == 1 and f"{style.MIN_FONT - 2:g} pt" in problems[0] and "tiny title" in problems[0]
    plt.close(fig)


def test_hidden_and_empty_text_does_not_count():
    fig, ax = plt.subplots(figsize=(4, 3))
    ax.set_title("")
    ax.text(0, 0, "invisible", fontsize=2, visible=False)
    ax.text(0, 0, "   ", fontsize=2)
    ax.tick_params(labelsize=style.MIN_FONT)
    fig.draw_without_rendering()
    assert style.check_figure(fig) == []
    plt.close(fig)


def test_check_figure_wants_a_figure():
    with pytest.raises(TypeError, match="^check_figure: fig must be a matplotlib Figure, got 3$"):
        style.check_figure(3)


def test_the_page_width_fits_the_measured_column():
    # 704 CSS px measured in chromium at a 1300 px window; a figure must not be wider (see style.PAGE_WIDTH).
    assert style.PAGE_WIDTH * style.DPI <= 704
    assert style.MIN_FONT * style.DPI / 72 >= 10 / 0.85  # readable even at the smallest allowed scale


@pytest.mark.parametrize("how", ["savefig", "inline", "figure_to_png"])
def test_every_png_is_stamped_with_its_smallest_text(book_style, how):
    fig, ax = plt.subplots(figsize=(5, 3))
    ax.plot([0, 1])
    ax.set_xlabel("x", fontsize=11)
    buf = io.BytesIO()
    if how == "savefig":
        fig.savefig(buf, format="png")
        data = buf.getvalue()
    elif how == "inline":  # what IPython's inline backend does
        fig.canvas.print_figure(buf, format="png", bbox_inches="tight")
        data = buf.getvalue()
    else:
        data = static.figure_to_png(fig)
    text = _png_text(data)
    assert text[style.STAMP_FONT] == f"{style.MIN_FONT:g}"  # the tick labels, drawn before the stamp
    assert text[style.STAMP_WIDTH] == "5"


def test_a_figure_that_breaks_the_rules_is_reported_on_stderr_and_still_stamped(book_style, capsys):
    fig, ax = plt.subplots(figsize=(9, 3))
    ax.tick_params(labelsize=6)
    fig.suptitle("too small")
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    err = capsys.readouterr().err
    assert "'too small'" in err and "wider than the page" in err and "6 pt" in err
    assert _png_text(buf.getvalue())[style.STAMP_FONT] == "6"


def test_other_formats_are_left_alone(book_style):
    fig = plt.figure(figsize=(9, 3))  # too wide, but an SVG is not a page figure here
    buf = io.BytesIO()
    fig.savefig(buf, format="svg")
    assert b"attnbook" not in buf.getvalue()


def test_use_book_style_sets_the_book_sizes(book_style):
    assert mpl.rcParams["figure.dpi"] == style.DPI
    assert mpl.rcParams["xtick.labelsize"] == style.MIN_FONT


def _figure(b: float):
    fig, ax = plt.subplots(figsize=(6, 2))
    ax.plot([0, 1, 2], [0, b, 1])
    ax.imshow([[0, b], [1, 2]])
    ax.bar([0, 1], [b, 2])
    ax.set_title(f"b = {b}")
    fig.draw_without_rendering()
    return fig


def test_one_figure_has_one_fingerprint_at_any_resolution(book_style):
    at_90 = _png_text(static.figure_to_png(_figure(1.0), dpi=90))[style.STAMP_FINGERPRINT]
    buf = io.BytesIO()
    _figure(1.0).canvas.print_figure(buf, format="png", dpi=100, bbox_inches="tight")
    assert _png_text(buf.getvalue())[style.STAMP_FINGERPRINT] == at_90


@pytest.mark.parametrize(
    "change",
    [
        lambda fig: fig.axes[0].lines[0].set_ydata([0, 2, 1]),
        lambda fig: fig.axes[0].images[0].set_data([[0, 1], [1, 2]]),
        lambda fig: fig.axes[0].patches[0].set_height(5),
        lambda fig: fig.axes[0].set_title("another title"),
        lambda fig: fig.set_size_inches(6, 3),
    ],
    ids=["line data", "image data", "bar height", "title", "size"],
)
def test_a_different_figure_has_a_different_fingerprint(change):
    fig = _figure(1.0)
    before = style.figure_fingerprint(fig)
    change(fig)
    fig.draw_without_rendering()
    assert style.figure_fingerprint(fig) != before
    plt.close("all")
