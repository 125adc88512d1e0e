"""attnbook.exercises core: a checker finds the first difference, diagnoses known mistakes, never crashes."""

from typing import NamedTuple

import pytest
import torch

from attnbook.exercises import Case, Diagnosis, Result, check, check_function, check_value, first_difference


def softmax_rows(x):
    return torch.softmax(x, dim=-1)


CASES = [
    Case((torch.randn(3, 4, dtype=torch.float64),), label="a random (3, 4) matrix"),
    Case((torch.zeros(1, 5, dtype=torch.float64),), label="a row of zeros"),
]
MISTAKES = [
    Diagnosis("the softmax is taken over the rows instead of along each row", lambda x: torch.softmax(x, dim=0))
]


def run(fn):
    return check_function(fn, CASES, expected=softmax_rows, name="softmax_rows", diagnoses=MISTAKES)


def test_a_right_answer_is_confirmed_in_one_line():
    r = run(lambda x: x.exp() / x.exp().sum(-1, keepdim=True))
    assert r.passed and bool(r) and str(r).startswith("✓ softmax_rows is right on all 2 inputs")
    assert "\n" not in r.message
    assert all(len(line) <= 72 for line in str(r).splitlines())  # fits an exercise box
    assert r.require() is r


def test_a_wrong_shape_names_both_shapes():
    r = run(lambda x: x.exp().sum(-1))
    assert not r.passed
    assert "has shape (3,), expected (3, 4)" in r.message and "a random (3, 4) matrix" in r.message


def test_a_wrong_value_gives_the_first_position_and_the_size_of_the_error():
    r = run(lambda x: torch.softmax(x, -1) * 1.1)
    assert "at index (0, 0)" in r.message and "off by" in r.message and "entries differ" in r.message


def test_a_known_mistake_is_diagnosed():
    r = run(lambda x: torch.softmax(x, dim=0))
    assert not r.passed and "It looks like the softmax is taken over the rows" in r.message
    assert r.message.count("\n") == 1  # two lines at most
    assert all(len(line) <= 72 for line in str(r).splitlines())


def test_student_exceptions_and_stubs_are_reported_not_raised():
    def broken(x):
        return x @ torch.ones(7)

    r = run(broken)
    assert not r.passed and r.message.startswith("softmax_rows raised RuntimeError on a random (3, 4) matrix:")

    def stub(x):
        raise NotImplementedError

    assert "not written yet" in run(stub).message
    assert "returned None" in run(lambda x: None).message
    assert "expected a function" in run(42).message


def test_require_raises_with_the_message():
    with pytest.raises(AssertionError, match="has shape"):
        run(lambda x: x.sum()).require()


def test_answers_that_write_into_their_inputs_do_not_affect_the_expected_result():
    def in_place(x):
        x.exp_()
        return x.div_(x.sum(-1, keepdim=True))

    assert run(in_place).passed


def test_a_mistake_that_gives_nan_is_diagnosed_too():
    mistakes = [Diagnosis("0/0 on a row of zeros", lambda x: x / x.sum(-1, keepdim=True))]
    r = check_function(
        lambda x: x / x.sum(-1, keepdim=True),
        [Case((torch.zeros(2, 3),), label="zeros")],
        expected=softmax_rows,
        name="softmax_rows",
        diagnoses=mistakes,
    )
    assert "it is nan where" in r.message and "It looks like 0/0 on a row of zeros" in r.message


def test_nan_is_reported_as_such():
    r = run(lambda x: torch.full_like(x, float("nan")))
    assert "it is nan where" in r.message


class Pair(NamedTuple):
    S: torch.Tensor
    z: torch.Tensor


def test_named_tuples_are_compared_field_by_field():
    cases = [Case((torch.ones(2),), label="ones")]

    def expected(x):
        return Pair(x * 2, x.sum())

    r = check_function(lambda x: Pair(x * 2, x.sum() + 1), cases, expected=expected, name="pair")
    assert "the result.z" in r.message
    r = check_function(lambda x: (x * 2,), cases, expected=expected, name="pair")
    assert "expected a tuple of 2 (S, z)" in r.message


def test_first_difference_is_none_when_close():
    a = torch.randn(4, 5, dtype=torch.float64)
    assert first_difference(a, a + 1e-12, rtol=1e-9, atol=1e-11) is None
    b = a.clone()
    b[2, 3] += 1.0
    assert first_difference(b, a, rtol=1e-9, atol=1e-11).startswith("at index (2, 3) it is")


def test_numeric_answers():
    assert check_value("chunk size", 64.0, 64).passed
    r = check_value("chunk size", 32, 64, hint="set the derivative to zero")
    assert not r.passed and "Hint: set the derivative" in r.message
    assert "no answer yet" in check_value("chunk size", None, 64).message
    assert "expected a number" in check_value("chunk size", "64", 64).message


def test_check_dispatches_by_id_and_names_the_exercises_for_an_unknown_one():
    r = check("0.0", lambda: None)
    assert isinstance(r, Result) and not r.passed and r.message.startswith("there is no exercise '0.0'")
