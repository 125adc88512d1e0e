"""The machinery behind every exercise checker: cases, random draws, comparisons, diagnoses, one-line results.

The policies that :mod:`attnbook.exercises` lists are implemented here, once: fresh copies of the inputs and
writes into them (:func:`written_argument`), numbers of any type (:func:`as_number`), named dtypes and shown
differences (:func:`compare`), diagnoses on the evidence of :data:`EVIDENCE` cases (:func:`check_function`),
random sizes on every call (:class:`Draw`), and checkers that never raise (:func:`exercise`).
"""

from __future__ import annotations

import copy
import decimal
import functools
import importlib
import inspect
import math
import numbers
import pkgutil
import secrets
import textwrap
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from .._checks import check_int
from ..testing import tol

WIDTH = 72  # columns of output that fit inside an exercise box on the website
EVIDENCE = 2  # cases on which an answer must equal a wrong variant before the variant is named


@dataclass(frozen=True)
class Result:
    """The verdict of a checker: ``passed`` and a one- or two-line ``message`` (shown as the cell's output).

    ``unanswered`` marks the verdict on an exercise cell as the book ships it (the answer is still None, or the
    function still raises NotImplementedError): it fails, but is marked "○", not "✗", because nothing is wrong
    yet; the website shows it under each exercise as what the cell says before the student writes in it."""

    passed: bool
    message: str
    unanswered: bool = False

    def __bool__(self) -> bool:
        return self.passed

    def __str__(self) -> str:
        """The mark and the message, wrapped to fit an exercise box (72 columns), continuation lines indented."""
        mark = "✓ " if self.passed else "○ " if self.unanswered else "✗ "
        lines = self.message.splitlines() or [""]
        return "\n".join(
            textwrap.fill(line, WIDTH, initial_indent=mark if i == 0 else "  ", subsequent_indent="  ")
            for i, line in enumerate(lines)
        )

    __repr__ = __str__

    def require(self) -> Result:
        """Raise ``AssertionError`` with the message unless the answer passed (the book's own solutions)."""
        if not self.passed:
            raise AssertionError(str(self))
        return self


@dataclass(frozen=True)
class Case:
    """One input to try: positional ``args``, keyword ``kwargs`` and a ``label`` used in messages.

    ``note`` is said when an answer is wrong only on cases that have one, e.g. on the long sequences: "they
    are longer than the others: does something depend on a fixed size?".
    """

    args: tuple = ()
    kwargs: dict = field(default_factory=dict)
    label: str = "an input"
    note: str | None = None


@dataclass(frozen=True)
class Diagnosis:
    """A known wrong variant of the answer: ``message`` (e.g. "eps added to every term instead of to the
    denominator") is shown if the student's result equals ``wrong(*args, **kwargs)`` on the failing case and on
    at least one more case where the variant is wrong (see the module docstring)."""

    message: str
    wrong: Callable
    shows: Callable | None = None
    """Optional ``shows(got, want, *args, **kwargs)`` -> what the numbers of the failing case show ("row 3 sums to
    0.5 where it should sum to 1"), said before the message; None (or an exception) says nothing."""


# --- random draws -----------------------------------------------------------------------------------------------


class Draw:
    """The random part of one call of a checker: sizes and tensors drawn from one seed, printed in the labels.

    ``Draw(seed)`` draws from ``seed``, ``Draw()`` from a fresh one (the operating system's entropy), which each
    call of a checker does: its labels print the seed that draws the same inputs again. The global RNG is left
    alone.
    """

    def __init__(self, seed: int | None = None):
        seed = secrets.randbelow(1_000_000) if seed is None else seed
        self.seed = check_int(seed, "seed", name="exercises.check", minimum=0)
        self.g = torch.Generator().manual_seed(int(self.seed))

    def int(self, low: int, high: int, *, avoid: Sequence[int] = ()) -> int:
        """An integer in [low, high], uniformly, none of ``avoid`` (when the range has another)."""
        return _redraw(lambda: int(torch.randint(low, high + 1, (1,), generator=self.g)), low, high, avoid)

    def log_int(self, low: int, high: int, *, avoid: Sequence[int] = ()) -> int:
        """An integer in [low, high] whose logarithm is uniform: small and large sizes alike, none of ``avoid``."""
        return _redraw(lambda: int(round(math.exp(self.uniform(math.log(low), math.log(high))))), low, high, avoid)

    def uniform(self, low: float, high: float) -> float:
        return low + (high - low) * float(torch.rand((), generator=self.g, dtype=torch.float64))

    def choice(self, options: Sequence):
        return options[int(torch.randint(len(options), (1,), generator=self.g))]

    def randn(self, *shape: int, dtype: torch.dtype = torch.float64, scale: float = 1.0) -> torch.Tensor:
        return (scale * torch.randn(*shape, generator=self.g, dtype=torch.float64)).to(dtype)

    def randns(self, count: int, *shape: int, dtype: torch.dtype = torch.float64, scale: float = 1.0) -> tuple:
        """``count`` tensors of one shape drawn one after the other, as :meth:`randn` draws each."""
        return tuple(self.randn(*shape, dtype=dtype, scale=scale) for _ in range(count))

    def rand(self, *shape: int) -> torch.Tensor:
        return torch.rand(*shape, generator=self.g, dtype=torch.float64)

    def label(self, text: str) -> str:
        """``text`` marked as drawn, with the seed that draws it again."""
        return f"{text} (random, seed {self.seed})"

    def cases(self, make: Callable, *, long=(129, 300), short=(2, 40), over: int | None = None) -> list[Case]:
        """Two cases of sizes the statement does not mention: a long one in float64 (length in ``long``) and a
        short one in float32 (in ``short``). ``make(n, dtype)`` -> (args, label) or (args, label, larger); a case
        larger than the fixed ones (``larger``, else n > ``over``) carries the note :data:`FIXED_SIZE`."""
        cases = []
        for n, dtype in ((self.int(*long), torch.float64), (self.int(*short), torch.float32)):
            args, text, *larger = make(n, dtype)
            larger = larger[0] if larger else over is not None and n > over
            cases.append(Case(args, label=self.label(kind(dtype) + text), note=FIXED_SIZE if larger else None))
        return cases

    def labelled(self, label: Callable[..., str], fixed: Sequence[tuple], more: Sequence[tuple] = ()) -> list[Case]:
        """Cases of the argument tuples ``fixed`` and then ``more`` (drawn here: their labels show the seed), each
        labelled ``label(*args)``."""
        return [Case(a, label=label(*a)) for a in fixed] + [Case(a, label=self.label(label(*a))) for a in more]


def _redraw(draw: Callable[[], int], low: int, high: int, avoid: Sequence[int]) -> int:
    """``draw()`` until it gives a number in [low, high] that is none of ``avoid`` (the 100th draw in any case)."""
    for _ in range(100):
        n = draw()
        if n not in avoid and low <= n <= high:
            return n
    return n


def randn(seed: int, *shape: int, scale: float = 1.0, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """A fixed case's tensor: ``scale`` times standard normal numbers drawn in float64 from ``seed``, in ``dtype``."""
    return Draw(seed).randn(*shape, scale=scale, dtype=dtype)


FIXED_SIZE = (
    "these inputs are larger than the others: does something depend on a fixed size (a buffer made for the "
    "chapter's sizes, a hard-coded arange)?"
)


def kind(dtype: torch.dtype) -> str:
    """How a label starts to name a case's dtype: "float32 ", or nothing for float64."""
    return "" if dtype == torch.float64 else f"{_dtype(dtype)} "


# --- numbers and containers -------------------------------------------------------------------------------------


def as_number(x) -> int | float | None:
    """``x`` as a Python int or float when it is a real number of any kind, else None.

    Accepted: int, float, numpy integer and floating scalars, ``fractions.Fraction``, ``decimal.Decimal``, and
    tensors or numpy arrays holding a single real number (0-d or of size 1). Not numbers: bool, complex, strings.
    """
    if isinstance(x, (bool, np.bool_)):
        return None
    if isinstance(x, torch.Tensor):
        if x.numel() != 1 or x.is_complex() or x.dtype == torch.bool:
            return None
        return x.detach().cpu().item()
    if isinstance(x, np.ndarray):
        if x.size != 1 or x.dtype.kind not in "iuf":
            return None
        return x.item()
    if isinstance(x, numbers.Integral):
        return int(x)
    if isinstance(x, (numbers.Real, decimal.Decimal)):
        return float(x)
    return None


def _resolution(x) -> float:
    """The relative precision of the type a number came in: float32's eps for a float32 tensor or scalar."""
    if isinstance(x, torch.Tensor) and x.is_floating_point():
        return torch.finfo(x.dtype).eps
    if isinstance(x, (np.floating, np.ndarray)) and np.issubdtype(np.asarray(x).dtype, np.floating):
        return float(np.finfo(np.asarray(x).dtype).eps)
    return 0.0 if isinstance(x, (int, np.integer)) else float(np.finfo(np.float64).eps)


def _numbers(a: float, b: float) -> tuple[str, str]:
    """``a`` and ``b`` with 6 significant digits, or as many more as it takes to see that they differ."""
    for k in range(6, 18):
        sa, sb = f"{a:.{k}g}", f"{b:.{k}g}"
        if sa != sb or a == b or not (math.isfinite(a) and math.isfinite(b)):
            return sa, sb
    return sa, sb


def _what(x) -> str:
    if isinstance(x, torch.Tensor):
        if x.dim() == 0:
            return f"a 0-d tensor of dtype {_dtype(x.dtype)}"
        return f"a tensor of shape {tuple(x.shape)}"
    if isinstance(x, np.ndarray):
        return f"a numpy array of shape {x.shape}"
    if isinstance(x, (list, tuple)) and not hasattr(x, "_fields"):
        return f"a {type(x).__name__} of {len(x)} items"
    kind = type(x)
    prefix = "numpy." if kind.__module__ == "numpy" else ""
    return f"a {prefix}{kind.__name__}"


def _dtype(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _6g(x: float) -> str:
    return f"{x:.6g}"


def _index(flat: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(int(i) for i in np.unravel_index(flat, shape))


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
    at = f"at index {where}" if where else ""  # a scalar: "the result is 2.5, expected 3"
    n_wrong = int(wrong.sum())
    of = f" ({n_wrong} of {g.numel()} entries differ)" if g.numel() > 1 else ""
    shown_g, shown_e = _numbers(float(g[i]), float(e[i]))
    if bad_value[i]:
        return f"{at} is {shown_g} where {shown_e} was expected{of}".lstrip()
    off = _6g(float((g[i] - e[i]).abs()))
    return f"{at} is {shown_g}, expected {shown_e} (off by {off}){of}".lstrip()


def _table(dtype: torch.dtype) -> dict[str, float]:
    return tol(dtype) if dtype in (torch.float64, torch.float32, torch.bfloat16, torch.float16) else tol(torch.float64)


def _tolerance(expected, rtol, atol) -> tuple[float, float]:
    """``rtol`` / ``atol``, or where None the table's for ``expected``'s dtype (float64 for numbers)."""
    dtype = expected.dtype if isinstance(expected, torch.Tensor) and expected.is_floating_point() else torch.float64
    t = _table(dtype)
    return (t["rtol"] if rtol is None else rtol), (t["atol"] if atol is None else atol)


def _as_tensor(got, expected: torch.Tensor):
    """A numpy array as a tensor, a number as a 0-d tensor of ``expected``'s dtype (when that is 0-d)."""
    if isinstance(got, np.ndarray) and got.dtype.kind in "biuf":
        if got.ndim == 0 and expected.dim() == 0:  # a 0-d array is a number, as a Python float is
            return torch.tensor(got.item(), dtype=expected.dtype)
        return torch.from_numpy(np.array(got))  # a contiguous copy (np.ascontiguousarray made a 0-d array 1-d)
    if expected.dim() == 0 and not isinstance(got, torch.Tensor):
        value = as_number(got)
        if value is not None:
            return torch.tensor(value, dtype=expected.dtype)
    return got


def _compare(got, expected, rtol, atol, path: str = "", equal_nan: bool = False) -> str | None:
    label = f"{path} " if path else ""
    if isinstance(expected, torch.Tensor):
        rtol, atol = _tolerance(expected, rtol, atol)
        got = _as_tensor(got, expected)
        if not isinstance(got, torch.Tensor):
            return f"{label}is {_what(got)}, expected a torch.Tensor of shape {tuple(expected.shape)}"
        if tuple(got.shape) != tuple(expected.shape):
            return f"{label}has shape {tuple(got.shape)}, expected {tuple(expected.shape)}"
        if got.dtype == torch.bool or expected.dtype == torch.bool:
            if got.dtype != expected.dtype:
                return f"{label}has dtype {_dtype(got.dtype)}, expected {_dtype(expected.dtype)}"
            if not torch.equal(got.cpu(), expected.cpu()):
                i = int((got.cpu() != expected.cpu()).reshape(-1).nonzero()[0])
                return f"{label}differs at index {_index(i, tuple(expected.shape))}"
            return None
        if got.is_complex() or (expected.is_floating_point() and not got.is_floating_point()):
            return (
                f"{label}has dtype {_dtype(got.dtype)}, expected a floating-point tensor of dtype "
                f"{_dtype(expected.dtype)}"
            )
        if got.dtype != expected.dtype and got.is_floating_point() and expected.is_floating_point():
            t = _table(max(got.dtype, expected.dtype, key=lambda d: torch.finfo(d).eps))  # the coarser's
            diff = first_difference(got, expected, rtol=max(rtol, t["rtol"]), atol=max(atol, t["atol"]))
            dtypes = f"{_dtype(got.dtype)}, expected {_dtype(expected.dtype)}"
            if diff is None:
                return f"{label}has dtype {dtypes} (compute in the inputs' dtype)"
            return f"{label}{diff}; it also has dtype {dtypes}"
        diff = first_difference(got, expected, rtol=rtol, atol=atol, equal_nan=equal_nan)
        return None if diff is None else f"{label}{diff}"
    if isinstance(expected, tuple):
        fields = getattr(expected, "_fields", None)
        if fields and isinstance(got, Mapping) and set(got) == set(fields):
            got = tuple(got[f] for f in fields)
        if not isinstance(got, (list, tuple)) or len(got) != len(expected):
            n = f" of {len(got)} items" if hasattr(got, "_fields") else ""
            names = ", ".join(fields or ()) or "items"
            return f"{label}is {_what(got)}{n}, expected a tuple of {len(expected)} ({names})"
        names = fields or [f"item {i}" for i in range(len(expected))]
        for name, g, e in zip(names, got, expected, strict=True):
            problem = _compare(g, e, rtol, atol, path=f"{path}.{name}" if path else name, equal_nan=equal_nan)
            if problem:
                return problem
        return None
    if isinstance(expected, (int, float)) and not isinstance(expected, bool):
        rtol, atol = _tolerance(expected, rtol, atol)
        value = as_number(got)
        if value is None:
            return f"{label}is {_what(got)}, expected a number"
        if equal_nan and math.isnan(value) and math.isnan(expected):
            return None
        r = max(rtol, 8 * _resolution(got))  # a float32 number is right to float32's precision
        if value != expected and not abs(value - expected) <= atol + r * abs(expected):
            shown_v, shown_e = _numbers(value, expected)
            off = f" (off by {_6g(abs(value - expected))})" if math.isfinite(value) else ""
            return f"{label}is {shown_v}, expected {shown_e}{off}"
        return None
    return None if got == expected else f"{label}is {got!r}, expected {expected!r}"


def compare(
    got, expected, *, rtol: float | None = None, atol: float | None = None, path: str = "", equal_nan: bool = False
) -> str | None:
    """None when ``got`` matches ``expected`` (tensors, numbers, tuples/NamedTuples of them), else the problem.

    ``rtol`` / ``atol`` default, tensor by tensor, to :data:`attnbook.testing.TOLERANCES` of its dtype (float64's
    for numbers). Never raises: an object that cannot be compared is reported as such.
    """
    try:
        return _compare(got, expected, rtol, atol, path, equal_nan)
    except Exception as exc:  # an answer of a type nothing here foresaw
        label = f"{path} " if path else ""
        return f"{label}is {_what(got)}, which cannot be compared with the expected result ({type(exc).__name__})"


def _undefined(x) -> bool:
    """True when an expected result holds NaN or infinity anywhere (degenerate inputs or a broken reference)."""
    if isinstance(x, torch.Tensor):
        return x.is_floating_point() and not bool(torch.isfinite(x).all())
    if isinstance(x, (Mapping, list, tuple)):
        return any(_undefined(v) for v in (x.values() if isinstance(x, Mapping) else x))
    value = as_number(x)
    return value is not None and not math.isfinite(value)


# --- inputs: fresh copies, and writes into them -----------------------------------------------------------------


def _fresh(x):
    """A deep copy of a case's inputs (tensors cloned), so that no call can change what the next one sees."""
    if isinstance(x, torch.Tensor):
        return x.detach().clone()
    if isinstance(x, tuple) and hasattr(x, "_fields"):
        return type(x)(*(_fresh(y) for y in x))
    if isinstance(x, (tuple, list)):
        return type(x)(_fresh(y) for y in x)
    if isinstance(x, dict):
        return {k: _fresh(y) for k, y in x.items()}
    return copy.deepcopy(x)


def _same_tensor(before: torch.Tensor, after) -> bool:
    if not isinstance(after, torch.Tensor) or after.shape != before.shape or after.dtype != before.dtype:
        return False
    a, b = after.detach().cpu(), before.cpu()
    if torch.equal(a, b):
        return True
    return bool(a.is_floating_point() and ((a == b) | (torch.isnan(a) & torch.isnan(b))).all())


def _first_write(before, after, path: str) -> str | None:
    """The path (``state.S``, ``cache[1]``) of the first tensor or container in ``after`` that differs from
    its saved copy ``before``, else None."""
    if isinstance(before, torch.Tensor):
        return None if _same_tensor(before, after) else path
    if isinstance(before, (tuple, list)):
        if not isinstance(after, (tuple, list)) or len(after) != len(before):
            return path
        fields = getattr(before, "_fields", None)
        names = [f"{path}.{f}" for f in fields] if fields else [f"{path}[{i}]" for i in range(len(before))]
        return _first_of(zip(names, before, after, strict=True))
    if isinstance(before, dict):
        if not isinstance(after, dict) or set(after) != set(before):
            return path
        return _first_of((f"{path}[{key!r}]", b, after[key]) for key, b in before.items())
    return None


def _first_of(parts: Iterable[tuple[str, object, object]]) -> str | None:
    """The first write that :func:`_first_write` finds in the (path, before, after) ``parts``, else None."""
    return next((found for path, before, after in parts if (found := _first_write(before, after, path))), None)


def _argument_names(fn: Callable, n: int) -> list[str]:
    """The names of ``fn``'s first ``n`` positional parameters (``argument 3`` where they cannot be read)."""
    names: list[str] = []
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        params = []
    for p in params:
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            names.append(p.name)
        elif p.kind == p.VAR_POSITIONAL:
            names.extend(f"{p.name}[{i}]" for i in range(n - len(names)))
            break
    names.extend(f"argument {i + 1}" for i in range(len(names), n))
    return names[:n]


def written_argument(fn: Callable, args: tuple, kwargs: dict, saved_args: tuple, saved_kwargs: dict) -> str | None:
    """The argument of ``fn`` (by name, nested parts too: ``state.S``) that the call changed, else None."""
    positional = zip(_argument_names(fn, len(args)), saved_args, args, strict=True)
    return _first_of([*positional, *((key, before, kwargs.get(key)) for key, before in saved_kwargs.items())])


# --- calling the student's function on the cases ----------------------------------------------------------------

_NOTHING = object()  # the answer gave nothing to compare on this case (it raised, or returned None)


class BadReturn(Exception):
    """Raised by a checker's wrapper around the student's function when what the function *returned* cannot be
    used (checked by the package's own validation): reported as what it returned, not as an exception it raised."""


@dataclass
class _Run:
    case: Case
    want: object
    got: object = _NOTHING
    problem: str | None = None  # what is wrong with the value (None: right)
    fatal: str | None = None  # it raised, returned None, or wrote into its inputs
    stub: bool = False  # not written yet: raises NotImplementedError or returns None


def _run(fn: Callable, case: Case, want, name: str, rtol, atol) -> _Run:
    args, kwargs = _fresh(case.args), _fresh(case.kwargs)
    saved_args, saved_kwargs = _fresh(args), _fresh(kwargs)
    run = _Run(case, want)
    try:
        got = fn(*args, **kwargs)
        if got is None:
            run.fatal, run.stub = f"{name} returned None on {case.label}: fill in the body and return the result", True
    except NotImplementedError:
        run.fatal, run.stub = f"{name} is not written yet (it raises NotImplementedError): fill in the body", True
    except BadReturn as exc:  # the function ran; what it returned is unusable
        run.fatal = f"{name}, on {case.label}: {exc}"
    except Exception as exc:  # the student's bug, reported with its message
        run.fatal = f"{name} raised {type(exc).__name__} on {case.label}: {exc}"
    if run.fatal:
        return run
    run.got = got
    try:
        argument = written_argument(fn, args, kwargs, saved_args, saved_kwargs)
    except Exception:  # an input the comparison does not understand: no verdict on writes
        argument = None
    if argument:
        run.fatal = (
            f"{name} wrote into its argument `{argument}` on {case.label}: in-place operations (`add_`, `/=`, "
            "`masked_fill_`, ...) change the caller's tensors. Compute a new tensor instead."
        )
    run.problem = compare(got, want, rtol=rtol, atol=atol, path="the result")
    return run


def _diagnose(runs: list[_Run], failing: int, diagnoses: Sequence[Diagnosis], rtol, atol) -> Diagnosis | None:
    """The diagnosis that the answer matches on at least ``EVIDENCE`` separating cases, the failing one among
    them (a case separates when the variant is wrong there); of several, the one it matches on most cases and
    contradicts on fewest (an answer may have a second mistake that shows on other cases)."""
    best, best_score = None, None
    order = [failing] + [i for i in range(len(runs)) if i != failing]  # the failing case first: most fail there
    for d in diagnoses:
        support, against = 0, 0
        for i in order:
            run = runs[i]
            if run.got is _NOTHING:
                continue
            try:
                variant = d.wrong(*_fresh(run.case.args), **_fresh(run.case.kwargs))
            except Exception:  # a variant that cannot be evaluated here gives no evidence
                variant = _NOTHING
            separates = variant is not _NOTHING and compare(variant, run.want, rtol=rtol, atol=atol) is not None
            matches = separates and compare(run.got, variant, rtol=rtol, atol=atol, equal_nan=True) is None
            if i == failing and not matches:
                break  # it does not explain the failure
            support += matches
            against += separates and not matches
        if support >= EVIDENCE and (best_score is None or support - against > best_score):
            best, best_score = d, support - against
    return best


def _shows(d: Diagnosis, run: _Run) -> str | None:
    """What the numbers of the failing case show, in ``d``'s words (None when it has none or cannot say)."""
    if d.shows is None:
        return None
    try:
        seen = d.shows(run.got, run.want, *_fresh(run.case.args), **_fresh(run.case.kwargs))
    except Exception:  # an answer of a shape the description did not foresee: the diagnosis alone
        return None
    return seen.rstrip(".") if isinstance(seen, str) and seen else None


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
    :data:`attnbook.testing.TOLERANCES` of the expected result's dtype. A write into an input is a problem
    (named by argument); a known mistake is named only on the evidence of several cases (see the module
    docstring); a case whose expected result is NaN or infinite fails as undefined.
    """
    if not callable(fn):
        return Result(False, f"{name}: expected a function, got {_what(fn)}")
    runs: list[_Run] = []
    failing = None
    for case in cases:
        try:
            want = expected(*_fresh(case.args), **_fresh(case.kwargs))
        except Exception as exc:
            return Result(False, f"{name}: the checker could not compute the expected result on {case.label} "
                          f"({type(exc).__name__}: {exc})")  # fmt: skip
        if _undefined(want):
            return Result(
                False, f"{name}, on {case.label}: the expected result is undefined for these inputs (NaN or "
                "infinity), so no answer can be accepted on them: the inputs are degenerate"
            )  # fmt: skip
        run = _run(fn, case, want, name, rtol, atol)
        runs.append(run)
        if failing is None and (run.fatal or run.problem):
            failing = len(runs) - 1
            if run.stub:
                return Result(False, run.fatal, unanswered=True)  # nothing more to learn from the other cases
    if failing is None:
        labels = ", ".join(dict.fromkeys(c.label for c in cases))
        return Result(True, success or f"{name} is right on all {len(cases)} inputs ({labels}).")
    run = runs[failing]
    others_right = all(not (r.fatal or r.problem) for r in runs if not r.case.note)
    note = f"\nIt is right on the other inputs: {run.case.note}" if run.case.note and others_right else ""
    if run.fatal:
        return Result(False, run.fatal + note)
    found = _diagnose(runs, failing, diagnoses, rtol, atol)
    if found is not None:
        seen = _shows(found, run)
        said = f"{seen[0].upper()}{seen[1:]}. It looks like" if seen else "It looks like"
        return Result(False, f"{name}, on {run.case.label}: {run.problem}.\n{said} {found.message}.")
    return Result(False, f"{name}, on {run.case.label}: {run.problem}.{note}")


ROUNDED_DIGITS = 3  # the fewest significant digits to which a value may be given rounded (check_value)


def _rounded_to(
    value: float, want: float, resolution: float, others: Sequence[float], fewest: int = ROUNDED_DIGITS
) -> int | None:
    """The number of significant digits (at least ``fewest``) to which ``value`` is ``want`` rounded, or None;
    None too when a known wrong value in ``others`` rounds to the same number at that precision."""
    if value == 0 or want == 0 or not math.isfinite(value):
        return None
    for k in range(fewest, 16):
        rounded = float(f"{want:.{k}g}")
        if abs(value - rounded) <= resolution * abs(rounded):
            if any(math.isfinite(o) and float(f"{o:.{k}g}") == rounded for o in others):
                return None  # at this precision a known mistake gives the same number: no verdict by rounding
            return k
    return None


def check_value(
    name: str,
    answer,
    expected,
    *,
    rtol: float = 1e-6,
    atol: float = 0.0,
    hint: str | None = None,
    mistakes: Sequence[tuple[float, str]] = (),
    digits: int = ROUNDED_DIGITS,
) -> Result:
    """A numeric answer (a derive or explore exercise): ``answer`` against ``expected`` within ``rtol`` / ``atol``.

    ``answer`` may be any real number (numpy scalars and 0-d tensors included), and may be the expected value
    rounded to at least ``digits`` significant digits (:data:`ROUNDED_DIGITS` unless the cell prints fewer), as a
    cell prints it (unless a known mistake rounds to the same number at that precision). ``mistakes`` are known wrong
    values and what each one means, ``(7, "7 is M, the number of sources")``; a value is recognised only where
    it is not also within the tolerance of ``expected``. An ``expected`` that is NaN or infinite (degenerate
    data) fails whatever the answer.
    """
    if answer is None:
        return Result(False, f"{name}: no answer yet (it is None): write it in and run the cell", unanswered=True)
    value = as_number(answer)
    if value is None:
        return Result(False, f"{name}: expected a number, got {_what(answer)}")
    want = as_number(expected)
    if want is None or not math.isfinite(want):
        return Result(
            False, f"{name}: the expected value is undefined for these inputs (it is {expected!r}), so no answer "
            "can be accepted: the data are degenerate"
        )  # fmt: skip
    r = max(rtol, 8 * _resolution(answer))

    def near(x: float, y: float) -> bool:
        return x == y or abs(x - y) <= atol + r * abs(y)

    if math.isfinite(value) and near(value, want):
        return Result(True, f"{name}: {_6g(value)} is right.")
    # the exact value rounded, as a printed cell shows it (20.5 or 20.4636 for 20.46364...)
    shown = _rounded_to(value, want, max(8 * _resolution(answer), 1e-15), [w for w, _ in mistakes], digits)
    if shown is not None:
        return Result(True, f"{name}: {value:.{shown}g} is right (the value, {_6g(want)}, to {shown} digits).")
    for wrong, meaning in mistakes:
        if math.isfinite(value) and near(value, wrong) and not near(wrong, want):
            return Result(False, f"{name}: {_6g(value)} is not right: {meaning}")
    more = f" Hint: {hint}" if hint else ""
    return Result(False, f"{name}: {_6g(value)} is not right.{more}")


# --- the registry -----------------------------------------------------------------------------------------------

_REGISTRY: dict[str, Callable[..., Result]] = {}


def _origin(f: Callable) -> tuple[str, str]:
    f = getattr(f, "__wrapped__", f)
    return getattr(f, "__module__", ""), getattr(f, "__qualname__", repr(f))


def exercise(exercise_id: str) -> Callable[[Callable[..., Result]], Callable[..., Result]]:
    """Register a checker under ``exercise_id`` (e.g. ``"2.3"``: chapter 2, exercise 3).

    The registered function never raises: an error in the checker itself (an answer of a type it did not
    foresee, a call with the wrong arguments) becomes a failing :class:`Result` that says what went wrong.
    """

    def register(checker: Callable[..., Result]) -> Callable[..., Result]:
        @functools.wraps(checker)
        def safe(*args, **kwargs) -> Result:
            try:
                inspect.signature(checker).bind(*args, **kwargs)
            except TypeError as exc:
                return Result(False, f"{exercise_id}: the checker was called with the wrong arguments: {exc}")
            if kwargs.get("seed") is not None:  # the caller's seed, not the answer, is wrong
                try:
                    check_int(kwargs["seed"], "seed", name=f"exercises.check({exercise_id!r})", minimum=0)
                except (TypeError, ValueError) as exc:
                    return Result(False, str(exc))
            try:
                result = checker(*args, **kwargs)
            except Exception as exc:
                if str(exc).startswith("exercises.check("):  # a checker's option (7.1's D) was wrong, not the answer
                    return Result(False, str(exc))
                return Result(
                    False, f"{exercise_id}: the checker could not use this answer ({type(exc).__name__}: {exc}); "
                    "check its type against the exercise statement"
                )  # fmt: skip
            if not isinstance(result, Result):
                return Result(False, f"{exercise_id}: the checker gave no verdict (it returned {_what(result)})")
            return result

        known = _REGISTRY.get(exercise_id)
        if known is not None and _origin(known) != _origin(checker):
            raise ValueError(f"exercise {exercise_id!r} is registered twice")
        _REGISTRY[exercise_id] = safe
        safe.exercise_id = exercise_id
        return safe

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
    """Check ``answer`` for exercise ``exercise_id``: ``check("2.3", my_function)``.

    A checker of functions draws some of its inputs at random on every call; ``seed=`` (printed in those inputs'
    labels) draws the same ones again: ``check("1.2", causal_attention, seed=52311)``.
    """
    known = registered()
    if not isinstance(exercise_id, str):
        return Result(False, f"exercises.check: exercise_id must be a string such as '1.1', got {exercise_id!r}")
    if exercise_id not in known:
        return Result(False, f"there is no exercise {exercise_id!r}; the exercises are {', '.join(known)}")
    return known[exercise_id](*answer, **kwargs)
