"""Chapter 2's exercise checkers: right answers in every form pass, the mistakes students make are named,
nothing crashes.

The wrong answers marked "(issue 29)" were written from the exercise statements, as a student would, before
reading the checkers."""

import math

import numpy as np
import pytest
import torch
from exercises_support import ODD_ANSWERS, ODD_IDS, accepted, diagnosed, longest, rejected, spy, undiagnosed

import attnbook
from attnbook import reference
from attnbook.exercises import check
from attnbook.exercises.ch02 import chunk_cost, linear_step_solution, taylor_kernel
from attnbook.feature_maps import elu_feature_map


def named(r, diagnosis):
    return (not r.passed) and "\nIt looks like " in r.message and diagnosis in r.message.split("It looks like ")[1]


# --- 2.1 the recurrent step -----------------------------------------------------------------------------------


def step_with_the_package(q, k, v, state):
    return attnbook.linear_attention_step(q, k, v, attnbook.LinearState(*state))


def step_by_einsum(q, k, v, state):
    S, z = state
    fq, fk = elu_feature_map(q), elu_feature_map(k)
    S = S + torch.einsum("bhr,bhv->bhrv", fk, v)
    z = z + fk
    return torch.einsum("bhr,bhrv->bhv", fq, S) / (torch.einsum("bhr,bhr->bh", fq, z)[..., None] + 1e-6), (S, z)


@pytest.mark.parametrize("answer", [linear_step_solution, step_with_the_package, step_by_einsum])
def test_linear_step_right_answers_pass(answer):
    r = check("2.1", answer)
    assert r.passed, r.message


def test_the_solution_is_the_package_step_and_walks_the_reference_loop():
    B, H, N, D, Dv = 2, 2, 7, 3, 4
    q, k, v = (torch.randn(B, H, N, d, dtype=torch.float64) for d in (D, D, Dv))
    S, z = torch.zeros(B, H, D, Dv, dtype=torch.float64), torch.zeros(B, H, D, dtype=torch.float64)
    outs, state = [], (S, z)
    for t in range(N):
        out, state = linear_step_solution(q[:, :, t], k[:, :, t], v[:, :, t], state)
        outs.append(out)
    torch.testing.assert_close(torch.stack(outs, dim=2), reference.linear_attention_loop(q, k, v))


def before_update(q, k, v, state):
    S, z = state
    fq, fk = elu_feature_map(q), elu_feature_map(k)
    out = (fq[..., None, :] @ S).squeeze(-2) / ((fq * z).sum(-1, keepdim=True) + 1e-6)
    return out, (S + fk[..., :, None] * v[..., None, :], z + fk)


def change(out=None, phi_q=True, transpose=False, update_z=True):
    def answer(q, k, v, state):
        S, z = state
        fq = elu_feature_map(q) if phi_q else q
        fk = elu_feature_map(k)
        S = S + (v[..., :, None] * fk[..., None, :] if transpose else fk[..., :, None] * v[..., None, :])
        z = z + fk if update_z else z
        num, den = (fq[..., None, :] @ S).squeeze(-2), (fq * z).sum(-1, keepdim=True)
        return (num / (den + 1e-6) if out is None else out(num, den)), (S, z)

    return answer


@pytest.mark.parametrize(
    "answer, diagnosis",
    [
        (before_update, "the state is updated after the readout"),
        (change(out=lambda n, d: n), "the output is not normalised"),
        (change(out=lambda n, d: (n + 1e-6) / (d + 1e-6)), "eps is added to the numerator too"),
        (change(phi_q=False), "the feature map is not applied to the query"),
        (change(transpose=True), "the outer product is transposed"),
        (change(update_z=False), "z is not updated"),
    ],
    ids=["readout-first", "unnormalised", "eps-numerator", "raw-query", "transposed", "stale-z"],
)
def test_linear_step_mistakes_are_named(answer, diagnosis):
    r = check("2.1", answer)
    assert named(r, diagnosis), r.message


def test_linear_step_reports_shapes_tuples_exceptions_and_stubs():
    r = check("2.1", lambda q, k, v, state: linear_step_solution(q, k, v, state).out)
    assert not r.passed and "expected a tuple of 2 (out, state)" in r.message
    r = check("2.1", lambda q, k, v, state: (q, state))
    assert not r.passed and "the result.out" in r.message
    r = check("2.1", lambda q, k, v, state: (linear_step_solution(q, k, v, state).out, state))
    assert not r.passed and "the result.state.S" in r.message  # the state was not updated
    r = check("2.1", lambda q, k, v, state: (q @ state[0], state))
    assert not r.passed and r.message.startswith("linear_step raised RuntimeError on the first token")

    def stub(q, k, v, state):
        raise NotImplementedError

    assert "not written yet" in check("2.1", stub).message


# --- 2.2 Taylor features ---------------------------------------------------------------------------------------


def taylor_flat(x):
    one = torch.ones_like(x[..., :1])
    return torch.cat([one, x, (x[..., :, None] * x[..., None, :]).flatten(-2) / math.sqrt(2)], dim=-1)


def taylor_packed(x):
    """The same kernel with the symmetric products packed: R = 1 + D + D (D + 1) / 2."""
    D = x.shape[-1]
    i, j = torch.triu_indices(D, D)
    weight = torch.where(i == j, 2**-0.5, 1.0).to(x.dtype)
    return torch.cat([torch.ones_like(x[..., :1]), x, x[..., i] * x[..., j] * weight], dim=-1)


def rescaled(features, D, factor):
    """The features with the quadratic ones multiplied by ``factor``."""
    return torch.cat([features[..., : 1 + D], features[..., 1 + D :] * factor], dim=-1)


def test_taylor_features_in_another_dtype_are_named():
    r = check("2.2", lambda x: taylor_flat(x.float()))
    assert not r.passed and "has dtype float32, expected float64 (compute in the inputs' dtype)" in r.message


@pytest.mark.parametrize("answer", [taylor_flat, taylor_packed], ids=["outer-product", "packed"])
def test_taylor_right_answers_pass_whatever_the_packing(answer):
    r = check("2.2", answer)
    assert r.passed, r.message


def test_taylor_kernel_is_exp_to_second_order_and_positive():
    s = torch.linspace(-3, 3, 61, dtype=torch.float64)
    k = taylor_kernel(s[:, None], torch.ones(1, 1, dtype=torch.float64))[:, 0]
    assert (k >= 0.5).all()
    small = torch.tensor([[1e-3]], dtype=torch.float64)
    assert abs(float(taylor_kernel(small, small)) - math.exp(1e-6)) < 1e-15


@pytest.mark.parametrize(
    "answer, diagnosis",
    [
        (lambda x: rescaled(taylor_flat(x), x.shape[-1], 2**0.5), "not divided by sqrt(2)"),
        (lambda x: rescaled(taylor_flat(x), x.shape[-1], 2**-0.5), "divided by 2 instead of sqrt(2)"),
        (lambda x: taylor_flat(x)[..., 1:], "the constant feature 1 is missing"),
        (lambda x: torch.cat([torch.ones_like(x[..., :1]), x, x * x / math.sqrt(2)], -1), "the squares x_d^2 only"),
        (lambda x: torch.cat([taylor_flat(x)[..., :1], taylor_flat(x)[..., 1 + x.shape[-1] :]], -1),
         "the linear features x are missing"),
    ],
    ids=["no-sqrt2", "half", "no-one", "squares-only", "no-linear"],
)  # fmt: skip
def test_taylor_mistakes_are_named(answer, diagnosis):
    r = check("2.2", answer)
    assert named(r, diagnosis), r.message


def test_taylor_features_as_a_numpy_array_are_accepted():
    """(issue 29) Every other function checker takes numpy; this one reported 'taylor_features raised TypeError'
    for the package's own validation of a right answer returned with .numpy()."""
    r = check("2.2", lambda x: taylor_flat(x).numpy())
    assert r.passed, r.message


def test_taylor_reports_what_is_not_a_feature_map():
    r = check("2.2", lambda x: taylor_flat(x).flatten(-2))  # mixes the leading dimensions
    assert not r.passed and "taylor_features: the feature map must keep the leading dimensions of x" in r.message
    message = check("2.2", lambda x: x.tolist()).message
    assert "raised" not in message and "what taylor_features returned cannot be used" in message  # (issue 29)
    assert "the feature map must return a floating-point tensor, got a list" in message
    widths = check("2.2", lambda x: taylor_flat(x)[..., : x.shape[-2] + 1])  # the width depends on N: x, y differ
    assert not widths.passed and "the feature map must give x and y features of one width R" in widths.message
    assert "returned None" in check("2.2", lambda x: None).message
    assert "expected a function" in check("2.2", 3).message


# --- 2.3 and 2.4: formulas --------------------------------------------------------------------------------------


def test_best_chunk_is_the_minimum_of_the_cost_model():
    r = check("2.3", lambda R, Dv: math.sqrt(2 * R * Dv / (R + Dv)))
    assert r.passed, r.message
    costs = {ell: chunk_cost(ell, 4096, 64, 64) for ell in range(1, 257)}
    assert min(costs, key=costs.get) == 8  # sqrt(2 * 64 * 64 / 128)


def test_best_chunk_mistakes_are_named():
    assert named(check("2.3", lambda R, Dv: math.sqrt(R * Dv / (R + Dv))), "only the ell (ell + 1) / 2 pairs")
    assert named(check("2.3", lambda R, Dv: 2 * R * Dv / (R + Dv)), "the square root is missing")
    assert named(check("2.3", lambda R, Dv: math.sqrt(R * Dv)), "ell = sqrt(R Dv)")
    assert named(check("2.3", lambda R, Dv: math.sqrt(2 * R)), "not Dv alone")
    assert named(check("2.3", lambda R, Dv: math.sqrt(2 * Dv)), "not R alone")
    r = check("2.3", lambda R, Dv: 8)
    assert not r.passed and "on R = 16, Dv = 64: the result is 8, expected 5.05964" in r.message


def relative_variance_solution(x, y):
    return math.expm1(float(((x + y) ** 2).sum()))


def test_relative_variance_formula_and_a_monte_carlo_estimate_agree():
    assert check("2.4", relative_variance_solution).passed
    x, y = torch.tensor([0.3, -0.2, 0.5], dtype=torch.float64), torch.tensor([0.1, 0.4, 0.2], dtype=torch.float64)
    w = torch.randn(400_000, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    est = torch.exp(w @ x - x @ x / 2) * torch.exp(w @ y - y @ y / 2)
    assert abs(est.mean().item() / math.exp(x @ y) - 1) < 0.01
    assert abs((est.var() / est.mean() ** 2).item() / relative_variance_solution(x, y) - 1) < 0.1


def test_relative_variance_mistakes_are_named():
    assert named(check("2.4", lambda x, y: math.exp(((x + y) ** 2).sum())), "the variance is E[Z^2] - E[Z]^2")
    assert named(check("2.4", lambda x, y: 0.0), "E[Z^2] came out as E[Z]^2")
    assert named(check("2.4", lambda x, y: math.expm1(float(x @ x + y @ y))), "the cross term 2 x.y is missing")
    r = check("2.4", lambda x, y: math.exp(2 * float(x @ y)) * relative_variance_solution(x, y))
    assert named(r, "the variance itself")
    assert "relative_variance raised" in check("2.4", lambda x, y: x @ torch.ones(5)).message


# --- issue 29: more forms, more mistakes, writes, dtypes, sizes ----------------------------------------------


def step_with_lists(q, k, v, state):
    out, (S, z) = linear_step_solution(q, k, v, state)
    return [out, [S, z]]


def step_with_named_state(q, k, v, state):
    return step_with_the_package(q, k, v, state)


def step_adds_in_place(q, k, v, state):
    S, z = state
    fq, fk = elu_feature_map(q), elu_feature_map(k)
    S.add_(fk[..., :, None] * v[..., None, :])
    z += fk
    return (fq[..., None, :] @ S).squeeze(-2) / ((fq * z).sum(-1, keepdim=True) + 1e-6), (S, z)


def step_zeros(q, k, v, state):
    """The state updated right, the output forgotten: zeros."""
    out, new_state = linear_step_solution(q, k, v, state)
    return torch.zeros_like(out), new_state


def step_state_swapped(q, k, v, state):
    out, (S, z) = linear_step_solution(q, k, v, state)
    return out, (z, S)


def step_phi_on_values(q, k, v, state):
    return change()(q, k, elu_feature_map(v), state)


def step_elu_only(q, k, v, state):
    S, z = state
    fq, fk = torch.nn.functional.elu(q), torch.nn.functional.elu(k)
    S = S + fk[..., :, None] * v[..., None, :]
    z = z + fk
    return (fq[..., None, :] @ S).squeeze(-2) / ((fq * z).sum(-1, keepdim=True) + 1e-6), (S, z)


def step_eps_on_z(q, k, v, state):
    S, z = state
    fq, fk = elu_feature_map(q), elu_feature_map(k)
    S, z = S + fk[..., :, None] * v[..., None, :], z + fk
    return (fq[..., None, :] @ S).squeeze(-2) / (fq * (z + 1e-6)).sum(-1, keepdim=True), (S, z)


def step_in_float64(q, k, v, state):
    return linear_step_solution(q.double(), k.double(), v.double(), tuple(x.double() for x in state))


@pytest.mark.parametrize("answer", [step_with_lists, step_with_named_state], ids=["lists", "named-state"])
def test_linear_step_right_answers_in_other_containers(answer):
    accepted(check("2.1", answer))


@pytest.mark.parametrize(
    "answer, diagnosis",
    [
        (step_state_swapped, "returned as (z, S)"),
        (step_phi_on_values, "applied to the values too"),
        (step_elu_only, "elu alone"),
        (step_eps_on_z, "eps is added to every feature of z"),
        (change(out=lambda n, d: n / d), "the denominator has no eps"),
    ],
    ids=["state-swapped", "phi-on-values", "elu-only", "eps-on-z", "no-eps"],
)
def test_linear_step_more_mistakes_are_named(answer, diagnosis):
    diagnosed(check("2.1", answer), diagnosis)


def test_linear_step_an_output_of_zeros_is_not_called_a_late_update():
    # on the first token (S = 0) a late update also gives zeros; the other tokens show it is not that
    r = check("2.1", step_zeros)
    undiagnosed(r)
    assert "after the readout" not in r.message


def test_linear_step_rejects_writes_into_the_state():
    rejected(check("2.1", step_adds_in_place), "wrote into its argument `state.S`", "in-place")


def test_linear_step_names_a_wrong_dtype_and_tries_a_long_history():
    rejected(check("2.1", step_in_float64), "has dtype float64, expected float32")
    s = spy(linear_step_solution)
    accepted(check("2.1", s))
    assert any(float(state[1].sum()) > 64 for (q, k, v, state), _ in s.calls)  # z after 64 tokens


@pytest.mark.parametrize("exercise_id", ["2.1", "2.2", "2.3", "2.4"])
@pytest.mark.parametrize("answer", ODD_ANSWERS, ids=ODD_IDS)
def test_answers_of_the_wrong_type_get_feedback(exercise_id, answer):
    rejected(check(exercise_id, answer), "expected a function")
    rejected(check(exercise_id, lambda *args: answer))


def taylor_einsum_shuffled(x):
    """Right too: the features in another order, built with einsum."""
    second = torch.einsum("...d,...e->...de", x, x).flatten(-2) * 2**-0.5
    return torch.cat([second, x, torch.ones_like(x[..., :1])], dim=-1).flip(-1)


def taylor_upper_only(x):
    """Only the pairs d <= e, none scaled: the off-diagonal products are counted once instead of twice."""
    i, j = torch.triu_indices(x.shape[-1], x.shape[-1])
    return torch.cat([torch.ones_like(x[..., :1]), x, x[..., i] * x[..., j] / math.sqrt(2)], dim=-1)


def taylor_in_place(x):
    """Right values, but x /= 2^(1/4) changes the caller's x."""
    x /= 2**0.25
    outer = (x[..., :, None] * x[..., None, :]).flatten(-2)  # (x_d x_e) / sqrt(2)
    return torch.cat([torch.ones_like(x[..., :1]), x * 2**0.25, outer], dim=-1)


def test_taylor_right_answer_in_another_order():
    accepted(check("2.2", taylor_einsum_shuffled))


def test_taylor_packed_without_the_factor_is_named():
    diagnosed(check("2.2", taylor_upper_only), "only the pairs d <= e are kept")


def test_taylor_rejects_writes_into_x_and_tries_64_rows():
    rejected(check("2.2", taylor_in_place), "wrote into its argument `x`")
    s = spy(taylor_flat)
    accepted(check("2.2", s))
    assert longest(s.calls) >= 64


@pytest.mark.parametrize(
    "answer",
    [
        lambda R, Dv: np.sqrt(2 * R * Dv / (R + Dv)),
        lambda R, Dv: np.float32(math.sqrt(2 * R * Dv / (R + Dv))),
        lambda R, Dv: torch.tensor(2.0 * R * Dv / (R + Dv), dtype=torch.float64).sqrt(),
        lambda R, Dv: (2 / (1 / R + 1 / Dv)) ** 0.5,  # the harmonic mean, square-rooted
    ],
    ids=["numpy", "numpy-float32", "tensor", "harmonic-mean"],
)
def test_best_chunk_right_answers_in_every_number_type(answer):
    accepted(check("2.3", answer))


def test_best_chunk_rounded_is_named():
    diagnosed(check("2.3", lambda R, Dv: round(math.sqrt(2 * R * Dv / (R + Dv)))), "rounded to a whole number")


@pytest.mark.parametrize(
    "answer",
    [
        lambda x, y: torch.expm1(((x + y) ** 2).sum()),  # a 0-d tensor
        lambda x, y: np.expm1(((x + y) ** 2).sum().numpy()),  # a numpy.float64
        lambda x, y: math.exp(((x + y) @ (x + y)).item()) - 1,
    ],
    ids=["tensor", "numpy", "exp-minus-1"],
)
def test_relative_variance_right_answers_in_every_number_type(answer):
    accepted(check("2.4", answer))


@pytest.mark.parametrize(
    "answer, diagnosis",
    [
        (lambda x, y: math.expm1(float(((x - y) ** 2).sum())), "|x - y|^2"),
        (lambda x, y: math.expm1(float(((x + y) ** 2).sum()) ** 0.5), "not squared"),
    ],
    ids=["minus", "not-squared"],
)
def test_relative_variance_more_mistakes_are_named(answer, diagnosis):
    diagnosed(check("2.4", answer), diagnosis)


def test_relative_variance_tries_64_dimensions():
    s = spy(relative_variance_solution)
    accepted(check("2.4", s))
    assert longest(s.calls, dim=-1) >= 64


# --- the student's 615 answers: tables of the fixed inputs, random sizes, exercise 2.5 -------------------------


def _best(R, Dv):
    return math.sqrt(2 * R * Dv / (R + Dv))


FIXED_CHUNKS = {(16, 64): _best(16, 64), (64, 64): 8.0, (256, 32): _best(256, 32), (1, 1): 1.0, (8, 24): _best(8, 24)}


def best_chunk_table(R, Dv):
    """Right on the five shapes the old checker always tried, sqrt(R Dv / (R + Dv)) elsewhere."""
    return FIXED_CHUNKS.get((R, Dv), math.sqrt(R * Dv / (R + Dv)))


def test_best_chunk_draws_widths_a_table_of_the_fixed_ones_cannot_know():
    r = check("2.3", best_chunk_table)
    rejected(r, "random, seed ")
    diagnosed(r, "only the ell (ell + 1) / 2 pairs j <= i are needed")


def relative_variance_table(x, y):
    """Right on the four inputs the old checker always tried (told apart by their size), |x|^2 + |y|^2 elsewhere."""
    if x.numel() in (2, 3, 8, 64):
        return relative_variance_solution(x, y)
    return math.expm1(float(x @ x + y @ y))


def test_relative_variance_draws_vectors_a_table_of_the_fixed_ones_cannot_know():
    r = check("2.4", relative_variance_table)
    rejected(r, "random, seed ")
    diagnosed(r, "the cross term 2 x.y is missing")
    s = spy(relative_variance_solution)
    accepted(check("2.4", s, seed=3))
    assert {x.numel() for (x, y), _ in s.calls} - {2, 3, 8, 64}


def test_linear_step_and_taylor_features_draw_long_histories_and_other_widths():
    s = spy(linear_step_solution)
    accepted(check("2.1", s))
    assert {q.shape[-1] for (q, k, v, state), _ in s.calls} - {3, 4, 8}
    assert any(q.dtype == torch.float32 for (q, k, v, state), _ in s.calls)
    t = spy(taylor_flat)
    accepted(check("2.2", t))
    assert longest(t.calls) > 64 and {x.shape[-1] for (x,), _ in t.calls} - {1, 3, 4, 5, 8}


# 2.5 -----------------------------------------------------------------------------------------------------------


def test_taylor_selectivity_is_registered_and_reruns_the_chapters_measurement():
    from attnbook.exercises import ch02, registered
    from attnbook.viz.linear import retrieval_toy, selectivity

    assert "2.5" in registered()
    q, k, v = retrieval_toy()
    q, k = q * 8, k * 8  # sqrt(64)
    _, w = reference.linear_attention(q, k, v, feature_map=lambda x: taylor_flat(x / 2), return_weights=True)
    measured = selectivity(w)[1]  # D = 16: D^(1/4) = 2
    assert measured == pytest.approx(ch02.taylor_right_key(64), rel=1e-9)
    assert round(measured, 2) == 0.38  # the chapter's text
    accepted(check("2.5", measured))


@pytest.mark.parametrize("answer", [0.38, 0.376, np.float64(0.3759), torch.tensor(0.38), np.float32(0.38)])
def test_taylor_selectivity_right_as_printed_and_in_every_number_type(answer):
    accepted(check("2.5", answer))


@pytest.mark.parametrize(
    "answer, says",
    [
        ("softmax", "softmax's weight"),
        ("elu", "elu + 1's weight"),
        ("unscaled", "x / D^(1/4)"),
        ("beta-1", "β = 1"),
        ("entropy", "mean row entropy"),
        (0.37, "Hint"),
        (0.4, "Hint"),
        (None, "no answer yet"),
    ],
)
def test_taylor_selectivity_wrong_answers_are_named(answer, says):
    from attnbook.exercises import ch02

    measured = {
        "softmax": lambda: ch02.taylor_right_key(64, kernel="softmax"),
        "elu": lambda: ch02.taylor_right_key(64, kernel="elu"),
        "unscaled": lambda: ch02.taylor_right_key(64, scaled=False),
        "beta-1": lambda: ch02.taylor_right_key(1),
        "entropy": lambda: ch02.taylor_right_key(64, measure=0),
    }
    value = measured[answer]() if isinstance(answer, str) else answer
    rejected(check("2.5", value), says)


@pytest.mark.parametrize("answer", ODD_ANSWERS, ids=ODD_IDS)
def test_taylor_selectivity_answers_of_the_wrong_type_get_feedback(answer):
    rejected(check("2.5", answer))
