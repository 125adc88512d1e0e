"""The one place that decides problem sizes for the book, the tests and the benchmarks.

Chapters run twice in their life: small, on a 2-core CPU in CI and on a laptop, and full size on a GPU
(Colab, a workstation). Nothing else in the project reads ``ATTNBOOK_FAST`` or asks whether CUDA is there
to choose a size; everything calls :func:`fast` or :func:`pick`.

``ATTNBOOK_FAST=1`` forces small sizes, ``ATTNBOOK_FAST=0`` forces full sizes; unset, sizes are full on a
GPU and small otherwise.
"""

from __future__ import annotations

import os
from typing import TypeVar

import torch

from ._checks import check_choice

__all__ = ["ENV_VAR", "fast", "pick", "device"]

ENV_VAR = "ATTNBOOK_FAST"
T = TypeVar("T")

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def fast() -> bool:
    """True when problem sizes should be small (CPU, CI), False for full size (GPU).

    Read at every call, so a test or a notebook can change ``ATTNBOOK_FAST`` on the fly.
    """
    raw = os.environ.get(ENV_VAR, "").strip().lower()
    if raw in _TRUE:
        return True
    if raw in _FALSE:
        return False
    if raw:
        check_choice(
            os.environ[ENV_VAR],
            f"the environment variable {ENV_VAR}",
            ("1", "0"),
            name="attnbook.config",
            why=" (1: small sizes, 0: full sizes; also true/false, yes/no, on/off)",
        )
    return not torch.cuda.is_available()


def pick(small: T, full: T) -> T:
    """``small`` when :func:`fast` is true, else ``full``."""
    return small if fast() else full


def device() -> torch.device:
    """``cuda`` when a GPU is available, else ``cpu``."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")
