"""Chapter 3's exercise checkers: the solutions pass in every form, plausible mistakes are named, nothing
propagates.

The wrong answers marked "(issue 29)" were written from the exercise statements, as a student would, before
reading the checkers."""

import math

import numpy as np
import pytest
import torch
from exercises_support import (
    ODD_ANSWERS,
    ODD_IDS,
    accepted,
    causal_kw,
    diagnosed,
    longest,
    rejected,
    spy,
)

import attnbook
from attnbook.exercises import ch03, check, registered
from attnbook.viz import flow as flow_viz


def test_every_exercise_of_the_chapter_is_registered():
    assert [i for i in registered() if i.startswith("3.")] == ["3.1", "3.2", "3.3", "3.4", "3.5"]


# 3.1 -------------------------------------------------------------------------------------------------


def test_total_outgoing_flow_is_n_and_the_checker_knows_it():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, n, 3, generator=g, dtype=torch.float64) for n in (5, 7, 7))
    _, stats = attnbook.flow_attention(q, k, v, eps=0.0, return_flows=True)
    total = stats.conserved_outgoing_raw.sum(-1)
    torch.testing.assert_close(total, torch.full_like(total, 5.0))
    assert check("3.1", 5).passed and check("3.1", 5.0).passed


@pytest.mark.parametrize(
    "answer, says",
    [(7, "7 is M, the number of sources"), (3, "is not right"), (None, "no answer yet"), ("5", "expected a number")],
)
def test_total_outgoing_flow_wrong_answers(answer, says):
    r = check("3.1", answer)
    assert not r.passed and says in r.message


# 3.2 -------------------------------------------------------------------------------------------------


def causal_incoming(q, k, eps=1e-6):
    qs, ks = torch.sigmoid(q), torch.sigmoid(k)
    t = torch.arange(1, q.shape[-2] + 1, dtype=q.dtype)
    return ((qs + eps) * (ks.cumsum(-2) + eps)).sum(-1) / t


def test_causal_incoming_solution_is_accepted():
    r = check("3.2", causal_incoming)
    assert r.passed and r.message.startswith("causal_incoming is right on 9 inputs"), r.message


def no_t(q, k):
    qs, ks = torch.sigmoid(q), torch.sigmoid(k)
    return ((qs + 1e-6) * (ks.cumsum(-2) + 1e-6)).sum(-1)


def whole_sequence(q, k):
    qs, ks = torch.sigmoid(q), torch.sigmoid(k)
    t = torch.arange(1, q.shape[-2] + 1, dtype=q.dtype)
    return ((qs + 1e-6) * (ks.sum(-2, keepdim=True) + 1e-6)).sum(-1) / t


def whole_sequence_flow(q, k):  # the non-causal incoming flow
    qs, ks = torch.sigmoid(q), torch.sigmoid(k)
    return ((qs + 1e-6) * (ks.sum(-2, keepdim=True) + 1e-6)).sum(-1)


def strict_prefix(q, k):
    qs, ks = torch.sigmoid(q), torch.sigmoid(k)
    t = torch.arange(1, q.shape[-2] + 1, dtype=q.dtype)
    return ((qs + 1e-6) * (ks.cumsum(-2) - ks + 1e-6)).sum(-1) / t


def divides_by_i(q, k):
    qs, ks = torch.sigmoid(q), torch.sigmoid(k)
    i = torch.arange(q.shape[-2], dtype=q.dtype)
    return ((qs + 1e-6) * (ks.cumsum(-2) + 1e-6)).sum(-1) / i


def eps_once(q, k):
    qs, ks = torch.sigmoid(q), torch.sigmoid(k)
    t = torch.arange(1, q.shape[-2] + 1, dtype=q.dtype)
    return ((qs * ks.cumsum(-2)).sum(-1) + 1e-6) / t


def no_sigmoid(q, k):
    t = torch.arange(1, q.shape[-2] + 1, dtype=q.dtype)
    return ((q + 1e-6) * (k.cumsum(-2) + 1e-6)).sum(-1) / t


@pytest.mark.parametrize(
    "wrong, says",
    [
        (no_t, "not divided by the prefix length"),
        (whole_sequence, "runs over all keys instead of the prefix j <= i"),
        (whole_sequence_flow, "and is not divided by t_i"),
        (strict_prefix, "stops before key i"),
        (divides_by_i, "divided by i instead of t_i"),
        (eps_once, "eps added once to the dot product"),
        (no_sigmoid, "sigmoid features are missing"),
    ],
    ids=lambda x: getattr(x, "__name__", "")[:20],
)
def test_causal_incoming_mistakes_are_named(wrong, says):
    r = check("3.2", wrong)
    assert not r.passed and "It looks like" in r.message and says in r.message, r.message
    assert "at index" in r.message  # where it first differs, too


def test_causal_incoming_shape_exceptions_and_stubs_are_reported():
    r = check("3.2", lambda q, k: causal_incoming(q, k)[..., None])
    assert not r.passed and "has shape (1, 2, 7, 1), expected (1, 2, 7)" in r.message

    def broken(q, k):
        return 1 // 0

    r = check("3.2", broken)
    assert not r.passed and "raised ZeroDivisionError" in r.message

    def stub(q, k):
        raise NotImplementedError

    assert "not written yet" in check("3.2", stub).message
    assert "returned None" in check("3.2", lambda q, k: None).message


# 3.3 -------------------------------------------------------------------------------------------------


def causal_competition(o_hat):
    e = o_hat.clamp(-1.0, 1.0).exp()
    t = torch.arange(1, o_hat.shape[-1] + 1, dtype=o_hat.dtype)
    return t * e / e.cumsum(-1)


def test_the_literal_competition_is_the_packages():
    g = torch.Generator().manual_seed(5)
    q, k, v = (2 * torch.randn(2, 3, 11, 4, generator=g, dtype=torch.float64) for _ in range(3))
    f = attnbook.flow_attention
    _, stats = f(q, k, v, **causal_kw(f), return_flows=True)
    torch.testing.assert_close(ch03.causal_competition_reference(stats.conserved_outgoing_raw), stats.competition)


def test_causal_competition_solution_is_accepted():
    r = check("3.3", causal_competition)
    assert r.passed, r.message


def no_clamp(o_hat):
    e = o_hat.exp()
    return torch.arange(1, o_hat.shape[-1] + 1, dtype=o_hat.dtype) * e / e.cumsum(-1)


def whole_softmax(o_hat):
    return o_hat.shape[-1] * torch.softmax(o_hat.clamp(-1, 1), dim=-1)


def no_t_factor(o_hat):
    e = o_hat.clamp(-1, 1).exp()
    return e / e.cumsum(-1)


def clamp_after_exp(o_hat):
    e = o_hat.exp().clamp(-1, 1)
    return torch.arange(1, o_hat.shape[-1] + 1, dtype=o_hat.dtype) * e / e.cumsum(-1)


@pytest.mark.parametrize(
    "wrong, says",
    [
        (no_clamp, "the clamp to [-1, 1] is missing"),
        (whole_softmax, "the softmax runs over the whole sequence"),
        (no_t_factor, "not multiplied by t_j"),
        (clamp_after_exp, "the clamp is applied after the exponential"),
    ],
    ids=lambda x: getattr(x, "__name__", "")[:20],
)
def test_causal_competition_mistakes_are_named(wrong, says):
    r = check("3.3", wrong)
    assert not r.passed and "It looks like" in r.message and says in r.message, r.message


def test_causal_competition_shape_and_exceptions():
    r = check("3.3", lambda o: causal_competition(o)[..., :-1])
    assert "expected (1, 2, 9)" in r.message
    r = check("3.3", lambda o: o.view(-1, 5))
    assert "raised RuntimeError" in r.message


# 3.4 -------------------------------------------------------------------------------------------------


def test_largest_competition_is_reached_in_the_limit():
    o_hat = torch.tensor([1.0] + [1e-12] * 7, dtype=torch.float64)
    c = 8 * torch.softmax(o_hat, dim=0)
    assert math.isclose(c[0].item(), ch03.largest_competition(8), rel_tol=1e-9)
    assert check("3.4", 8 * math.e / (math.e + 7)).passed


@pytest.mark.parametrize("answer, says", [(math.e, "e is the ratio"), (8, "limit without the clamp"), (2.0, "Hint")])
def test_largest_competition_wrong_answers(answer, says):
    r = check("3.4", answer)
    assert not r.passed and says in r.message


# 3.5 -------------------------------------------------------------------------------------------------


def largest_o_hat(similarity):
    _, stats = attnbook.flow_attention(*flow_viz.make_toy_input(similarity=similarity), return_flows=True)
    return stats.conserved_outgoing_raw.max().item()


def test_the_clamp_acts_until_similarity_one():
    assert largest_o_hat(0.99) > 1.1 and largest_o_hat(0.999) > 1.01
    assert largest_o_hat(1.0) < 1 + 1e-5  # only eps above 1: the clamp cuts nothing that matters
    assert check("3.5", 1.0).passed and check("3.5", 1).passed


@pytest.mark.parametrize(
    "answer, says",
    [
        (0.5, "the clamp still cuts off"),
        (0.9, "the clamp still cuts off"),
        (0.99, "the clamp still cuts off"),
        (0.999, "the clamp still cuts off"),  # (issue 29) accepted before, though the clamp still acts there
        (0.999999, "the clamp still cuts off"),
        (1.5, "is not a similarity"),
        (-0.2, "is not a similarity"),
        (None, "no answer yet"),
        ("1", "expected a number"),
    ],
)
def test_clamp_similarity_wrong_answers(answer, says):
    rejected(check("3.5", answer), says)


# --- issue 29 -------------------------------------------------------------------------------------------------


def test_the_literal_incoming_flow_is_the_packages():
    q, k = (torch.randn(2, 3, 11, 4, dtype=torch.float64) for _ in range(2))
    v = torch.zeros(2, 3, 11, 1, dtype=torch.float64)
    f = attnbook.flow_attention
    _, stats = f(q, k, v, **causal_kw(f), return_flows=True)
    torch.testing.assert_close(ch03.causal_incoming_reference(q, k), stats.incoming)


@pytest.mark.parametrize("answer", [5, 5.0, np.int64(5), np.float32(5.0), torch.tensor(5.0), np.array(5)])
def test_total_outgoing_flow_in_every_number_type(answer):
    accepted(check("3.1", answer))


@pytest.mark.parametrize("answer, says", [(35, "35 = N M"), (1, "what one sink takes")])
def test_total_outgoing_flow_more_wrong_answers(answer, says):
    rejected(check("3.1", answer), says)


def incoming_by_loop(q, k, eps=1e-6):
    """Right too: the prefix of every sink summed in a loop."""
    qs, ks = torch.sigmoid(q), torch.sigmoid(k)
    rows = [((qs[..., i, :] + eps) * (ks[..., : i + 1, :].sum(-2) + eps)).sum(-1) / (i + 1) for i in range(q.shape[-2])]
    return torch.stack(rows, dim=-1)


def incoming_eps_after(q, k):
    qs, ks = torch.sigmoid(q), torch.sigmoid(k)
    t = torch.arange(1, q.shape[-2] + 1, dtype=q.dtype)
    return (qs * ks.cumsum(-2)).sum(-1) / t + 1e-6


def incoming_no_eps(q, k):
    qs, ks = torch.sigmoid(q), torch.sigmoid(k)
    return (qs * ks.cumsum(-2)).sum(-1) / torch.arange(1, q.shape[-2] + 1, dtype=q.dtype)


def incoming_eps_on_q_only(q, k):
    qs, ks = torch.sigmoid(q), torch.sigmoid(k)
    return ((qs + 1e-6) * ks.cumsum(-2)).sum(-1) / torch.arange(1, q.shape[-2] + 1, dtype=q.dtype)


def incoming_eps_on_every_key(q, k):
    qs, ks = torch.sigmoid(q), torch.sigmoid(k)
    return ((qs + 1e-6) * (ks + 1e-6).cumsum(-2)).sum(-1) / torch.arange(1, q.shape[-2] + 1, dtype=q.dtype)


def incoming_over_n(q, k):
    qs, ks = torch.sigmoid(q), torch.sigmoid(k)
    return ((qs + 1e-6) * (ks.cumsum(-2) + 1e-6)).sum(-1) / q.shape[-2]


def incoming_hard_coded_t(q, k):
    """t from the chapter's N = 7: arange(1, 8)."""
    qs, ks = torch.sigmoid(q), torch.sigmoid(k)
    t = torch.arange(1, 8, dtype=q.dtype)[: q.shape[-2]]
    return ((qs + 1e-6) * (ks.cumsum(-2) + 1e-6)).sum(-1) / t


def incoming_sigmoid_in_place(q, k):
    qs, ks = q.sigmoid_(), k.sigmoid_()
    return ((qs + 1e-6) * (ks.cumsum(-2) + 1e-6)).sum(-1) / torch.arange(1, q.shape[-2] + 1, dtype=q.dtype)


def incoming_in_float64(q, k):
    return causal_incoming(q.double(), k.double())


def test_causal_incoming_another_right_formulation():
    accepted(check("3.2", incoming_by_loop))


@pytest.mark.parametrize(
    "wrong, says",
    [
        (incoming_eps_after, "eps added after the division"),
        (incoming_no_eps, "no eps at all"),
        (incoming_eps_on_q_only, "eps added to the queries' features only"),
        (incoming_eps_on_every_key, "eps added to every key before the prefix sum"),
        (incoming_over_n, "divided by the sequence length N"),
    ],
    ids=lambda x: getattr(x, "__name__", "")[9:30],
)
def test_causal_incoming_eps_and_division_mistakes_are_named(wrong, says):
    diagnosed(check("3.2", wrong), says)


def test_causal_incoming_tries_64_tokens_and_catches_a_hard_coded_arange():
    s = spy(causal_incoming)
    accepted(check("3.2", s))
    assert longest(s.calls) >= 64
    rejected(check("3.2", incoming_hard_coded_t), "raised RuntimeError", "depend on a fixed size")


def test_causal_incoming_rejects_writes_and_names_dtypes():
    rejected(check("3.2", incoming_sigmoid_in_place), "wrote into its argument `q`")
    rejected(check("3.2", incoming_in_float64), "has dtype float64, expected float32")


def competition_clamp_upper(o_hat):
    e = o_hat.clamp(max=1.0).exp()
    return torch.arange(1, o_hat.shape[-1] + 1, dtype=o_hat.dtype) * e / e.cumsum(-1)


def competition_clamp_0_1(o_hat):
    e = o_hat.clamp(0.0, 1.0).exp()
    return torch.arange(1, o_hat.shape[-1] + 1, dtype=o_hat.dtype) * e / e.cumsum(-1)


def competition_t_from_0(o_hat):
    e = o_hat.clamp(-1.0, 1.0).exp()
    return torch.arange(o_hat.shape[-1], dtype=o_hat.dtype) * e / e.cumsum(-1)


def competition_clamp_in_place(o_hat):
    e = o_hat.clamp_(-1.0, 1.0).exp()
    return torch.arange(1, o_hat.shape[-1] + 1, dtype=o_hat.dtype) * e / e.cumsum(-1)


def competition_by_logcumsumexp(o_hat):
    """Right too: the prefix denominators as logcumsumexp."""
    x = o_hat.clamp(-1, 1)
    return torch.arange(1, o_hat.shape[-1] + 1, dtype=o_hat.dtype) * torch.exp(x - x.logcumsumexp(-1))


def test_causal_competition_another_right_formulation():
    accepted(check("3.3", competition_by_logcumsumexp))


@pytest.mark.parametrize(
    "wrong, says",
    [
        (competition_clamp_upper, "only the upper bound of the clamp"),
        (competition_clamp_0_1, "the clamp is to [0, 1]"),
        (competition_t_from_0, "multiplied by j instead of t_j"),
    ],
    ids=["upper-only", "zero-one", "t-from-0"],
)
def test_causal_competition_more_mistakes_are_named(wrong, says):
    diagnosed(check("3.3", wrong), says)


def test_causal_competition_rejects_writes_tries_64_tokens_and_names_dtypes():
    rejected(check("3.3", competition_clamp_in_place), "wrote into its argument `o_hat`", "in-place")
    s = spy(causal_competition)
    accepted(check("3.3", s))
    assert longest(s.calls, dim=-1) >= 64
    rejected(check("3.3", lambda o: causal_competition(o.double())), "has dtype float64, expected float32")


@pytest.mark.parametrize(
    "answer", [8 * math.e / (math.e + 7), np.float32(8 * math.e / (math.e + 7)), torch.tensor(2.237665)]
)
def test_largest_competition_in_every_number_type(answer):
    accepted(check("3.4", answer))


def test_largest_competition_others_at_minus_one():
    rejected(check("3.4", 8 * math.e**2 / (math.e**2 + 7)), "puts the other sources at -1")


@pytest.mark.parametrize("answer", [1, 1.0, np.float64(1.0), torch.tensor(1.0), np.array(1.0)])
def test_clamp_similarity_in_every_number_type(answer):
    accepted(check("3.5", answer))


def test_clamp_similarity_is_judged_by_the_amount_cut_off_against_what_eps_alone_cuts():
    floor = max(ch03.clamp_cut(1.0, seed) for seed in ch03.CLAMP_SEEDS)
    assert 1e-6 < floor < 1e-4  # eps alone cuts a little at similarity 1, as the statement says
    assert ch03.clamp_cut(0.999) > 100 * floor  # the clamp still acts at 0.999 (the chapter's own test)


@pytest.mark.parametrize("exercise_id", ["3.1", "3.4", "3.5"])
@pytest.mark.parametrize("answer", ODD_ANSWERS, ids=ODD_IDS)
def test_number_answers_of_the_wrong_type_get_feedback(exercise_id, answer):
    rejected(check(exercise_id, answer))


@pytest.mark.parametrize("exercise_id", ["3.2", "3.3"])
@pytest.mark.parametrize("answer", ODD_ANSWERS, ids=ODD_IDS)
def test_function_answers_of_the_wrong_type_get_feedback(exercise_id, answer):
    rejected(check(exercise_id, answer), "expected a function")
    rejected(check(exercise_id, lambda *args: answer))


@pytest.mark.parametrize("answer, ok", [(2.24, True), (2.238, True), (2.2377, True), (2.2, False), (2.25, False),
                                        (2.23, False)])  # fmt: skip
def test_largest_competition_rounded_as_a_cell_prints_it(answer, ok):
    """(issue 29) The exact value 8e / (e + 7) = 2.23766... given rounded to 3 or more significant digits is right
    (the book's own "about 2.24" was rejected with a hint that blamed the derivation); coarser or wrongly
    rounded values are not."""
    r = check("3.4", answer)
    assert r.passed == ok, r.message


# --- the student's 615 answers: diagnoses worded by the numbers, random sizes ----------------------------------


@pytest.mark.parametrize(
    "wrong, shows",
    [
        (no_t, "I at i = 0, 1, 2 (the first sequence and head) is 1, 2, 3 times the right value"),
        (incoming_over_n, "times the right value"),
        (divides_by_i, "is inf, 2, 1.5 times the right value"),
        (eps_once, "I minus the right value at i = 0, 1, 2"),
        (incoming_no_eps, "I minus the right value at i = 0, 1, 2"),
        (whole_sequence, "where it should be"),
        (strict_prefix, "where it should be"),
    ],
    ids=["no-t", "over-n", "by-i", "eps-once", "no-eps", "all-keys", "strict"],
)
def test_causal_incoming_diagnoses_say_first_what_the_numbers_show(wrong, shows):
    """The student's I against the right one at the first sinks, before the variant those numbers equal: the
    same numbers come from many programs (eps / t_i added at the end, or inside the sum), so the message does not
    claim which one the student wrote."""
    from exercises_support import observation

    r = check("3.2", wrong)
    assert shows in observation(r), r.message
    assert "It looks like" in r.message


def incoming_hard_coded_128(q, k):
    """t from a buffer of 128 positions: right for every N the old checker tried (up to 70)."""
    qs, ks = torch.sigmoid(q), torch.sigmoid(k)
    t = torch.arange(1, 129, dtype=q.dtype)[: q.shape[-2]]
    return ((qs + 1e-6) * (ks.cumsum(-2) + 1e-6)).sum(-1) / t


def test_causal_incoming_and_competition_draw_sequences_past_128():
    rejected(check("3.2", incoming_hard_coded_128), "raised RuntimeError", "random, seed ", "depend on a fixed size")
    s = spy(causal_incoming)
    accepted(check("3.2", s))
    assert longest(s.calls) > 128 and {q.shape[-1] for (q, k), _ in s.calls} - {3, 4}
    c = spy(ch03.causal_competition_reference)
    accepted(check("3.3", c))
    assert longest(c.calls, dim=-1) > 128
