"""Checked exercises: call a student's function on random and edge-case inputs and say what is wrong.

Every chapter ends with exercises; those where the student writes code come with a checker here. A checker

* calls the student's function on several inputs: random ones, edge cases (N = 1, an empty row, an empty
  cache), inputs of N >= 64, float32 ones, and the inputs that tell the common wrong answers apart (a large
  score on a hidden key, a temperature other than 1, B other than 2, ...), each on fresh copies; and on a few
  inputs drawn on every call from a fresh seed, of sizes the statement does not mention (N up to a few
  hundred, odd widths), so that no table of the fixed inputs' answers passes (the seed is in their labels:
  ``check("1.2", fn, seed=52311)`` draws them again);
* compares each answer with the package or its float64 reference, and on the first mismatch answers in one or
  two lines: a wrong type, shape or dtype and the expected one, the first position that differs and by how
  much (with the digits that differ), or -- where the mistake is common and recognisable -- a diagnosis
  ("eps is added inside the sum", "the state is updated after the readout"), named only when the answer
  equals that known wrong variant on at least two inputs that the variant gets wrong, and said, where the
  checker can, from the student's numbers first ("row 0 sums to 0.34 where it should sum to 1");
* rejects a function that writes into its inputs, naming the argument (``state.S``): in the student's own
  model the same code would change the caller's tensors;
* accepts every form of a right answer: any real number type (numpy scalars, 0-d tensors and arrays), a list
  for a tuple, a Python number for a 0-d tensor, a numpy array for a tensor;
* never accepts when the expected value itself is undefined (NaN, degenerate data), and never raises: an
  exception in the student's code is reported with its message, a stub that returns None or raises
  ``NotImplementedError`` is reported as not done yet, and an answer of a type the checker did not foresee
  gets feedback too;
* for a measured quantity (an explore exercise), reruns the measurement and takes its tolerance from what it
  can measure itself: the rounding of float32 arithmetic, the digits a cell prints, or the spread across seeds
  where the student's own draw is unknown.

It returns a :class:`Result`, which shows itself as that line in a notebook. ``Result.require()`` raises
``AssertionError`` with the same message, which is how the book's own solutions are checked in CI.

Writing a checker::

    from attnbook.exercises import Case, Diagnosis, check_function, exercise

    @exercise("2.1")
    def check_recurrent_step(fn):
        cases = [Case((q, k, v, state), label="a random token") for ...]
        return check_function(fn, cases, expected=reference_step, name="linear_step",
                              diagnoses=[Diagnosis("the state is updated after the readout", wrong_step)])

and in a chapter: ``attnbook.exercises.check("2.1", my_step)`` or the checker function itself. The policies
live in :mod:`attnbook.exercises._core`, once for every checker.
"""

from __future__ import annotations

from .._checks import check_extra

check_extra(("numpy",), extra="book", name="attnbook.exercises")

from ._core import (
    Case,
    Diagnosis,
    Draw,
    Result,
    as_number,
    check,
    check_function,
    check_value,
    compare,
    exercise,
    first_difference,
    registered,
)

__all__ = [
    "Case",
    "Diagnosis",
    "Draw",
    "Result",
    "as_number",
    "check",
    "check_function",
    "check_value",
    "compare",
    "exercise",
    "first_difference",
    "registered",
]
