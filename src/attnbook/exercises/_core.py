"""The machinery behind every exercise checker: cases, comparisons, diagnoses, one-line results."""

from __future__ import annotations

import copy
import importlib
import math
import pkgutil
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from ..testing import tol

__all__ = [
    "Result",
    "Case",
    "Diagnosis",
    "first_difference",
    "check_function",
    "check_value",
    "exercise",
    "check",
    "registered",
]


WIDTH = 72  # columns of output that fit inside an exercise box on the website


@dataclass(frozen=True)
class Result:
    """The verdict of a checker: ``passed`` and a one- or two-line ``message`` (shown as the cell's output)."""

    passed: bool
    message: str

    def __bool__(self) -> bool:
        return self.passed

    def __str__(self) -> str:
        """The mark and the message, wrapped to fit an exercise box (72 columns), continuation lines indented."""
        mark = "✓ " if self.passed else "✗ "
        lines = []
        for i, line in enumerate(self.message.splitlines() or [""]):
            lines.append(textwrap.fill(line, WIDTH, initial_indent=mark if i == 0 else "  ", subsequent_indent="  "))
        return "\n".join(lines)

    __repr__ = __str__

    def require(self) -> Result:
        """Raise ``AssertionError`` with the message unless the answer passed (the book's own solutions)."""
        if not self.passed:
            raise AssertionError(str(self))
        return self


@dataclass(frozen=True)
class Case:
    """One input to try: positional ``args``, keyword ``kwargs`` and a ``label`` used in messages."""

    args: tuple = ()
    kwargs: dict = field(default_factory=dict)
    label: str = "an input"


@dataclass(frozen=True)
class Diagnosis:
    """A known wrong variant of the answer: if the student's result equals ``wrong(*args, **kwargs)`` on a case
    where it is wrong, ``message`` (e.g. "eps added to every term instead of to the denominator") is shown."""

    message: str
    wrong: Callable


def _fresh(x):
    """A deep copy of a case's inputs (tensors cloned), so that no call can change what the next one sees."""
    if isinstance(x, torch.Tensor):
        return x.detach().clone()
    return copy.deepcopy(x)


def _index(flat: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    out = []
    for size in reversed(shape):
        out.append(flat % size)
        flat //= size
    return tuple(reversed(out))


def _number(x: float) -> str:
    return f"{x:.6g}"


def first_difference(
    got: torch.Tensor, expected: torch.Tensor, *, rtol: float, atol: float, equal_nan: bool = False
) -> str | None:
    """None when ``got`` is close to ``expected`` everywhere, else where it first differs and by how much.

    Both must have the same shape. NaN or infinity in ``got`` where ``expected`` is finite is reported as such;
    with ``equal_nan`` a NaN matches a NaN (how a known wrong variant that produces NaN is recognised).
    """
    g = got.detach().to("cpu", torch.float64).reshape(-1)
    e = expected.detach().to("cpu", torch.float64).reshape(-1)
    bad_value = ~torch.isfinite(g) & torch.isfinite(e)
    close = (g - e).abs() <= atol + rtol * e.abs()
    close |= g == e  # equal infinities
    if equal_nan:
        close |= torch.isnan(g) & torch.isnan(e)
    wrong = ~close | bad_value
    if not bool(wrong.any()):
        return None
    i = int(wrong.nonzero()[0])
    where = _index(i, tuple(expected.shape)) if expected.dim() else ()
    at = f"at index {where} it" if where else ""  # a scalar: "the result is 2.5, expected 3"
    n_wrong = int(wrong.sum())
    of = f" ({n_wrong} of {g.numel()} entries differ)" if g.numel() > 1 else ""
    if bad_value[i]:
        return f"{at} is {_number(float(g[i]))} where {_number(float(e[i]))} was expected{of}".lstrip()
    off = _number(float((g[i] - e[i]).abs()))
    return f"{at} is {_number(float(g[i]))}, expected {_number(float(e[i]))} (off by {off}){of}".lstrip()


def _tolerance(expected, rtol, atol) -> tuple[float, float]:
    dtype = expected.dtype if isinstance(expected, torch.Tensor) and expected.is_floating_point() else torch.float64
    t = tol(dtype) if dtype in (torch.float64, torch.float32, torch.bfloat16, torch.float16) else tol(torch.float64)
    return (t["rtol"] if rtol is None else rtol), (t["atol"] if atol is None else atol)


def _what(x) -> str:
    if isinstance(x, torch.Tensor):
        return f"a tensor of shape {tuple(x.shape)}"
    return f"a {type(x).__name__}"


def _compare(got, expected, rtol, atol, path: str = "", equal_nan: bool = False) -> str | None:
    """None when ``got`` matches ``expected`` (tensors, numbers, tuples/NamedTuples of them), else the problem."""
    label = f"{path} " if path else ""
    if isinstance(expected, torch.Tensor):
        if not isinstance(got, torch.Tensor):
            return f"{label}is {_what(got)}, expected a torch.Tensor of shape {tuple(expected.shape)}"
        if tuple(got.shape) != tuple(expected.shape):
            return f"{label}has shape {tuple(got.shape)}, expected {tuple(expected.shape)}"
        if got.dtype == torch.bool or expected.dtype == torch.bool:
            if got.dtype != expected.dtype:
                return f"{label}has dtype {got.dtype}, expected {expected.dtype}"
            if not torch.equal(got.cpu(), expected.cpu()):
                i = int((got.cpu() != expected.cpu()).reshape(-1).nonzero()[0])
                return f"{label}differs at index {_index(i, tuple(expected.shape))}"
            return None
        if got.is_complex() or not (got.is_floating_point() or not expected.is_floating_point()):
            return f"{label}has dtype {got.dtype}, expected a floating-point tensor like {expected.dtype}"
        diff = first_difference(got, expected, rtol=rtol, atol=atol, equal_nan=equal_nan)
        return None if diff is None else f"{label}{diff}"
    if isinstance(expected, tuple):
        if not isinstance(got, tuple) or len(got) != len(expected):
            n = len(got) if isinstance(got, tuple) else None
            return (
                f"{label}is {_what(got)}"
                + (f" of {n} items" if n is not None else "")
                + (f", expected a tuple of {len(expected)} ({', '.join(getattr(expected, '_fields', ())) or 'items'})")
            )
        names = getattr(expected, "_fields", None) or [f"item {i}" for i in range(len(expected))]
        for name, g, e in zip(names, got, expected, strict=True):
            problem = _compare(g, e, rtol, atol, path=f"{path}.{name}" if path else name, equal_nan=equal_nan)
            if problem:
                return problem
        return None
    if isinstance(expected, (int, float)) and not isinstance(expected, bool):
        if isinstance(got, torch.Tensor) and got.numel() == 1:
            got = got.item()
        if isinstance(got, bool) or not isinstance(got, (int, float)):
            return f"{label}is {_what(got)}, expected a number"
        if not (abs(got - expected) <= atol + rtol * abs(expected)) and got != expected:
            return f"{label}is {_number(got)}, expected {_number(expected)}"
        return None
    return None if got == expected else f"{label}is {got!r}, expected {expected!r}"


def check_function(
    fn: Callable,
    cases: Sequence[Case],
    *,
    expected: Callable,
    name: str,
    diagnoses: Sequence[Diagnosis] = (),
    rtol: float | None = None,
    atol: float | None = None,
    success: str | None = None,
) -> Result:
    """Call ``fn`` on every case and compare with ``expected`` (called the same way); the first problem wins.

    The student's exceptions never propagate: they become the message. ``rtol`` / ``atol`` default to
    :data:`attnbook.testing.TOLERANCES` of the expected result's dtype.
    """
    if not callable(fn):
        return Result(False, f"{name}: expected a function, got {_what(fn)}")
    for case in cases:
        want = expected(*_fresh(case.args), **_fresh(case.kwargs))
        try:
            got = fn(*_fresh(case.args), **_fresh(case.kwargs))
        except NotImplementedError:
            return Result(False, f"{name} is not written yet (it raises NotImplementedError): fill in the body")
        except Exception as exc:  # the student's bug, reported with its message
            return Result(False, f"{name} raised {type(exc).__name__} on {case.label}: {exc}")
        if got is None:
            return Result(False, f"{name} returned None on {case.label}: fill in the body and return the result")
        r, a = _tolerance(want, rtol, atol)
        problem = _compare(got, want, r, a, path="the result")
        if problem is None:
            continue
        for d in diagnoses:
            try:
                variant = d.wrong(*_fresh(case.args), **_fresh(case.kwargs))
            except Exception:  # a diagnosis that cannot be evaluated here does not apply
                continue
            if _compare(got, variant, r, a, equal_nan=True) is None:
                return Result(False, f"{name}, on {case.label}: {problem}.\nIt looks like {d.message}.")
        return Result(False, f"{name}, on {case.label}: {problem}.")
    labels = ", ".join(dict.fromkeys(c.label for c in cases))
    return Result(True, success or f"{name} is right on all {len(cases)} inputs ({labels}).")


def check_value(
    name: str, answer, expected: float, *, rtol: float = 1e-6, atol: float = 0.0, hint: str | None = None
) -> Result:
    """A numeric answer (a derive exercise): ``answer`` against ``expected`` within ``rtol`` / ``atol``."""
    if answer is None:
        return Result(False, f"{name}: no answer yet (it is None)")
    if isinstance(answer, torch.Tensor) and answer.numel() == 1:
        answer = answer.item()
    if isinstance(answer, bool) or not isinstance(answer, (int, float)):
        return Result(False, f"{name}: expected a number, got {_what(answer)}")
    if not math.isfinite(answer) or abs(answer - expected) > atol + rtol * abs(expected):
        more = f" Hint: {hint}" if hint else ""
        return Result(False, f"{name}: {_number(answer)} is not right.{more}")
    return Result(True, f"{name}: {_number(answer)} is right.")


_REGISTRY: dict[str, Callable[..., Result]] = {}


def exercise(exercise_id: str) -> Callable[[Callable[..., Result]], Callable[..., Result]]:
    """Register a checker under ``exercise_id`` (e.g. ``"2.3"``: chapter 2, exercise 3)."""

    def register(checker: Callable[..., Result]) -> Callable[..., Result]:
        if exercise_id in _REGISTRY and _REGISTRY[exercise_id] is not checker:
            raise ValueError(f"exercise {exercise_id!r} is registered twice")
        _REGISTRY[exercise_id] = checker
        checker.exercise_id = exercise_id
        return checker

    return register


def _load_all() -> None:
    from .. import exercises

    for info in pkgutil.iter_modules(exercises.__path__):
        if not info.name.startswith("_"):
            importlib.import_module(f"{exercises.__name__}.{info.name}")


def registered() -> dict[str, Callable[..., Result]]:
    """Every exercise id and its checker, in order."""
    _load_all()
    return dict(sorted(_REGISTRY.items(), key=lambda kv: [int(p) if p.isdigit() else p for p in kv[0].split(".")]))


def check(exercise_id: str, *answer, **kwargs) -> Result:
    """Check ``answer`` for exercise ``exercise_id``: ``check("2.3", my_function)``."""
    known = registered()
    if exercise_id not in known:
        return Result(False, f"there is no exercise {exercise_id!r}; the exercises are {', '.join(known)}")
    return known[exercise_id](*answer, **kwargs)
