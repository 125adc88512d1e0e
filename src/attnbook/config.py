"""The one place that decides problem sizes, and whether the speed annex runs.

**Sizes.** Chapters run small (a 2-core CPU in CI, a laptop) and full size (a GPU); everything that chooses a
size calls :func:`fast` or :func:`pick`. ``ATTNBOOK_FAST=1`` forces small sizes, ``ATTNBOOK_FAST=0`` full sizes;
unset, sizes are full on a GPU and small otherwise.

**The annex.** Code that exists only for speed lives in ``attnbook._fast``, reached by one dispatch line (as
timm's ``fused_attn`` switch reaches SDPA). :func:`plain` says whether it is off: ``ATTNBOOK_PLAIN=1``, or
:func:`set_plain` (which wins over the environment); off, no module of ``attnbook._fast`` is imported.

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

from ._checks import check_bool, check_choice

__all__ = ["ENV_VAR", "PLAIN_VAR", "fast", "pick", "device", "plain", "set_plain"]

#: The environment variable that picks the small (CI) sizes: ``ATTNBOOK_FAST=1``.
ENV_VAR = "ATTNBOOK_FAST"
#: The environment variable that turns the speed annex off: ``ATTNBOOK_PLAIN=1``.
PLAIN_VAR = "ATTNBOOK_PLAIN"
T = TypeVar("T")

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _flag(var: str) -> bool | None:
    """The environment variable ``var`` read as a flag: True, False, or None when unset."""
    raw = os.environ.get(var, "").strip().lower()
    if raw in _TRUE:
        return True
    if raw in _FALSE:
        return False
    if raw:
        what = "1: small sizes, 0: full sizes" if var == ENV_VAR else "1: plain torch only, 0: the annex too"
        why = f" ({what}; also true/false, yes/no, on/off)"
        check_choice(os.environ[var], f"the environment variable {var}", ("1", "0"), name="attnbook.config", why=why)
    return None


def fast() -> bool:
    """True when problem sizes should be small (CPU, CI), False for full size (GPU); read at every call.

    Example:
        >>> import os
        >>> from unittest import mock
        >>> from attnbook import config
        >>> with mock.patch.dict(os.environ, {"ATTNBOOK_FAST": "yes"}):
        ...     config.fast()
        True
    """
    flag = _flag(ENV_VAR)
    return not torch.cuda.is_available() if flag is None else flag


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


_plain: list[bool | None] = [None]  # set_plain's setting; None: the environment decides


def plain() -> bool:
    """True when the speed annex ``attnbook._fast`` is off: :func:`set_plain`'s True or False, else
    ``ATTNBOOK_PLAIN`` (unset: the annex is on); read at every call.

    Example:
        >>> import os
        >>> from unittest import mock
        >>> from attnbook import config
        >>> with mock.patch.dict(os.environ, {"ATTNBOOK_PLAIN": "1"}):
        ...     config.plain()
        True
    """
    if _plain[0] is not None:
        return _plain[0]
    return bool(_flag(PLAIN_VAR))


def set_plain(enable: bool | None) -> None:
    """Turn the speed annex off (True) or on (False) for this process, or leave it to ``ATTNBOOK_PLAIN`` (None).

    Example:
        >>> import torch, attnbook
        >>> from attnbook import config
        >>> q, k, v = (torch.randn(1, 2, 100, 8) for _ in range(3))
        >>> fast = attnbook.linear_attention(q, k, v, is_causal=True)
        >>> config.set_plain(True)  # the chunked form of chapter 2 only
        >>> torch.allclose(attnbook.linear_attention(q, k, v, is_causal=True), fast, atol=1e-5)
        True
        >>> config.set_plain(None)  # back to the environment's choice
    """
    if enable is not None:
        check_bool(enable, "enable", name="attnbook.config.set_plain")
    _plain[0] = enable
