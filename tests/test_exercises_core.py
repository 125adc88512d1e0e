"""attnbook.exercises core: a checker finds the first difference, diagnoses known mistakes, never crashes."""

import math
from decimal import Decimal
from fractions import Fraction
from typing import NamedTuple

import numpy as np
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


def test_answers_that_write_into_their_inputs_are_rejected_by_argument_name():
    def in_place(x):
        x.exp_()
        return x.div_(x.sum(-1, keepdim=True))

    r = run(in_place)
    assert not r.passed and "softmax_rows wrote into its argument `x`" in r.message and "in-place" in r.message


def test_a_mistake_that_gives_nan_is_diagnosed_too():
    mistakes = [Diagnosis("0/0 on a row of zeros", lambda x: x / x.sum(-1, keepdim=True))]
    zeros = [Case((torch.zeros(2, 3),), label="zeros"), Case((torch.zeros(1, 4),), label="more zeros")]
    r = check_function(
        lambda x: x / x.sum(-1, keepdim=True), zeros, expected=softmax_rows, name="softmax_rows", diagnoses=mistakes
    )
    assert "(0, 0) is nan where" in r.message and "It looks like 0/0 on a row of zeros" in r.message


def test_nan_is_reported_as_such():
    r = run(lambda x: torch.full_like(x, float("nan")))
    assert "is nan where" in r.message and " it is " not in r.message


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
    assert first_difference(b, a, rtol=1e-9, atol=1e-11).startswith("at index (2, 3) is ")


def test_numeric_answers():
    assert check_value("chunk size", 64.0, 64).passed
    r = check_value("chunk size", 32, 64, hint="set the derivative to zero")
    assert not r.passed and "Hint: set the derivative" in r.message
    assert "no answer yet" in check_value("chunk size", None, 64).message
    assert "expected a number" in check_value("chunk size", "64", 64).message


def test_check_dispatches_by_id_and_names_the_exercises_for_an_unknown_one():
    r = check("0.0", lambda: None)
    assert isinstance(r, Result) and not r.passed and r.message.startswith("there is no exercise '0.0'")


def test_a_wrong_exercise_id_or_seed_is_blamed_on_itself_not_on_the_answer():
    """check(1.1, ...) said "there is no exercise 1.1; the exercises are 1.1, ..."; a bad seed was reported as the
    checker not being able to use the answer."""
    r = check(1.1, lambda x: x)
    assert not r.passed and r.message == "exercises.check: exercise_id must be a string such as '1.1', got 1.1"
    for seed, says in ((-1, "seed must be an int >= 0, got -1"), ("7", "seed must be an int, got '7'")):
        r = check("1.2", lambda q, k, v: v, seed=seed)
        assert not r.passed and r.message == f"exercises.check('1.2'): {says}"
    for D, says in ((0, "D must be an int >= 1, got 0"), (16.5, "D must be an int, got 16.5")):  # 7.1's option
        r = check("7.1", 9, D=D)  # was marked right
        assert not r.passed and r.message == f"exercises.check('7.1'): {says}"


# --- the policies of issue 29 ---------------------------------------------------------------------------------


class State(NamedTuple):
    S: torch.Tensor
    z: torch.Tensor


def step_cases():
    g = torch.Generator().manual_seed(0)
    return [
        Case((torch.randn(3, generator=g, dtype=torch.float64), State(torch.ones(3, 3), torch.ones(3))), label="a"),
        Case((torch.randn(3, generator=g, dtype=torch.float64), State(torch.ones(3, 3), torch.ones(3))), label="b"),
    ]


def right_step(x, state):
    return State(state.S + x[:, None] * x, state.z + x)


@pytest.mark.parametrize(
    "answer, argument",
    [
        (lambda x, state: State(state.S.add_(x[:, None] * x), state.z + x), "state.S"),
        (lambda x, state: State(state.S + x[:, None] * x, state.z.add_(x)), "state.z"),
        (lambda x, state: right_step(x.mul_(1.0), state), None),  # writes, but changes nothing
        (lambda x, state: (x.clamp_(-0.1, 0.1), right_step(x, state))[1], "x"),
    ],
    ids=["S", "z", "no-change", "x"],
)
def test_writes_into_nested_inputs_are_named(answer, argument):
    r = check_function(answer, step_cases(), expected=right_step, name="step")
    if argument is None:
        assert r.passed, r.message
    else:
        assert not r.passed and f"step wrote into its argument `{argument}` on a" in r.message, r.message


def test_writes_into_lists_and_dicts_are_named():
    def expected(cache):
        return cache["k"][0] * 2

    cases = [Case(({"k": [torch.ones(2)]},), label="a cache")]
    r = check_function(lambda cache: cache["k"][0].mul_(2), cases, expected=expected, name="f")
    assert not r.passed and "`cache['k'][0]`" in r.message

    def appends(cache):
        cache["k"].append(torch.zeros(1))
        return cache["k"][0] * 2

    r = check_function(appends, cases, expected=expected, name="f")
    assert not r.passed and "`cache['k']`" in r.message


@pytest.mark.parametrize(
    "answer",
    [3, 3.0, np.int64(3), np.float32(3.0), np.float64(3.0), torch.tensor(3), torch.tensor(3.0), np.array(3.0),
     Fraction(3), Decimal("3"), torch.tensor([3.0])],
    ids=["int", "float", "np.int64", "np.float32", "np.float64", "int-tensor", "tensor", "0-d-array", "fraction",
         "decimal", "size-1-tensor"],
)  # fmt: skip
def test_any_real_number_is_a_number(answer):
    assert check_value("three", answer, 3).passed
    assert check_function(lambda: answer, [Case()], expected=lambda: 3.0, name="f").passed


@pytest.mark.parametrize("answer", [True, np.bool_(True), 3 + 0j, "3", torch.ones(2), np.ones(2), [3]])
def test_what_is_not_a_number_gets_feedback(answer):
    r = check_value("three", answer, 1)
    assert not r.passed and "expected a number" in r.message


def test_a_float32_number_is_right_to_float32_precision():
    x = np.float32(1 / 3)
    assert abs(float(x) - 1 / 3) > 1e-9  # it is not exactly 1/3
    assert check_value("third", x, 1 / 3, rtol=1e-9).passed
    assert not check_value("third", 1 / 3 + 1e-8, 1 / 3, rtol=1e-9).passed  # a float64 is held to the tolerance


def test_containers_lists_for_tuples_python_numbers_for_0d_tensors_arrays_for_tensors():
    def expected(x):
        return State(x * 2, (x * x).sum())

    cases = [Case((torch.arange(3.0, dtype=torch.float64),), label="a")]
    assert check_function(lambda x: [x * 2, (x * x).sum()], cases, expected=expected, name="f").passed
    assert check_function(lambda x: (x * 2, float((x * x).sum())), cases, expected=expected, name="f").passed
    assert check_function(lambda x: {"S": x * 2, "z": (x * x).sum()}, cases, expected=expected, name="f").passed
    assert check_function(lambda x: ((x * 2).numpy(), 5.0), cases, expected=expected, name="f").passed
    r = check_function(lambda x: [x * 2], cases, expected=expected, name="f")
    assert not r.passed and "a list of 1 items, expected a tuple of 2 (S, z)" in r.message


def test_a_wrong_dtype_is_named_not_reported_as_equal_numbers():
    cases = [Case((torch.tensor([0.0288296], dtype=torch.float64),), label="a")]
    r = check_function(lambda x: x.float(), cases, expected=lambda x: x.clone(), name="f")
    assert not r.passed and "has dtype float32, expected float64 (compute in the inputs' dtype)" in r.message
    assert "off by" not in r.message
    r = check_function(lambda x: x.float() + 1, cases, expected=lambda x: x.clone(), name="f")
    assert not r.passed and "off by 1" in r.message and "also has dtype float32, expected float64" in r.message
    r = check_function(lambda x: x.long(), cases, expected=lambda x: x.clone(), name="f")
    assert not r.passed and "has dtype int64, expected a floating-point tensor of dtype float64" in r.message


def test_a_diagnosis_needs_two_cases_that_separate_it():
    # "the state is reset": on a zero state a wrong answer of zeros looks like it, on the other case it does not
    def expected(x, s):
        return s + x

    def reset(x, s):
        return x.clone()

    zero, other = torch.zeros(3, dtype=torch.float64), torch.ones(3, dtype=torch.float64)
    x = torch.full((3,), 2.0, dtype=torch.float64)
    cases = [Case((x * 0, zero), label="zero input, zero state"), Case((x, other), label="a state of ones")]
    cases += [Case((x * 3, other), label="another")]
    mistakes = [Diagnosis("the state is reset", reset)]
    r = check_function(lambda x, s: torch.zeros(3, dtype=torch.float64), cases, expected=expected, name="f",
                       diagnoses=mistakes)  # fmt: skip
    assert not r.passed and "It looks like" not in r.message
    r = check_function(reset, cases, expected=expected, name="f", diagnoses=mistakes)
    assert not r.passed and "It looks like the state is reset" in r.message
    r = check_function(reset, cases[:2], expected=expected, name="f", diagnoses=mistakes)
    assert not r.passed and "It looks like" not in r.message  # one separating case is not enough


def test_an_undefined_expected_value_never_passes():
    cases = [Case((torch.zeros(2),), label="zeros")]
    r = check_function(lambda x: x / x, cases, expected=lambda x: x / x, name="f")
    assert not r.passed and "undefined for these inputs" in r.message
    r = check_value("ratio", float("nan"), float("nan"))
    assert not r.passed and "undefined for these inputs" in r.message
    assert not check_value("ratio", 1.0, math.inf).passed


def test_a_note_is_said_when_only_the_noted_cases_fail():
    cases = [Case((n,), label=f"N = {n}", note="does it use a fixed size?" if n > 8 else None) for n in (3, 7, 64)]

    def fixed(n):
        return float(min(n, 8))

    r = check_function(fixed, cases, expected=float, name="f")
    assert not r.passed and "N = 64" in r.message
    assert "It is right on the other inputs: does it use a fixed" in r.message
    r = check_function(lambda n: float(n) + (n == 3), cases, expected=float, name="f")
    assert "fixed size" not in r.message


def test_registered_checkers_never_raise():
    from attnbook.exercises import exercise

    @exercise("0.1")
    def broken(answer, *, data):
        return float(data["x"]) > answer  # no Result, and raises on odd data

    try:
        r = broken(1.0, data={"x": object()})
        assert isinstance(r, Result) and not r.passed and "the checker could not use this answer" in r.message
        r = broken(1.0)
        assert not r.passed and "called with the wrong arguments" in r.message and "data" in r.message
        r = broken(0.0, data={"x": 1})
        assert not r.passed and "gave no verdict" in r.message
    finally:
        from attnbook.exercises import _core

        _core._REGISTRY.pop("0.1")


# --- every checker, every named mistake ------------------------------------------------------------------------


def _diagnosed_checkers():
    """(exercise id, checker, the diagnoses it passes to check_function), read by running each function checker
    once on a stub (check_function is recorded, not run)."""
    from attnbook.exercises import ch01, ch02, ch03, ch04, ch05, ch06, ch07, registered

    found = []
    for module in (ch01, ch02, ch03, ch04, ch05, ch06, ch07):
        for exercise_id, checker in registered().items():
            if getattr(checker, "__wrapped__", checker).__module__ != module.__name__:
                continue
            seen = []

            def record(fn, cases, *, diagnoses=(), seen=seen, **kwargs):
                seen.append(list(diagnoses))
                return Result(False, "recorded")

            original = module.check_function
            module.check_function = record
            try:
                checker(lambda *args: None)
            except TypeError:  # a checker of numbers that needs more arguments: no diagnoses to record
                pass
            finally:
                module.check_function = original
            if seen and seen[0] and exercise_id != "2.2":  # 2.2's mistakes are kernels of two inputs, not maps
                found.append((exercise_id, seen[0]))
    return found


DIAGNOSED = _diagnosed_checkers()


@pytest.mark.parametrize(
    "exercise_id, d",
    [(i, d) for i, ds in DIAGNOSED for d in ds],
    ids=[f"{i}-{j}" for i, ds in DIAGNOSED for j in range(len(ds))],
)
def test_every_named_mistake_is_recognised_when_it_is_the_answer(exercise_id, d):
    r = check(exercise_id, d.wrong)
    assert not r.passed and "It looks like " in r.message.split("\n", 1)[1], r.message
    assert r.message.split("It looks like ")[1].rstrip(".") == d.message.rstrip("."), r.message


def test_every_chapter_has_its_diagnosed_checkers_listed():
    assert {i for i, _ in DIAGNOSED} >= {"1.1", "1.2", "1.3", "1.4", "2.1", "2.3", "2.4", "3.2", "3.3", "4.2"}
    assert {i for i, _ in DIAGNOSED} >= {"5.2", "5.3", "6.2", "7.2", "7.3", "7.4"}


@pytest.mark.parametrize("answer", [None, "x", {"a": 1}, [1, 2], object(), torch.zeros(2), float("nan"), True])
def test_no_registered_checker_raises_on_an_odd_answer(answer):
    from attnbook.exercises import registered

    for exercise_id, checker in registered().items():
        for r in (checker(answer), check(exercise_id, answer, ops={}, ms={})):
            assert isinstance(r, Result) and not r.passed, (exercise_id, r)
