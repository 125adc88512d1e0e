"""Chapter 5's exercise checkers: the solutions pass, plausible mistakes are named, nothing crashes."""

import pytest
import torch
import torch.nn.functional as F

from attnbook import exercises
from attnbook.exercises import ch05


def top_k_gates(logits, k):
    """The chapter's solution of exercise 5.2."""
    p = F.softmax(logits, dim=-1)  # (B, N, E)
    top = p.topk(k, dim=-1)
    kept = torch.zeros_like(p).scatter(-1, top.indices, top.values)  # (B, N, E)
    return kept / kept.sum(-1, keepdim=True) * k


def load_balancing_loss(probs, k):
    """The chapter's solution of exercise 5.3."""
    E = probs.shape[-1]
    chosen = torch.zeros_like(probs).scatter(-1, probs.topk(k, dim=-1).indices, 1.0)
    f = chosen.flatten(0, -2).mean(0)  # (E,) load
    P = probs.flatten(0, -2).mean(0)  # (E,) importance
    return E * (f * P).sum()


def test_every_chapter_5_exercise_is_registered():
    assert {"5.1", "5.2", "5.3", "5.4"} <= set(exercises.registered())


# ------------------------------------------------------------------------------------------------ 5.1


def test_mean_gate_accepts_the_derived_value_and_rejects_others():
    s, k, a_1 = (ch05.mean_gate_setting[key] for key in ("shared_head", "routed_head", "a_1"))
    right = (a_1 * s + (2 - a_1) * k) / (s + k)
    assert exercises.check("5.1", right).passed
    assert exercises.check("5.1", torch.tensor(right)).passed
    wrong = exercises.check("5.1", 1.0)
    assert not wrong.passed and "Hint" in wrong.message
    assert "no answer yet" in exercises.check("5.1", None).message
    assert "expected a number" in exercises.check("5.1", "1.1").message


# ------------------------------------------------------------------------------------------------ 5.2


def test_top_k_gates_accepts_the_solution():
    result = exercises.check("5.2", top_k_gates)
    assert result.passed, result.message


@pytest.mark.parametrize(
    ("wrong", "diagnosis"),
    [
        (ch05._not_renormalised, "not renormalised"),
        (ch05._no_factor_k, "factor h_r is missing"),
        (ch05._softmax_over_tokens, "over the tokens"),
        (ch05._no_top_k, "top-h_r choice is missing"),
        (ch05._smallest_k, "least* probable"),
        (ch05._zeros_not_minus_inf, "instead of -inf"),
    ],
    ids=["no-renormalisation", "no-factor-k", "softmax-over-tokens", "no-top-k", "smallest-k", "zero-not-inf"],
)
def test_top_k_gates_names_plausible_mistakes(wrong, diagnosis):
    result = exercises.check("5.2", wrong)
    assert not result.passed
    assert diagnosis in result.message, result.message


def test_top_k_gates_a_student_written_mistake_is_diagnosed():
    def forgot_renormalising(logits, k):  # as a student would write it
        p = logits.softmax(-1)
        idx = p.topk(k, -1).indices
        return torch.zeros_like(p).scatter(-1, idx, p.gather(-1, idx)) * k

    assert "not renormalised" in exercises.check("5.2", forgot_renormalising).message


def test_top_k_gates_wrong_shape_raise_and_stub_are_reported():
    shape = exercises.check("5.2", lambda logits, k: top_k_gates(logits, k)[..., :k])
    assert not shape.passed and "has shape" in shape.message and "expected (2, 5, 6)" in shape.message

    def raises(logits, k):
        return logits / 0 @ torch.ones(3)

    reported = exercises.check("5.2", raises)
    assert not reported.passed and "raised RuntimeError" in reported.message

    def stub(logits, k):
        raise NotImplementedError

    assert "not written yet" in exercises.check("5.2", stub).message


# ------------------------------------------------------------------------------------------------ 5.3


def test_load_balancing_loss_accepts_the_solution():
    result = exercises.check("5.3", load_balancing_loss)
    assert result.passed, result.message


@pytest.mark.parametrize(
    ("wrong", "diagnosis"),
    [
        (ch05._counts_not_fractions, "counts tokens"),
        (ch05._no_factor_e, "factor E is missing"),
        (ch05._importance_of_chosen_only, "only the chosen heads"),
        (ch05._load_from_top_1, "top-1"),
        (ch05._factor_e_squared, "E^2 instead of E"),
    ],
    ids=["counts", "no-E", "importance-of-chosen", "top-1-load", "E-squared"],
)
def test_load_balancing_loss_names_plausible_mistakes(wrong, diagnosis):
    result = exercises.check("5.3", wrong)
    assert not result.passed
    assert diagnosis in result.message, result.message


def test_load_balancing_loss_wrong_shape_raise_and_stub_are_reported():
    per_head = exercises.check("5.3", lambda probs, k: probs.flatten(0, -2).mean(0))
    assert not per_head.passed and "shape" in per_head.message
    assert "raised ZeroDivisionError" in exercises.check("5.3", lambda probs, k: 1 / 0).message
    assert "returned None" in exercises.check("5.3", lambda probs, k: None).message


# ------------------------------------------------------------------------------------------------ 5.4


def test_heads_used_accepts_the_count_the_experiment_gives_and_rejects_others():
    from attnbook.viz import moh as moh_viz

    state = moh_viz.compute_routing(offset=ch05.SKEWED["offset"], seed=ch05.SKEWED["seed"])
    run = moh_viz.train_router(state, steps=ch05.SKEWED["steps"], lr=ch05.SKEWED["lr"])
    used = int((run.state.load > 0).sum())
    assert 1 <= used <= state.routed
    assert exercises.check("5.4", used).passed
    assert not exercises.check("5.4", used + 1).passed
    assert "no answer yet" in exercises.check("5.4", None).message
