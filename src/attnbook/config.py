"""The one place that decides problem sizes for the book, the tests and the benchmarks.

Chapters run twice in their life: small, on a 2-core CPU in CI and on a laptop, and full size on a GPU
(Colab, a workstation). Nothing else in the project reads ``ATTNBOOK_FAST`` or asks whether CUDA is there
to choose a size; everything calls :func:`fast` or :func:`pick`.

``ATTNBOOK_FAST=1`` forces small sizes, ``ATTNBOOK_FAST=0`` forces full sizes; unset, sizes are full on a
GPU and small otherwise.

Example:
    >>> import os
    >>> from unittest import mock
    >>> from attnbook import config
    >>> with mock.patch.dict(os.environ, {config.ENV_VAR: "1"}):  # as ATTNBOOK_FAST=1 would
    ...     N = config.pick(small=256, full=4096)
    >>> N
    256
"""

from __future__ import annotations

import os
from typing import TypeVar

import torch

from ._checks import check_choice

__all__ = ["ENV_VAR", "fast", "pick", "device"]

#: The environment variable that picks the small (CI) sizes: ``ATTNBOOK_FAST=1``.
ENV_VAR = "ATTNBOOK_FAST"
T = TypeVar("T")

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def fast() -> bool:
    """True when problem sizes should be small (CPU, CI), False for full size (GPU).

    Read at every call, so a test or a notebook can change ``ATTNBOOK_FAST`` on the fly.

    Example:
        >>> import os
        >>> from unittest import mock
        >>> from attnbook import config
        >>> with mock.patch.dict(os.environ, {"ATTNBOOK_FAST": "0"}):
        ...     config.fast()
        False
        >>> with mock.patch.dict(os.environ, {"ATTNBOOK_FAST": "yes"}):
        ...     config.fast()
        True
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
    """``small`` when :func:`fast` is true, else ``full``.

    Example:
        >>> import os
        >>> from unittest import mock
        >>> from attnbook import config
        >>> with mock.patch.dict(os.environ, {"ATTNBOOK_FAST": "0"}):
        ...     config.pick(small=(2, 64), full=(8, 1024))  # (batch, length) at full size
        (8, 1024)
    """
    return small if fast() else full


def device() -> torch.device:
    """``cuda`` when a GPU is available, else ``cpu``.

    Example:
        >>> import torch
        >>> from attnbook import config
        >>> x = torch.zeros(3, device=config.device())
        >>> x.device.type == ("cuda" if torch.cuda.is_available() else "cpu")
        True
    """
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")
