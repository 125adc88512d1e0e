"""A progress line that updates in place in Jupyter, Colab, an executed notebook and a terminal.

In a notebook kernel the line is one display output updated through its display id (what Jupyter, Colab and
nbclient -- hence nbmake and the website build -- all understand): the stored notebook keeps only the final
line, with no widget to render. Elsewhere it is rewritten in place on stderr with a carriage return.
"""

from __future__ import annotations

import sys
import time

from .._checks import check_int

__all__ = ["Progress"]

_WIDTH = 20  # characters of the bar


def _in_kernel() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


class Progress:
    """``done / total`` as a bar plus a short note, redrawn at most every ``interval`` seconds.

    Usage::

        bar = Progress(total=steps)
        for step in range(steps):
            ...
            bar.update(note=f"loss {loss:.2f}")
        bar.close()

    Args:
        total: the amount of work (e.g. training steps).
        enabled: False draws nothing (for tests and scripts that log otherwise).
        interval: seconds between redraws (the final one is always drawn).
    """

    def __init__(self, total: int, *, enabled: bool = True, interval: float = 0.25):
        self.total = check_int(total, "total", name="Progress", minimum=1)
        self.done = 0
        self.note = ""
        self.enabled = bool(enabled)
        self.interval = interval
        self._start = time.perf_counter()
        self._last = -float("inf")
        self._handle = None
        self._kernel = self.enabled and _in_kernel()

    def line(self) -> str:
        """The current line, e.g. ``[##########----------]  50%  100/200  2.3 s  flow seed 1``."""
        frac = min(self.done / self.total, 1.0)
        filled = round(frac * _WIDTH)
        bar = "#" * filled + "-" * (_WIDTH - filled)
        elapsed = time.perf_counter() - self._start
        text = f"[{bar}] {frac:4.0%}  {self.done}/{self.total}  {elapsed:.1f} s"
        return f"{text}  {self.note}" if self.note else text

    def _draw(self) -> None:
        if not self.enabled:
            return
        line = self.line()
        if self._kernel:
            from IPython.display import display

            if self._handle is None:
                self._handle = display({"text/plain": line}, raw=True, display_id=True)
            else:
                self._handle.update({"text/plain": line}, raw=True)
        else:
            sys.stderr.write("\r" + line)
            sys.stderr.flush()
        self._last = time.perf_counter()

    def update(self, n: int = 1, *, note: str | None = None) -> None:
        """Count ``n`` more units of work done; ``note`` replaces the text after the bar."""
        self.done += n
        if note is not None:
            self.note = note
        if time.perf_counter() - self._last >= self.interval:
            self._draw()

    def close(self) -> None:
        """Draw the final line (and end it with a newline on a terminal)."""
        self._draw()
        if self.enabled and not self._kernel:
            sys.stderr.write("\n")
            sys.stderr.flush()
