"""Checked exercises: call a student's function on many inputs and say, in a line or two, what is wrong.

The exercises whose answer is code or a number have a checker here, registered under the exercise's id:
``check("2.1", my_step)`` returns a :class:`Result`, shown as that line in a notebook; ``Result.require()``
raises ``AssertionError`` with it (how CI runs the book's own solutions). For every checker, once
(:mod:`attnbook.exercises._core`):

* inputs: random ones, edge cases (N = 1, an empty row, an empty cache), N >= 64, float32, inputs that tell the
  common mistakes apart, and a few of sizes the statement does not mention, drawn on every call from a seed
  that their labels print (``check("1.2", fn, seed=52311)`` draws them again);
* a wrong type, shape or dtype is named, a wrong value shown where it first differs, with the digits it takes
  to see the difference; a common mistake is named only if the answer equals that wrong variant on at least
  two inputs the variant gets wrong, and said from the student's numbers first where the checker can;
* a write into an input is rejected, naming the argument (``state.S``); any form of a right answer passes (any
  real number type, a list for a tuple, a numpy array for a tensor); an undefined expected value passes
  nothing; nothing raises: exceptions, stubs and answers of unforeseen types become the message;
* a measured quantity is measured again, within what the checker can measure itself: float32 rounding, the
  digits a cell prints, the spread across seeds.

Writing a checker::

    @exercise("2.1")
    def check_recurrent_step(fn):
        cases = [Case((q, k, v, state), label="a random token") for ...]
        return check_function(fn, cases, expected=reference_step, name="linear_step",
                              diagnoses=[Diagnosis("the state is updated after the readout", wrong_step)])
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
