"""Figures as PNG bytes: frames for the website, and the plumbing of the live explorers in every front-end.

A static website cannot run Python, so a chapter renders a handful of frames when it is executed and
:func:`frame_slider` packs them into one self-contained HTML output (PNG data URIs and a plain ``<input
type="range">``), which works in Jupyter, Colab and on the website alike. The live explorers (:class:`Explorer`)
work in JupyterLab 4 and Notebook 7 with ipywidgets 8 and in the classic notebook with ipywidgets 7.7.1 (Colab):
figures go into an ``ipywidgets.Image`` as PNG bytes (an ``Output`` widget stays empty in the classic notebook),
:func:`set_slider_range` re-ranges a slider by replacing it (ipywidgets 8 keeps a slider's first range for the
Home and End keys), and :func:`enable_slider_keys` keeps Notebook 7's shortcuts from swallowing slider keys.
"""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Mapping

import ipywidgets as widgets
import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from .._checks import check_bool, check_instance, check_int, check_number, check_sequence
from .style import DPI, PAGE_WIDTH

__all__ = ["frame_slider", "frame_slider_html", "figure_to_png", "set_slider_range", "enable_slider_keys"]
__all__ += ["slider", "status_html", "Explorer"]


def figure_to_png(fig, *, dpi: int = 90, tight: bool = True) -> bytes:
    """Render a matplotlib Figure to PNG bytes (``tight``: cropped to what is drawn, as Jupyter shows figures)."""
    check_int(dpi, "dpi", name="figure_to_png", minimum=1)
    check_bool(tight, "tight", name="figure_to_png")
    check_instance(fig, "fig", Figure, name="figure_to_png", what="a matplotlib Figure")
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight" if tight else None)
    return buf.getvalue()


def set_slider_range(slider, lo, hi, *, container=None):
    """Give an ipywidgets slider the range ``lo..hi`` (its value clamped into it); returns the slider to use.

    With ``container`` (the Box holding it), a changed range is a new slider with the same settings in its place
    (ipywidgets 8's noUiSlider keeps its first range for the Home and End keys), which the caller observes;
    without, the range is set in place.
    """
    check_number(lo, "lo", name="set_slider_range")
    check_number(hi, "hi", name="set_slider_range", minimum=lo, why=" (lo)")
    if slider.min == lo and slider.max == hi:
        return slider
    value = min(max(slider.value, lo), hi)
    if container is None:
        # widen before narrowing, so that min <= max holds at every moment (traitlets checks it)
        slider.max = max(hi, slider.min)
        slider.min = lo
        slider.max = hi
        return slider
    traits = ("description", "step", "disabled", "continuous_update", "readout", "readout_format", "orientation")
    kwargs = {name: getattr(slider, name) for name in traits if slider.has_trait(name)}
    new = type(slider)(value=value, min=lo, max=hi, style=dict(description_width=slider.style.description_width))
    for name, v in kwargs.items():
        setattr(new, name, v)
    container.children = tuple(new if child is slider else child for child in container.children)
    slider.close()
    return new


# Capture phase on window runs before Notebook 7's shortcut handler (capture phase on document), which skips
# events whose default is prevented; noUiSlider's own handler on the focused handle still runs.
_SLIDER_KEYS_JS = """(function () {
  if (window.__attnbookSliderKeys) { return; }
  window.__attnbookSliderKeys = true;
  var keys = ["ArrowLeft", "ArrowRight", "ArrowUp", "ArrowDown", "PageUp", "PageDown", "Home", "End"];
  window.addEventListener("keydown", function (event) {
    var target = event.target;
    if (keys.indexOf(event.key) >= 0 && target && target.closest && target.closest(".noUi-handle")) {
      event.preventDefault();
    }
  }, true);
})();"""


def enable_slider_keys() -> None:
    """Let the arrow, Page, Home and End keys move ipywidgets 8 sliders in Notebook 7, whose command-mode
    shortcuts (collapse headings, select cells) take them first: a small script marks them as handled on a
    focused slider. Other front-ends are unaffected; outside a kernel this does nothing."""
    from IPython import get_ipython
    from IPython.display import Javascript, display

    shell = get_ipython()
    if shell is not None and hasattr(shell, "kernel"):
        display(Javascript(_SLIDER_KEYS_JS))


def slider(kind, description: str, value, lo, hi, **kwargs):
    """An ipywidgets slider of class ``kind`` as the explorers use them: its whole description shown, and one
    redraw when a drag ends (``continuous_update=False``), not a queue of them on a slow kernel."""
    style = {"description_width": "initial"}
    return kind(value=value, min=lo, max=hi, description=description, style=style, continuous_update=False, **kwargs)


def status_html(text: str, inactive: Mapping[str, str], labels: Mapping[str, str]) -> str:
    """An explorer's status line: ``text``, then why each greyed-out control (name -> reason) cannot act."""
    notes = "".join(f"<br>⊘ <b>{labels[name]}</b> is greyed out: {reason}." for name, reason in inactive.items())
    return f"<div style='font-family:sans-serif;font-size:0.9em;line-height:1.4'>{text}{notes}</div>"


class Explorer:
    """What the live explorers share: ``controls`` (name -> widget, also read as attributes: ``ex.seed``), a
    ``status`` line and the figure as PNG bytes in ``image``, controls greyed out while they cannot act (the
    status line says why), and sliders whose range follows another control. A subclass sets ``layout`` (the
    box's children) and redraws in ``render``, which ``show`` ends."""

    def __init__(self, controls: dict):
        self.controls = controls
        self.status = widgets.HTML(value="")
        # shown at the size it is drawn for (the page's width at DPI), never stretched to the output area
        self.image = widgets.Image(
            format="png", value=b"", layout=widgets.Layout(width=f"{PAGE_WIDTH * DPI:.0f}px", max_width="100%")
        )
        self.inactive: dict[str, str] = {}
        self.renders = 0
        self.busy = False  # set while the explorer changes its own controls: their callbacks do nothing then

    def __getattr__(self, name: str):
        try:
            return self.__dict__["controls"][name]
        except KeyError:
            raise AttributeError(name) from None

    def rerange(self, name: str, lo, hi, container, callback) -> None:
        """Give slider ``name`` the range ``lo..hi`` (a new slider in ``container`` when it changes, observed by
        ``callback``: ipywidgets 8's End key would stop at the old maximum)."""
        new = set_slider_range(self.controls[name], lo, hi, container=container)
        if new is not self.controls[name]:
            new.observe(callback, names="value")
            self.controls[name] = new

    def show(self, fig, inactive: dict[str, str], status: str) -> None:
        """Grey out the ``inactive`` controls, draw ``fig`` into the image and ``status`` into the status line."""
        self.inactive = inactive
        for name, control in self.controls.items():
            control.disabled = name in inactive
        # the fixed layout keeps everything inside the canvas (tests: assert_readable), so no tight crop, which
        # would draw the figure twice
        self.image.value = figure_to_png(fig, dpi=DPI, tight=False)
        self.status.value = status
        self.renders += 1

    def box(self, cls):
        """The ``cls`` (a VBox) of this explorer's layout, with this explorer as its ``explorer`` attribute."""
        enable_slider_keys()  # Notebook 7: the arrow keys would select cells instead of moving the sliders
        box = cls(children=self.layout)
        box.explorer = self
        return box


_ONINPUT = (
    "var r=this.closest('.attnbook-frames');"
    "r.querySelectorAll('img').forEach(function(im,i){im.style.display=(i==this.value)?'block':'none';},this);"
    "r.querySelector('.attnbook-frame-value').textContent=this.getAttribute('data-label-'+this.value);"
)


def frame_slider_html(frames: Mapping[str, bytes], *, label: str, start: int = 0) -> str:
    """The HTML of a slider over PNG ``frames`` (a mapping from the value's label to PNG bytes)."""
    check_sequence(frames, "frames", name="frame_slider", mapping=True, minimum=1, item="frame")
    names = [str(n) for n in frames]
    start = check_int(start, "start", name="frame_slider", minimum=0, maximum=len(names) - 1)
    attrs = " ".join(f'data-label-{i}="{html.escape(n)}"' for i, n in enumerate(names))
    images = "".join(
        f'<img alt="{html.escape(label)} = {html.escape(n)}" '
        f'style="display:{"block" if i == start else "none"};max-width:100%" '
        f'src="data:image/png;base64,{base64.b64encode(png).decode("ascii")}">'
        for i, (n, png) in enumerate(zip(names, frames.values(), strict=True))
    )
    return (
        '<div class="attnbook-frames">'
        f'<label style="display:block;font-family:sans-serif;font-size:0.9em">{html.escape(label)}: '
        f'<input type="range" min="0" max="{len(names) - 1}" step="1" value="{start}" '
        f'aria-label="{html.escape(label)}" {attrs} oninput="{html.escape(_ONINPUT)}"> '
        f'<span class="attnbook-frame-value">{html.escape(names[start])}</span></label>'
        f"{images}"
        '<p style="font-size:0.8em;color:#666">Frames computed when this page was built; '
        "run the chapter to get the live explorer.</p></div>"
    )


def frame_slider(frames: Mapping[str, object], *, label: str, start: int = 0, dpi: int = 90):
    """Display matplotlib figures (``frames``: the label of each value -> Figure, rendered and closed) behind a
    slider over ``label`` (what it changes, e.g. ``"similarity"``), starting at frame ``start``; returns an
    ``IPython.display.HTML``."""
    from IPython.display import HTML

    what = "a mapping from labels to Figures"
    check_sequence(frames, "frames", name="frame_slider", mapping=True, what=what, minimum=1, item="figure")
    check_instance(label, "label", str, name="frame_slider", what="a str")
    dpi = check_int(dpi, "dpi", name="frame_slider", minimum=1)
    start = check_int(start, "start", name="frame_slider", minimum=0, maximum=len(frames) - 1)
    pngs = {name: figure_to_png(fig, dpi=dpi) for name, fig in frames.items()}
    for fig in frames.values():
        plt.close(fig)
    return HTML(frame_slider_html(pngs, label=label, start=start))
