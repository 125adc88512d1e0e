"""Chapter 4's exercise checkers: the solutions pass in every form, plausible mistakes are named, nothing
propagates.

The wrong answers marked "(issue 29)" were written from the exercise statements, as a student would, before
reading the checkers."""

import statistics

import numpy as np
import pytest
import torch
from exercises_support import ODD_ANSWERS, ODD_IDS, accepted, diagnosed, longest, rejected, spy

import attnbook
from attnbook.exercises import ch04, check, registered

EPS = 1e-6


def test_every_exercise_of_the_chapter_is_registered():
    assert [i for i in registered() if i.startswith("4.")] == ["4.1", "4.2", "4.3", "4.4"]


# 4.1 -------------------------------------------------------------------------------------------------


def test_the_head_budget_is_h_and_the_checker_knows_it():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 6, 10, 3, generator=g, dtype=torch.float64) for _ in range(3))
    _, stats = attnbook.mobile_attention(q, k, v, eps=0.0, return_flows=True)
    per_token = stats.conserved_outgoing_raw.sum(1)  # (B, N)
    torch.testing.assert_close(per_token, torch.full_like(per_token, 6.0))
    assert check("4.1", 6).passed


@pytest.mark.parametrize("answer, says", [(10, "10 = N is Flow-Attention's budget"), (2, "Hint"), (None, "no answer")])
def test_head_budget_wrong_answers(answer, says):
    r = check("4.1", answer)
    assert not r.passed and says in r.message


# 4.2 -------------------------------------------------------------------------------------------------


def dot(x, y, eps=EPS):
    return ((x + eps) * (y + eps)).sum(-1)


def head_conserved_outgoing(q, k):
    qs, ks = torch.sigmoid(q), torch.sigmoid(k)
    incoming = dot(qs, ks.sum(1, keepdim=True))  # (B, H, N): over the heads
    return dot(ks, (qs / incoming[..., None]).sum(1, keepdim=True))


def test_head_conserved_outgoing_solution_is_accepted():
    r = check("4.2", head_conserved_outgoing)
    assert r.passed and "H = 1 to 12" in r.message, r.message


def over_sequence(q, k):
    qs, ks = torch.sigmoid(q), torch.sigmoid(k)
    incoming = dot(qs, ks.sum(-2, keepdim=True))
    return dot(ks, (qs / incoming[..., None]).sum(-2, keepdim=True))


def clamped(q, k):
    return head_conserved_outgoing(q, k).clamp(-1, 1)


def outgoing_only(q, k):
    qs, ks = torch.sigmoid(q), torch.sigmoid(k)
    return dot(ks, qs.sum(1, keepdim=True))


def incoming_from_queries(q, k):
    qs, ks = torch.sigmoid(q), torch.sigmoid(k)
    incoming = dot(qs, qs.sum(1, keepdim=True))
    return dot(ks, (qs / incoming[..., None]).sum(1, keepdim=True))


def no_eps(q, k):
    qs, ks = torch.sigmoid(q), torch.sigmoid(k)
    incoming = (qs * ks.sum(1, keepdim=True)).sum(-1)
    return (ks * (qs / incoming[..., None]).sum(1, keepdim=True)).sum(-1)


def no_sigmoid(q, k):
    incoming = dot(q, k.sum(1, keepdim=True))
    return dot(k, (q / incoming[..., None]).sum(1, keepdim=True))


@pytest.mark.parametrize(
    "wrong, says",
    [
        (over_sequence, "run over the sequence (dim -2) instead of the heads"),
        (clamped, "the clamp is applied"),
        (outgoing_only, "it is the outgoing flow O"),
        (incoming_from_queries, "sums the query heads instead of the key heads"),
        (no_eps, "eps is left out"),
        (no_sigmoid, "sigmoid features are missing"),
    ],
    ids=lambda x: getattr(x, "__name__", "")[:24],
)
def test_head_conserved_outgoing_mistakes_are_named(wrong, says):
    r = check("4.2", wrong)
    assert not r.passed and "It looks like" in r.message and says in r.message, r.message


def test_head_conserved_outgoing_shape_exceptions_and_stubs():
    r = check("4.2", lambda q, k: head_conserved_outgoing(q, k).sum(1))
    assert "has shape (1, 5), expected (1, 3, 5)" in r.message
    r = check("4.2", lambda q, k: q @ k)
    assert "raised RuntimeError" in r.message

    def stub(q, k):
        raise NotImplementedError

    assert "not written yet" in check("4.2", stub).message


# 4.3 -------------------------------------------------------------------------------------------------


def test_row_sums_are_n_over_h_for_equal_features():
    q = torch.zeros(1, 3, 12, 2, dtype=torch.float64)  # sigmoid(0) = 1/2 everywhere
    v = torch.eye(12, dtype=torch.float64).expand(1, 3, 12, 12)  # one-hot values: output row = weights
    out, stats = attnbook.mobile_attention(q, q, v, eps=0.0, return_flows=True)
    row_sums = out.sum(-1) / stats.allocation
    torch.testing.assert_close(row_sums, torch.full_like(row_sums, 4.0))
    assert check("4.3", 4).passed


@pytest.mark.parametrize("answer, says", [(1, "Flow-Attention's row sum"), (12, "12 = N"), (5, "Hint")])
def test_row_sums_wrong_answers(answer, says):
    r = check("4.3", answer)
    assert not r.passed and says in r.message


# 4.4 -------------------------------------------------------------------------------------------------


def spread(out, v):
    return (out.var(-2).sum(-1) / v.var(-2).sum(-1)).mean().item()


def test_the_spread_grows_with_the_scale_as_the_checker_expects():
    ratios = []
    for seed in range(3):
        g = torch.Generator().manual_seed(seed)
        tokens = torch.randn(2, 128, 32, generator=g, dtype=torch.float64)
        proj = [torch.randn(32, 32, generator=g, dtype=torch.float64) / 32**0.5 for _ in range(3)]
        q, k, v = ((tokens @ p).view(2, 128, 8, 4).transpose(1, 2) for p in proj)
        base = spread(attnbook.linear_attention(q, k, v, feature_map=torch.sigmoid), v)
        big = spread(attnbook.linear_attention(4 * q, 4 * k, v, feature_map=torch.sigmoid), v)
        ratios.append(big / base)
    assert all(check("4.4", r).passed for r in ratios), ratios  # the chapter's cell, seeds 0, 1, 2


@pytest.mark.parametrize("answer, says", [(0.07, "the spread shrinks"), (2.0, "Hint"), (100.0, "Hint")])
def test_spread_growth_wrong_answers(answer, says):
    rejected(check("4.4", answer), says)


# --- issue 29 -------------------------------------------------------------------------------------------------


def test_the_literal_conserved_outgoing_flow_is_the_packages():
    q, k = (torch.randn(2, 5, 9, 3, dtype=torch.float64) for _ in range(2))
    _, stats = attnbook.mobile_attention(q, k, torch.zeros(2, 5, 9, 1, dtype=torch.float64), return_flows=True)
    torch.testing.assert_close(ch04.head_conserved_outgoing_reference(q, k), stats.conserved_outgoing_raw)


@pytest.mark.parametrize("exercise_id, right", [("4.1", 6), ("4.3", 4)])
@pytest.mark.parametrize("kind", [int, float, np.int64, np.float32, torch.tensor, np.array])
def test_derived_numbers_in_every_number_type(exercise_id, right, kind):
    accepted(check(exercise_id, kind(right)))


@pytest.mark.parametrize(
    "exercise_id, answer, says",
    [("4.1", 60, "60 = H N"), ("4.1", 1, "one query head"), ("4.3", 3, "3 = H"), ("4.3", 0.25, "upside down")],
)
def test_derived_numbers_more_wrong_answers(exercise_id, answer, says):
    rejected(check(exercise_id, answer), says)


def outgoing_by_loop(q, k, eps=EPS):
    """Right too: the heads summed in a Python loop."""
    qs, ks = torch.sigmoid(q), torch.sigmoid(k)
    H = q.shape[1]
    k_sum = sum(ks[:, h] for h in range(H))  # (B, N, D)
    incoming = [((qs[:, h] + eps) * (k_sum + eps)).sum(-1) for h in range(H)]  # H x (B, N)
    q_over_i = sum(qs[:, h] / incoming[h][..., None] for h in range(H))  # (B, N, D)
    return torch.stack([((ks[:, h] + eps) * (q_over_i + eps)).sum(-1) for h in range(H)], dim=1)


def eps_once_per_dot(q, k):
    qs, ks = torch.sigmoid(q), torch.sigmoid(k)
    incoming = (qs * ks.sum(1, keepdim=True)).sum(-1) + EPS
    return (ks * (qs / incoming[..., None]).sum(1, keepdim=True)).sum(-1) + EPS


def incoming_without_eps(q, k):
    qs, ks = torch.sigmoid(q), torch.sigmoid(k)
    incoming = (qs * ks.sum(1, keepdim=True)).sum(-1)
    return dot(ks, (qs / incoming[..., None]).sum(1, keepdim=True))


def outgoing_without_eps(q, k):
    qs, ks = torch.sigmoid(q), torch.sigmoid(k)
    incoming = dot(qs, ks.sum(1, keepdim=True))
    return (ks * (qs / incoming[..., None]).sum(1, keepdim=True)).sum(-1)


def eps_on_features_only(q, k):
    qs, ks = torch.sigmoid(q), torch.sigmoid(k)
    incoming = ((qs + EPS) * ks.sum(1, keepdim=True)).sum(-1)
    return ((ks + EPS) * (qs / incoming[..., None]).sum(1, keepdim=True)).sum(-1)


def sigmoid_in_place(q, k):
    qs, ks = torch.sigmoid_(q), torch.sigmoid_(k)
    incoming = dot(qs, ks.sum(1, keepdim=True))
    return dot(ks, (qs / incoming[..., None]).sum(1, keepdim=True))


def test_head_conserved_outgoing_another_right_formulation():
    accepted(check("4.2", outgoing_by_loop))


@pytest.mark.parametrize(
    "wrong, says",
    [
        (eps_once_per_dot, "eps is added once to each dot product"),
        (incoming_without_eps, "eps is left out of the incoming flow I"),
        (outgoing_without_eps, "eps is left out of the outgoing dot product"),
        (eps_on_features_only, "eps is added to one vector of each dot product only (the features)"),
    ],
    ids=lambda x: getattr(x, "__name__", "")[:24],
)
def test_head_conserved_outgoing_eps_mistakes_are_named(wrong, says):
    diagnosed(check("4.2", wrong), says)


def test_head_conserved_outgoing_rejects_writes_tries_64_tokens_8_heads_and_names_dtypes():
    rejected(check("4.2", sigmoid_in_place), "wrote into its argument `q`")
    s = spy(head_conserved_outgoing)
    accepted(check("4.2", s))
    assert longest(s.calls) >= 64 and longest(s.calls, dim=1) >= 8
    rejected(check("4.2", lambda q, k: head_conserved_outgoing(q.double(), k.double())), "expected float32")


@pytest.mark.parametrize("exercise_id", ["4.1", "4.3", "4.4"])
@pytest.mark.parametrize("answer", ODD_ANSWERS, ids=ODD_IDS)
def test_number_answers_of_the_wrong_type_get_feedback(exercise_id, answer):
    rejected(check(exercise_id, answer))


@pytest.mark.parametrize("answer", ODD_ANSWERS, ids=ODD_IDS)
def test_function_answers_of_the_wrong_type_get_feedback(answer):
    rejected(check("4.2", answer), "expected a function")
    rejected(check("4.2", lambda *args: answer))


growth = ch04.spread_growth


@pytest.mark.parametrize(
    "answer",
    [
        growth(0),  # the chapter's cell as it is: seed 0
        growth(5),  # another seed of the same experiment
        np.float64(growth(0)),
        torch.tensor(growth(0), dtype=torch.float64),
        statistics.fmean(growth(s) for s in range(8)),  # the mean over the seeds 0 .. 7
        [growth(s) for s in range(8)],  # the growths of the seeds 0 .. 7
        tuple(np.float64(growth(s)) for s in range(4)),
    ],
    ids=["seed-0", "seed-5", "numpy", "tensor", "mean", "list", "tuple-of-numpy"],
)
def test_spread_growth_right_answers(answer):
    accepted(check("4.4", answer))


def test_spread_growth_quotes_the_spread_over_the_seeds_it_asks_about():
    """The solution says "give or take 0.7" over the seeds 0 to 7; the checker said 0.83 (over 16 seeds)."""
    growths = [growth(s) for s in range(8)]
    r = check("4.4", statistics.fmean(growths))
    assert r.passed and f"varies by about {statistics.stdev(growths):.2g}." in r.message
    assert round(statistics.stdev(growths), 1) == 0.7  # the solution's number


@pytest.mark.parametrize(
    "answer, says",
    [
        (growth(0, D=8), "the growth at D = 8"),  # (issue 29) accepted before: rtol 0.6 around 15
        (growth(0, D=2), "the growth at D = 2"),
        (growth(0, D=16), "the growth at D = 16"),
        (statistics.fmean(growth(s, D=8) for s in range(8)), "the growth at D = 8"),
        ([growth(s, D=2) for s in range(8)], "D = 2"),
        (growth(0, k_scale=1.0), "only q is scaled"),
        (growth(0, q_scale=1.0), "only k is scaled"),
        (growth(0, v_scale=4.0), "v is scaled too"),
        (growth(0, q_scale=2.0, k_scale=2.0), "scale 2"),
        (1 / growth(0), "the spread shrinks"),
        (6.0, "Hint"),
        (24.0, "Hint"),
        (13.0, "Hint"),
        (18.5, "Hint"),
    ],
    ids=[
        "D8",
        "D2",
        "D16",
        "mean-D8",
        "list-D2",
        "q-only",
        "k-only",
        "v-too",
        "scale-2",
        "inverse",
        "6",
        "24",
        "13",
        "18.5",
    ],
)
def test_spread_growth_wrong_answers_are_told_from_the_measured_spread(answer, says):
    rejected(check("4.4", answer), says)


def test_spread_growth_the_mean_is_exact_to_the_digits_it_is_given_with():
    """(the student's 615 answers) One number was taken as a mean of 8 seeds and accepted within
    [14.65, 16.79]: one seed measured at the wrong width passed, and so did the guess 16 = 4^2. The experiment is
    exact in float64, so the mean of the seeds 0 .. 7 is judged by its rounding only."""
    asked = [growth(s) for s in range(8)]
    mean, sd = statistics.fmean(asked), statistics.stdev(asked)
    assert 0.2 < sd < 2  # the growth varies from seed to seed: a window of 3 standard errors is wide
    for digits in (3, 4, 6):
        accepted(check("4.4", float(f"{mean:.{digits}g}")))
    for wrong in (16.0, 16, mean + 0.5 * sd, mean - 0.3 * sd, growth(1, D=8), growth(2, D=8), float(f"{mean:.2g}")):
        rejected(check("4.4", wrong))
    rejected(check("4.4", 16), "a guess")
    rejected(check("4.4", growth(1, D=8)), "the growth at D = 8")
    rejected(check("4.4", statistics.fmean(growth(s) for s in range(10))), "the seeds 0 to 9")


@pytest.mark.parametrize("form", [list, tuple, torch.tensor, np.array], ids=["list", "tuple", "tensor", "ndarray"])
def test_spread_growth_takes_the_eight_growths_in_any_container(form):
    """(issue 29) The solution builds the growths as a tensor; as a tensor or an array they were 'expected a
    number, got a tensor of shape (8,)', though the same values as a list passed."""
    growths = ch04._measured()[:8]  # seeds 0 .. 7, as the statement asks
    result = check("4.4", form(growths))
    assert result.passed and "the mean of your 8 growths" in result.message, result.message


def test_head_conserved_outgoing_draws_more_heads_and_longer_sequences():
    """(the student's 615 answers) The inputs stopped at H = 8 and N = 65, the same on every call."""
    s = spy(head_conserved_outgoing)
    accepted(check("4.2", s, seed=1))
    assert longest(s.calls) > 128 and any(
        "random, seed 1" in c.label for c in ch04.conserved_outgoing_cases(ch04.Draw(1))
    )
