"""Chapter 6's exercise checkers: the solutions pass, plausible mistakes are named, nothing crashes."""

import pytest
import torch

from attnbook import exercises
from attnbook.exercises import ch06
from attnbook.lab import headtohead as h2h


def matmul_flops(mechanism, B, H, N, D, Dv):
    """The chapter's solution of exercise 6.2."""
    if mechanism == "softmax":
        return B * H * (2 * N * N * D + 2 * N * N * Dv)  # Q K^T, then A V
    return B * H * (4 * N * D * Dv + 2 * N * D)  # phi(K)^T V, phi(Q) S, phi(Q) z


def test_every_chapter_6_exercise_is_registered():
    assert {"6.1", "6.2", "6.3", "6.4"} <= set(exercises.registered())


def test_crossover_accepts_the_derived_value_and_rejects_the_naive_one():
    D, Dv = ch06.CROSSOVER["D"], ch06.CROSSOVER["Dv"]
    derived = D * (2 * Dv + 1) / (D + Dv)  # 2 N^2 (D + Dv) = 4 N D Dv + 2 N D
    assert derived == 43
    assert exercises.check("6.1", derived).passed
    naive = exercises.check("6.1", D)  # N = D holds only for D_v = D and no normaliser
    assert not naive.passed and "Hint" in naive.message


def test_crossover_counts_are_really_equal_there():
    D, Dv = ch06.CROSSOVER["D"], ch06.CROSSOVER["Dv"]
    assert ch06._counted_flops("softmax", 1, 1, 43, D, Dv) == ch06._counted_flops("linear", 1, 1, 43, D, Dv)


def test_matmul_flops_accepts_the_solution():
    result = exercises.check("6.2", matmul_flops)
    assert result.passed, result.message


@pytest.mark.parametrize(
    ("wrong", "diagnosis"),
    [
        (ch06._half, "multiply-add is counted as one FLOP"),
        (ch06._no_value_product, "weights times V"),
        (ch06._no_normaliser, "normaliser"),
        (ch06._d_for_dv, "value width D_v"),
        (ch06._per_head, "multiply by B H"),
    ],
    ids=["half", "no-AV", "no-normaliser", "D-for-Dv", "per-head"],
)
def test_matmul_flops_names_plausible_mistakes(wrong, diagnosis):
    result = exercises.check("6.2", wrong)
    assert not result.passed
    assert diagnosis in result.message, result.message


def test_matmul_flops_wrong_type_raise_and_stub_are_reported():
    assert "expected a number" in exercises.check("6.2", lambda *a: "many").message
    assert "raised KeyError" in exercises.check("6.2", lambda m, *a: {}[m]).message

    def stub(mechanism, B, H, N, D, Dv):
        raise NotImplementedError

    assert "not written yet" in exercises.check("6.2", stub).message


def test_step_time_fit_accepts_the_least_squares_prediction():
    ops = {"softmax": 187, "linear": 258, "flow": 422, "moh": 237, "mobile": 1561}
    ms = {"softmax": 10.0, "linear": 11.0, "flow": 14.0, "moh": 11.0, "mobile": 30.0}
    x = torch.tensor([187.0, 258, 422, 237])
    y = torch.tensor([10.0, 11, 14, 11])
    b = ((x - x.mean()) * (y - y.mean())).sum() / ((x - x.mean()) ** 2).sum()
    prediction = float(y.mean() + b * (1561 - x.mean()))
    assert exercises.check("6.3", prediction, ops=ops, ms=ms).passed
    assert not exercises.check("6.3", ms["mobile"], ops=ops, ms=ms).passed  # the measurement is not the fit
    assert "same mechanisms" in exercises.check("6.3", 1.0, ops={"mobile": 1}, ms={}).message


def test_lookup_heads_counts_the_heads_of_a_model():
    task = h2h.RecallTask(n_pairs=3, n_keys=4, n_values=3)
    model = h2h.train("softmax", task, steps=2, eval_every=2, d_model=8, n_heads=2, n_layers=1, keep_model=True).model
    tokens, _ = task.batch(16, torch.Generator().manual_seed(0))
    count = int((h2h.lookup_share(model, tokens, task).mean(0) > 0.5).sum())
    assert exercises.check("6.4", count, model=model, tokens=tokens, task=task).passed
    assert not exercises.check("6.4", count + 1, model=model, tokens=tokens, task=task).passed
