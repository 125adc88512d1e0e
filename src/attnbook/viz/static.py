"""Figures as PNG bytes: frames for the website, and what the live explorers need in every front-end.

Exploring without a kernel: a static website cannot run Python, so an ipywidgets control there would silently
do nothing. Instead a chapter renders a handful of frames when it is executed (on every build) and
:func:`frame_slider` packs them into one self-contained HTML output: PNG images inlined as data URIs and a
plain ``<input type="range">`` whose inline handler shows one frame at a time. Nothing is loaded from
anywhere; it works in Jupyter, Colab and on the website alike.

Exploring with a kernel (the explorers of :mod:`attnbook.viz.flow` and :mod:`attnbook.viz.moh`) in every
supported front-end -- JupyterLab 4 and Notebook 7 with ipywidgets 8, the classic notebook 6.5 with
ipywidgets 7.7.1 as on Colab:

- figures go into an ``ipywidgets.Image`` as PNG bytes (:func:`figure_to_png`): an ``Output`` widget stays
  empty in the classic notebook with ipywidgets 7.7.1;
- :func:`set_slider_range` changes a slider's range by replacing the slider: ipywidgets 8's slider
  (noUiSlider) keeps its first range for the Home and End keys however often ``min``/``max`` change;
- :func:`enable_slider_keys` lets the arrow keys move ipywidgets 8 sliders in Notebook 7, whose command-mode
  shortcuts (ArrowLeft/ArrowRight collapse and expand headings) otherwise swallow them.
"""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Mapping

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from .._checks import check_bool, check_instance, check_int, check_number, check_sequence

__all__ = ["frame_slider", "frame_slider_html", "figure_to_png", "set_slider_range", "enable_slider_keys"]


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

    When the range really changes and ``container`` (the Box holding the slider) is given, a new slider with
    the same description, style, step and observers' target replaces the old one in ``container``: the
    noUiSlider behind ipywidgets 8's sliders keeps its first range for the Home and End keys, so a changed
    ``max`` would be reachable by arrow keys and dragging but not by End. Without a container the range is set
    in place. The caller observes the returned slider (a new one has no observers).
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
    """Let the arrow, Page, Home and End keys move ipywidgets 8 sliders in Notebook 7 (displays a small script).

    Notebook 7 handles keys in the capture phase, before the focused slider sees them, and its command-mode
    shortcuts take ArrowLeft/ArrowRight (collapse/expand headings) and ArrowUp/ArrowDown (select cells); a
    listener on ``window`` marks slider keys as handled first, which those shortcuts respect. JupyterLab,
    the classic notebook and Colab do not need it and are unaffected. Outside a kernel this does nothing.
    """
    try:
        from IPython import get_ipython
        from IPython.display import Javascript, display
    except ImportError:  # pragma: no cover - IPython comes with ipywidgets
        return
    shell = get_ipython()
    if shell is None or not hasattr(shell, "kernel"):
        return
    display(Javascript(_SLIDER_KEYS_JS))


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
    """Display matplotlib figures as frames behind a slider; returns an ``IPython.display.HTML``.

    Args:
        frames: mapping from the label of each value (shown next to the slider) to a matplotlib Figure.
            The figures are rendered and closed.
        label: what the slider changes, e.g. ``"similarity"``.
        start: index of the frame shown first.
    """
    from IPython.display import HTML

    what = "a mapping from labels to Figures"
    check_sequence(frames, "frames", name="frame_slider", mapping=True, what=what)
    check_instance(label, "label", str, name="frame_slider", what="a str")
    dpi = check_int(dpi, "dpi", name="frame_slider", minimum=1)
    check_sequence(frames, "frames", name="frame_slider", mapping=True, minimum=1, item="figure")
    start = check_int(start, "start", name="frame_slider", minimum=0, maximum=len(frames) - 1)
    pngs = {}
    for name, fig in frames.items():
        pngs[name] = figure_to_png(fig, dpi=dpi)
        plt.close(fig)
    return HTML(frame_slider_html(pngs, label=label, start=start))
