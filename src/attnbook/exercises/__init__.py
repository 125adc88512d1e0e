"""Checked exercises: call a student's function on random and edge-case inputs and say what is wrong.

Every chapter ends with exercises; those where the student writes code come with a checker here. A checker

* calls the student's function on several inputs (random ones and edge cases), each on fresh copies, so a
  function that writes into its arguments cannot spoil the next case;
* compares each answer with the package or its float64 reference, and on the first mismatch answers in one or
  two lines: a wrong type or shape and the expected one, the first position that differs and by how much, or
  -- where the mistake is common and recognisable -- a diagnosis ("eps is added inside the sum", "the state
  is updated after the readout"), found by comparing the answer with known wrong variants;
* never raises because of the student's code: an exception in it is reported with its message, a stub that
  returns None or raises ``NotImplementedError`` is reported as not done yet.

It returns a :class:`Result`, which shows itself as that line in a notebook. ``Result.require()`` raises
``AssertionError`` with the same message, which is how the book's own solutions are checked in CI.

Writing a checker::

    from attnbook.exercises import Case, Diagnosis, check_function, exercise

    @exercise("2.1")
    def check_recurrent_step(fn):
        cases = [Case((q, k, v, state), label="a random token") for ...]
        return check_function(fn, cases, expected=reference_step, name="linear_step",
                              diagnoses=[Diagnosis("the state is updated after the readout", wrong_step)])

and in a chapter: ``attnbook.exercises.check("2.1", my_step)`` or the checker function itself.
"""

from __future__ import annotations

from ._core import (
    Case,
    Diagnosis,
    Result,
    check,
    check_function,
    check_value,
    exercise,
    first_difference,
    registered,
)

__all__ = [
    "Case",
    "Diagnosis",
    "Result",
    "check",
    "check_function",
    "check_value",
    "exercise",
    "first_difference",
    "registered",
]
