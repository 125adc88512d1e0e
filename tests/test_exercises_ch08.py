"""Chapter 8's exercise checkers: the solutions pass in every form, plausible mistakes are named, float32 is
tried, nothing propagates.

The wrong answers below were written from the exercise statements, as a student would, before reading the
checkers."""

import math

import numpy as np
import pytest
import torch
from exercises_support import ODD_ANSWERS, ODD_IDS, accepted, diagnosed, fits_the_box, rejected, spy, undiagnosed

from attnbook.exercises import ch08, check, registered
from attnbook.exercises.ch08 import interference_curve  # as the chapter imports it


def test_every_exercise_of_the_chapter_is_registered():
    assert [i for i in registered() if i.startswith("8.")] == ["8.1", "8.2", "8.3", "8.4"]


# 8.1 -------------------------------------------------------------------------------------------------


def test_the_half_life_is_the_first_whole_t_below_one_half():
    t = math.ceil(math.log(0.5) / math.log(0.95))
    assert 0.95**t < 0.5 <= 0.95 ** (t - 1)
    accepted(check("8.1", t))


@pytest.mark.parametrize("kind", [int, float, np.int64, np.float32, torch.tensor, np.array])
def test_half_life_in_every_number_type(kind):
    accepted(check("8.1", kind(14)))


@pytest.mark.parametrize(
    "answer, says",
    [
        (math.log(0.5) / math.log(0.95), "solves 0.95^t = 1/2"),
        (13, "still above one half"),
        (20, "mean lifetime"),
        (15, "Hint"),
        (None, "no answer yet"),
        ("14", "expected a number"),
    ],
    ids=["real-t", "13", "mean-lifetime", "15", "none", "string"],
)
def test_half_life_wrong_answers_are_told_apart(answer, says):
    rejected(check("8.1", answer), says)


# 8.2 -------------------------------------------------------------------------------------------------


def delta_write(S, k, v, beta):
    """The chapter's solution."""
    predicted = torch.einsum("bhd,bhdv->bhv", k, S)  # S^T k
    u = beta[..., None] * (v - predicted)  # (B, H, Dv)
    return S + k.unsqueeze(-1) * u.unsqueeze(-2)


def delta_write_by_matmul(S, k, v, beta):
    """Right too: (I - beta k k^T) S + beta k v^T, with matrix products."""
    kk = k.unsqueeze(-1) @ k.unsqueeze(-2)  # (B, H, D, D)
    eye = torch.eye(k.shape[-1], dtype=k.dtype)
    return (eye - beta[..., None, None] * kk) @ S + beta[..., None, None] * (k.unsqueeze(-1) @ v.unsqueeze(-2))


def delta_write_numpy(S, k, v, beta):
    """Right too: computed in numpy, a numpy array of the inputs' dtype."""
    S_, k_, v_, b_ = (x.numpy() for x in (S, k, v, beta))
    predicted = np.einsum("bhd,bhdv->bhv", k_, S_)
    return S_ + b_[..., None, None] * k_[..., :, None] * (v_ - predicted)[..., None, :]


def linear_write(S, k, v, beta):
    return S + beta[..., None, None] * k.unsqueeze(-1) * v.unsqueeze(-2)


def beta_on_v(S, k, v, beta):
    predicted = torch.einsum("bhd,bhdv->bhv", k, S)
    return S + k.unsqueeze(-1) * (beta[..., None] * v - predicted).unsqueeze(-2)


def no_beta(S, k, v, beta):
    return S + k.unsqueeze(-1) * (v - torch.einsum("bhd,bhdv->bhv", k, S)).unsqueeze(-2)


def writes_in_place(S, k, v, beta):
    S += beta[..., None, None] * k.unsqueeze(-1) * (v - torch.einsum("bhd,bhdv->bhv", k, S)).unsqueeze(-2)
    return S


def always_float64(S, k, v, beta):
    return delta_write(S.double(), k.double(), v.double(), beta.double())


@pytest.mark.parametrize("answer", [delta_write, delta_write_by_matmul, delta_write_numpy])
def test_delta_write_right_answers_pass(answer):
    accepted(check("8.2", answer))


@pytest.mark.parametrize(
    "answer, diagnosis",
    [(linear_write, "the write adds k v^T"), (beta_on_v, "beta scales only v"), (no_beta, "beta is left out")],
    ids=["linear-write", "beta-on-v", "no-beta"],
)
def test_delta_write_mistakes_are_named(answer, diagnosis):
    r = check("8.2", answer)
    diagnosed(r, diagnosis)
    fits_the_box(r)


def test_delta_write_tries_float32_and_names_a_float64_answer():
    s = spy(delta_write)
    accepted(check("8.2", s))
    assert {S.dtype for (S, *_), _ in s.calls} == {torch.float32, torch.float64}
    assert all(S.shape[-1] != S.shape[-2] for (S, *_), _ in s.calls)  # Dv != D: a transposed state cannot pass
    rejected(check("8.2", always_float64), "float32", "has dtype float64, expected float32")


def test_delta_write_rejects_writes_into_the_state():
    rejected(check("8.2", writes_in_place), "wrote into its argument `S`", "in-place")


def test_delta_write_reports_shapes_exceptions_and_stubs():
    rejected(check("8.2", lambda S, k, v, beta: delta_write(S, k, v, beta)[..., 0]), "has shape")
    # S (B, H, D, Dv) and v (B, H, Dv) never concatenate (S @ v did not raise whenever the random draw had Dv == H)
    rejected(check("8.2", lambda S, k, v, beta: torch.cat([S, v])), "delta_write raised RuntimeError")
    undiagnosed(check("8.2", lambda S, k, v, beta: 2 * S))

    def stub(S, k, v, beta):
        raise NotImplementedError

    rejected(check("8.2", stub), "not written yet")
    rejected(check("8.2", lambda S, k, v, beta: None), "returned None")


def test_delta_write_draws_its_inputs_again_from_the_seed_it_prints():
    def wrong_when_drawn(S, k, v, beta):  # right on the fixed cases (float64, D <= 4), wrong on a drawn float32 one
        return no_beta(S, k, v, beta) if S.dtype == torch.float32 else delta_write(S, k, v, beta)

    r = check("8.2", wrong_when_drawn)
    seed = int(r.message.split("random, seed ")[1].split(")")[0])
    assert check("8.2", wrong_when_drawn, seed=seed).message == r.message
    widths = set()
    for seed in range(4):
        s = spy(delta_write)
        accepted(check("8.2", s, seed=seed))
        widths |= {S.shape[-2] for (S, *_), _ in s.calls}
    assert len(widths) > 2  # D varies from call to call


# 8.3 -------------------------------------------------------------------------------------------------


def unit_lower(k, beta, diagonal=-1, columns=False):
    kk = k @ k.transpose(-2, -1)  # (..., L, L)
    weighted = kk * beta.unsqueeze(-2) if columns else beta.unsqueeze(-1) * kk
    return torch.eye(k.shape[-2], dtype=k.dtype) + weighted.tril(diagonal)


def ut_transform(k, beta):
    """The chapter's solution."""
    A = unit_lower(k, beta)
    eye = torch.eye(k.shape[-2], dtype=k.dtype)
    return torch.linalg.solve_triangular(A, eye.expand_as(A), upper=False, unitriangular=True)


def ut_by_inverse(k, beta):
    """Right too: a general inverse."""
    return torch.linalg.inv(unit_lower(k, beta))


def ut_by_substitution(k, beta):
    """Right too: forward substitution, row by row, T_r = e_r - sum_{s<r} A_rs T_s."""
    A = unit_lower(k, beta) - torch.eye(k.shape[-2], dtype=k.dtype)
    rows = []
    for r in range(k.shape[-2]):
        row = torch.zeros_like(A[..., r, :])
        row[..., r] = 1.0
        for s in range(r):
            row = row - A[..., r, s, None] * rows[s]
        rows.append(row)
    return torch.stack(rows, dim=-2)


@pytest.mark.parametrize("answer", [ut_transform, ut_by_inverse, ut_by_substitution])
def test_ut_transform_right_answers_pass(answer):
    accepted(check("8.3", answer))


@pytest.mark.parametrize(
    "answer, diagnosis",
    [
        (lambda k, beta: torch.linalg.inv(unit_lower(k, beta, diagonal=0)), "the diagonal is kept in tril"),
        (unit_lower, "the matrix itself is returned"),
        (lambda k, beta: torch.linalg.inv(unit_lower(k, beta, columns=True)), "beta multiplies the columns"),
    ],
    ids=["diagonal-kept", "not-inverted", "beta-on-columns"],
)
def test_ut_transform_mistakes_are_named(answer, diagnosis):
    r = check("8.3", answer)
    diagnosed(r, diagnosis)
    fits_the_box(r)


@pytest.mark.parametrize(
    "answer",
    [
        lambda k, beta: torch.linalg.inv(  # torch.bmm: 3-D only
            torch.eye(k.shape[-2], dtype=k.dtype) + (beta.unsqueeze(-1) * torch.bmm(k, k.transpose(1, 2))).tril(-1)
        ),
        lambda k, beta: torch.stack([ut_transform(k[0], beta[0]), ut_transform(k[1], beta[1])]),  # a batch of 2
    ],
    ids=["bmm-3d-only", "unrolled-batch-of-2"],
)
def test_ut_transform_answers_for_one_layout_only_are_rejected(answer):
    """The statement's k is (..., ell, D): both passed when every case was (2, ell, D) (30 of 30 seeds)."""
    for seed in range(5):
        assert not check("8.3", answer, seed=seed).passed


def test_ut_transform_tries_float32_and_names_a_float64_answer():
    s = spy(ut_transform)
    accepted(check("8.3", s))
    assert {k.dtype for (k, beta), _ in s.calls} == {torch.float32, torch.float64}
    rejected(check("8.3", lambda k, beta: ut_transform(k.double(), beta.double())), "has dtype float64")


def test_ut_transform_reports_exceptions_and_stubs():
    # A shape mistake that raises on every draw (k @ beta broadcast without an error on some random shapes).
    rejected(check("8.3", lambda k, beta: k @ k.new_ones(k.shape[-1] + 1)), "ut_transform raised RuntimeError")
    rejected(check("8.3", lambda k, beta: None), "returned None")


# 8.4 -------------------------------------------------------------------------------------------------


def test_first_crowded_accepts_what_the_curve_gives():
    errors = interference_curve(max_pairs=64, D=16, seed=0)  # the chapter's cell
    first = next(P for P, e in enumerate(errors, start=1) if e > 0.5)
    assert errors[first - 1] > 0.5 >= errors[first - 2] and first < 16  # random keys interfere before D
    for kind in (int, float, np.int64, torch.tensor):
        accepted(check("8.4", kind(first)))
    rejected(check("8.4", first + 1), "Hint")


def test_first_crowded_names_d():
    rejected(check("8.4", 16), "16 = D")


def test_the_interference_curve_grows_with_the_pairs():
    errors = interference_curve()
    assert errors[0] < 1e-12 and errors[-1] > 1.0  # one pair reads back exactly; 64 in D = 16 do not


# --- every checker ------------------------------------------------------------------------------------


@pytest.mark.parametrize("exercise_id", ["8.1", "8.4"])
@pytest.mark.parametrize("answer", ODD_ANSWERS, ids=ODD_IDS)
def test_number_answers_of_the_wrong_type_get_feedback(exercise_id, answer):
    rejected(check(exercise_id, answer))


@pytest.mark.parametrize("exercise_id", ["8.2", "8.3"])
@pytest.mark.parametrize("answer", ODD_ANSWERS, ids=ODD_IDS)
def test_function_answers_of_the_wrong_type_get_feedback(exercise_id, answer):
    rejected(check(exercise_id, answer), "expected a function")
    rejected(check(exercise_id, lambda *args: answer))


def test_the_references_are_the_formulas():
    g = torch.Generator().manual_seed(0)
    S, k = torch.randn(2, 3, 4, 5, generator=g, dtype=torch.float64), torch.randn(2, 3, 4, generator=g).double()
    v, beta = torch.randn(2, 3, 5, generator=g, dtype=torch.float64), torch.rand(2, 3, generator=g).double()
    torch.testing.assert_close(ch08.delta_write_reference(S, k, v, beta), delta_write(S, k, v, beta))
    keys = torch.nn.functional.normalize(torch.randn(2, 6, 4, generator=g, dtype=torch.float64), dim=-1)
    b = torch.rand(2, 6, generator=g, dtype=torch.float64)
    T = ch08.ut_reference(keys, b)
    torch.testing.assert_close(T @ unit_lower(keys, b), torch.eye(6, dtype=torch.float64).expand(2, 6, 6))
