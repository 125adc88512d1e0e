"""Chapter 5's exercise checkers: the solutions pass in every form, plausible mistakes are named, nothing
crashes.

The wrong answers marked "(issue 29)" were written from the exercise statements, as a student would, before
reading the checkers."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from exercises_support import ODD_ANSWERS, ODD_IDS, accepted, diagnosed, longest, rejected, spy

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
    wrong = exercises.check("5.1", 1.05)
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


# --- issue 29 -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", [float, np.float64, np.float32, torch.tensor, np.array])
def test_mean_gate_in_every_number_type(kind):
    accepted(exercises.check("5.1", kind(1.1)))


@pytest.mark.parametrize(
    "answer, says",
    [
        (1.0, "when h_s = h_r"),
        (1.2, "is α_1"),
        (0.9, "swapped"),
        (4.4, "the sum of the active gates"),
        (2.2, "not by the 2 stages"),
    ],
)
def test_mean_gate_wrong_answers_are_named(answer, says):
    rejected(exercises.check("5.1", answer), says)


def gates_by_softmax_of_kept_logits(logits, k):
    """Right too: the softmax over the k largest logits only, times k."""
    top = logits.topk(k, dim=-1)
    return torch.zeros_like(logits).scatter(-1, top.indices, k * top.values.softmax(-1))


def gates_raw_kept(logits, k):
    p = logits.softmax(-1)
    top = p.topk(k, -1)
    return torch.zeros_like(p).scatter(-1, top.indices, top.values)


def gates_with_eps(logits, k):
    p = F.softmax(logits, dim=-1)
    top = p.topk(k, dim=-1)
    kept = torch.zeros_like(p).scatter(-1, top.indices, top.values)
    return k * kept / (kept.sum(-1, keepdim=True) + 1e-6)


def gates_over_tokens(logits, k):
    p = F.softmax(logits, dim=1)
    top = p.topk(k, dim=-1)
    kept = torch.zeros_like(p).scatter(-1, top.indices, top.values)
    return kept / kept.sum(-1, keepdim=True) * k


def gates_in_place(logits, k):
    p = logits.exp_().div_(logits.sum(-1, keepdim=True))  # the softmax, in the caller's tensor
    top = p.topk(k, dim=-1)
    kept = torch.zeros_like(p).scatter(-1, top.indices, top.values)
    return kept / kept.sum(-1, keepdim=True) * k


def test_top_k_gates_another_right_formulation():
    accepted(exercises.check("5.2", gates_by_softmax_of_kept_logits))


@pytest.mark.parametrize(
    "wrong, diagnosis",
    [
        (gates_raw_kept, "neither renormalised nor multiplied by h_r"),
        (gates_with_eps, "an eps is added to the renormalising sum"),
        (gates_over_tokens, "over the tokens"),
    ],
    ids=["raw-kept", "eps", "over-tokens"],
)
def test_top_k_gates_more_mistakes_are_named(wrong, diagnosis):
    diagnosed(exercises.check("5.2", wrong), diagnosis)


def test_top_k_gates_rejects_writes_tries_64_tokens_and_names_dtypes():
    rejected(exercises.check("5.2", gates_in_place), "wrote into its argument `logits`")
    s = spy(top_k_gates)
    accepted(exercises.check("5.2", s))
    assert longest(s.calls) >= 64
    r = exercises.check("5.2", lambda logits, k: top_k_gates(logits.double(), k))
    rejected(r, "has dtype float64, expected float32")


def loss_as_a_number(probs, k):
    """Right too: a Python float where the layer's loss is a 0-d tensor."""
    return float(load_balancing_loss(probs, k))


def loss_from_numpy(probs, k):
    """Right too: computed in numpy, a numpy.float64."""
    p = probs.flatten(0, -2).numpy()
    E = p.shape[-1]
    top = np.argsort(-p, axis=-1)[:, :k]
    chosen = np.zeros_like(p)
    np.put_along_axis(chosen, top, 1.0, axis=-1)
    return E * (chosen.mean(0) * p.mean(0)).sum()


def loss_f_over_k(probs, k):
    E = probs.shape[-1]
    chosen = torch.zeros_like(probs).scatter(-1, probs.topk(k, dim=-1).indices, 1.0)
    f = chosen.flatten(0, -2).mean(0) / k  # a distribution over heads
    return E * (f * probs.flatten(0, -2).mean(0)).sum()


def loss_first_sequence(probs, k):
    return load_balancing_loss(probs[0][None], k)


def loss_in_float64(probs, k):
    return load_balancing_loss(probs.double(), k)


@pytest.mark.parametrize("answer", [loss_as_a_number, loss_from_numpy], ids=["float", "numpy"])
def test_load_balancing_loss_right_answers_in_other_number_types(answer):
    accepted(exercises.check("5.3", answer))


@pytest.mark.parametrize(
    "wrong, diagnosis",
    [(loss_f_over_k, "divided by h_r"), (loss_first_sequence, "only the first sequence")],
    ids=["f-over-k", "first-sequence"],
)
def test_load_balancing_loss_more_mistakes_are_named(wrong, diagnosis):
    diagnosed(exercises.check("5.3", wrong), diagnosis)


def test_load_balancing_loss_tries_64_tokens_and_names_dtypes():
    s = spy(load_balancing_loss)
    accepted(exercises.check("5.3", s))
    assert longest(s.calls) >= 64
    rejected(exercises.check("5.3", loss_in_float64), "has dtype float64, expected float32")


def test_heads_used_before_training_and_every_head_are_named():
    from attnbook.viz import moh as moh_viz

    state = moh_viz.compute_routing(offset=ch05.SKEWED["offset"], seed=ch05.SKEWED["seed"])
    rejected(exercises.check("5.4", int((state.load > 0).sum())), "before training")
    rejected(exercises.check("5.4", state.routed), "every routed head")
    used = ch05._heads_used_after_training()[0]
    accepted(exercises.check("5.4", np.int64(used)))
    accepted(exercises.check("5.4", torch.tensor(used)))


@pytest.mark.parametrize("exercise_id", ["5.1", "5.4"])
@pytest.mark.parametrize("answer", ODD_ANSWERS, ids=ODD_IDS)
def test_number_answers_of_the_wrong_type_get_feedback(exercise_id, answer):
    rejected(exercises.check(exercise_id, answer))


@pytest.mark.parametrize("exercise_id", ["5.2", "5.3"])
@pytest.mark.parametrize("answer", ODD_ANSWERS, ids=ODD_IDS)
def test_function_answers_of_the_wrong_type_get_feedback(exercise_id, answer):
    rejected(exercises.check(exercise_id, answer), "expected a function")
    rejected(exercises.check(exercise_id, lambda *args: answer))


def test_top_k_gates_with_an_exp_that_overflows_is_told_to_subtract_the_maximum():
    """(issue 29) Logits shifted by 800 (float64) and 100 (float32) change no gate; exp without the maximum
    overflows, the answer is NaN there, and the note says why."""

    def gates_with(softmax):
        def top_k_gates(logits, k):
            p = softmax(logits)
            mask = torch.zeros_like(p, dtype=torch.bool).scatter(-1, logits.topk(k, dim=-1).indices, True)
            kept = torch.where(mask, p, 0)
            return k * kept / kept.sum(-1, keepdim=True)

        return top_k_gates

    assert exercises.check("5.2", gates_with(lambda x: torch.softmax(x, -1))).passed
    r = exercises.check("5.2", gates_with(lambda x: x.exp() / x.exp().sum(-1, keepdim=True)))
    assert not r.passed and "shifted by 800" in r.message and "largest logit before exp" in r.message, r.message


@pytest.mark.parametrize(
    "form",
    [lambda loss: loss.numpy(), lambda loss: np.array(loss.item()), lambda loss: loss.item(), lambda loss: loss],
    ids=["0-d numpy", "np.array of a float", "Python float", "0-d tensor"],
)
def test_load_balancing_loss_is_accepted_as_any_0_d_number(form):
    """(issue 29) A 0-d numpy result was turned into shape (1,) and rejected as 'the result has shape (1,),
    expected ()'."""
    result = exercises.check("5.3", lambda probs, k: form(load_balancing_loss(probs, k)))
    assert result.passed, result.message


def test_routing_checkers_draw_sizes_the_statement_does_not_mention():
    """(the student's 615 answers) The inputs stopped at 70 tokens and 16 heads, the same on every call."""
    from attnbook.exercises import ch05

    cases = ch05._gate_cases(ch05.Draw(5)) + ch05._loss_cases(ch05.Draw(5))
    drawn = [c for c in cases if "random, seed 5" in c.label]
    assert len(drawn) == 4 and max(c.args[0].shape[1] for c in drawn) > 70
