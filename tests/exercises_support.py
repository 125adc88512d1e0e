"""Helpers shared by the exercise checkers' tests (tests/test_exercises_*.py): what a verdict must say."""

from __future__ import annotations

import functools

import numpy as np
import torch

from attnbook.exercises import Result

# Answers of the wrong type: every checker must give feedback on each, never raise.
ODD_ANSWERS = ["a string", {"a": 1}, [1, 2, 3], object(), torch.zeros(3), np.zeros((2, 2)), complex(1, 2), True]
ODD_IDS = ["str", "dict", "list", "object", "tensor", "ndarray", "complex", "bool"]


def accepted(r: Result) -> None:
    assert isinstance(r, Result) and r.passed, r.message


def rejected(r: Result, *says: str) -> None:
    """Rejected, and the message contains every one of ``says``."""
    assert isinstance(r, Result) and not r.passed, r.message
    for s in says:
        assert s in r.message, f"{s!r} not in: {r.message}"


def diagnosis(r: Result) -> str:
    """The diagnosis of a rejection: what follows "It looks like" on its second line ("" if none)."""
    second = r.message.split("\n", 1)[1] if "\n" in r.message else ""
    return second.split("It looks like ", 1)[1] if "It looks like " in second else ""


def observation(r: Result) -> str:
    """What the numbers show, said on the second line before "It looks like" ("" if nothing)."""
    second = r.message.split("\n", 1)[1] if "\n" in r.message else ""
    return second.split("It looks like ", 1)[0].strip()


def diagnosed(r: Result, says: str) -> None:
    """Rejected with the diagnosis ``says`` on the second line, after "It looks like" (what the numbers show may
    come first: "Row 1 sums to 0.43 where it should sum to 1. It looks like ...")."""
    rejected(r)
    assert diagnosis(r), r.message
    assert says in diagnosis(r), r.message


def undiagnosed(r: Result) -> None:
    """Rejected without naming any known mistake."""
    rejected(r)
    assert "It looks like" not in r.message, r.message


def fits_the_box(r: Result) -> None:
    assert all(len(line) <= 72 for line in str(r).splitlines()), str(r)


def spy(fn):
    """``fn`` recording the arguments of every call in ``.calls`` (its signature stays ``fn``'s)."""
    calls = []

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        calls.append((args, kwargs))
        return fn(*args, **kwargs)

    wrapper.calls = calls
    return wrapper


def longest(calls, dim: int = -2, arg: int = 0) -> int:
    """The largest size of dimension ``dim`` of positional argument ``arg`` over the recorded calls."""
    return max(c[0][arg].shape[dim] for c in calls if isinstance(c[0][arg], torch.Tensor))


def _keyword(fn, new: str, old: str) -> str:
    import inspect

    return new if new in inspect.signature(fn).parameters else old


def causal_kw(fn) -> dict:
    """``{"is_causal": True}`` or, before the rename of issue 28, ``{"causal": True}``: whichever ``fn`` takes."""
    return {_keyword(fn, "is_causal", "causal"): True}


def mask_kw(fn, mask) -> dict:
    """``{"attn_mask": mask}`` or, before the rename of issue 28, ``{"mask": mask}`` (bool, True = may attend)."""
    return {_keyword(fn, "attn_mask", "mask"): mask}
