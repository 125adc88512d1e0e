"""Exploring without a kernel: figures rendered at build time behind an HTML range slider.

A static website cannot run Python, so an ipywidgets control there would silently do nothing. Instead a
chapter renders a handful of frames when it is executed (on every build) and :func:`frame_slider` packs them
into one self-contained HTML output: PNG images inlined as data URIs and a plain ``<input type="range">``
whose inline handler shows one frame at a time. Nothing is loaded from anywhere; it works in Jupyter,
Colab and on the website alike.
"""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Mapping

import matplotlib.pyplot as plt

__all__ = ["frame_slider", "frame_slider_html", "figure_to_png"]


def figure_to_png(fig, *, dpi: int = 90) -> bytes:
    """Render a matplotlib Figure to PNG bytes."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    return buf.getvalue()


_ONINPUT = (
    "var r=this.closest('.attnbook-frames');"
    "r.querySelectorAll('img').forEach(function(im,i){im.style.display=(i==this.value)?'block':'none';},this);"
    "r.querySelector('.attnbook-frame-value').textContent=this.getAttribute('data-label-'+this.value);"
)


def frame_slider_html(frames: Mapping[str, bytes], *, label: str, start: int = 0) -> str:
    """The HTML of a slider over PNG ``frames`` (a mapping from the value's label to PNG bytes)."""
    if not frames:
        raise ValueError("frame_slider: no frames given")
    names = [str(n) for n in frames]
    if not 0 <= start < len(names):
        raise ValueError(f"frame_slider: start={start} is outside 0..{len(names) - 1}")
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

    pngs = {}
    for name, fig in frames.items():
        pngs[name] = figure_to_png(fig, dpi=dpi)
        plt.close(fig)
    return HTML(frame_slider_html(pngs, label=label, start=start))
