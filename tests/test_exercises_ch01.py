"""Chapter 1's exercise checkers: right answers in every form pass, the mistakes students make are named,
nothing crashes.

The wrong answers below were written from the exercise statements, as a student would, before reading the
checkers."""

import math

import numpy as np
import pytest
import torch
from exercises_support import (
    ODD_ANSWERS,
    ODD_IDS,
    accepted,
    diagnosed,
    fits_the_box,
    longest,
    mask_kw,
    rejected,
    spy,
    undiagnosed,
)

from attnbook import reference
from attnbook.exercises import ch01, check
from attnbook.exercises.ch01 import masked_softmax_solution

# --- 1.1 masked softmax ---------------------------------------------------------------------------------------


def chapter_solution(scores, allowed):
    """The chapter's solution as it was: exp of every score, then multiplied by the mask."""
    hidden = scores.masked_fill(~allowed, -math.inf)
    top = hidden.amax(dim=-1, keepdim=True)
    top = torch.where(torch.isfinite(top), top, 0.0)
    e = torch.exp(scores - top) * allowed
    total = e.sum(dim=-1, keepdim=True)
    return e / torch.where(total > 0, total, 1.0)


def masked_softmax_where(scores, allowed):
    """Another right answer: -inf, softmax, then NaN rows replaced by zeros."""
    w = torch.softmax(scores.masked_fill(~allowed, -math.inf), dim=-1)
    return torch.nan_to_num(w, nan=0.0)


def masked_softmax_log(scores, allowed):
    """Another right answer: through log_softmax, empty rows zeroed with where."""
    logw = torch.log_softmax(scores.masked_fill(~allowed, -math.inf), dim=-1)
    return torch.where(allowed.any(-1, keepdim=True), logw.exp(), 0.0)


def nan_on_empty_rows(scores, allowed):
    return torch.softmax(scores.masked_fill(~allowed, -math.inf), dim=-1)


def large_negative(scores, allowed):
    return torch.softmax(scores.masked_fill(~allowed, -1e9), dim=-1)


def zero_after_softmax(scores, allowed):
    return torch.softmax(scores, dim=-1) * allowed


def inverted_mask(scores, allowed):
    return masked_softmax_solution(scores, ~allowed)


def zero_scores(scores, allowed):
    return torch.softmax(scores.masked_fill(~allowed, 0.0), dim=-1)


def no_shift(scores, allowed):
    e = torch.exp(scores) * allowed
    total = e.sum(dim=-1, keepdim=True)
    return e / torch.where(total > 0, total, 1.0)


def no_shift_minus_inf(scores, allowed):
    e = torch.exp(scores.masked_fill(~allowed, -math.inf))
    total = e.sum(dim=-1, keepdim=True)
    return e / torch.where(total > 0, total, 1.0)


def shift_by_all_keys(scores, allowed):
    """The max over every key, hidden ones included (the hint says 'largest allowed')."""
    e = torch.exp(scores - scores.amax(dim=-1, keepdim=True)) * allowed
    total = e.sum(dim=-1, keepdim=True)
    return e / torch.where(total > 0, total, 1.0)


def shift_by_all_keys_unguarded(scores, allowed):
    e = torch.exp(scores - scores.amax(dim=-1, keepdim=True)) * allowed
    return e / e.sum(dim=-1, keepdim=True)


def over_queries(scores, allowed):
    return masked_softmax_where(scores.transpose(-2, -1), allowed.transpose(-2, -1)).transpose(-2, -1)


def fills_in_place(scores, allowed):
    scores.masked_fill_(~allowed, -math.inf)
    return torch.nan_to_num(torch.softmax(scores, dim=-1), nan=0.0)


def returns_float32(scores, allowed):
    return masked_softmax_where(scores, allowed).float()


@pytest.mark.parametrize(
    "answer",
    [masked_softmax_solution, masked_softmax_where, masked_softmax_log],
    ids=["shifted", "nan-to-zero", "log-softmax"],
)
def test_masked_softmax_right_answers_pass(answer):
    r = check("1.1", answer)
    accepted(r)
    assert r.message.startswith("masked_softmax is right")


@pytest.mark.parametrize(
    "answer, diagnosis",
    [
        (nan_on_empty_rows, "softmax over nothing but -inf, which is 0 / 0 = NaN"),
        (large_negative, "uniform weights 1/M instead of zeros"),
        (zero_after_softmax, "a softmax over all keys with the hidden ones set to 0 afterwards"),
        (inverted_mask, "the mask read the wrong way round"),
        (zero_scores, "set to 0 instead of -inf"),
        (no_shift, "exp overflows: subtract each row's largest allowed score"),
        (no_shift_minus_inf, "exp overflows: subtract each row's largest allowed score"),
        (shift_by_all_keys, "shift by each row's largest score over all keys, hidden ones included"),
        (shift_by_all_keys_unguarded, "shift by each row's largest score over all keys, hidden ones included"),
        (chapter_solution, "inf * 0 = NaN"),
        (over_queries, "along dim -2"),
        (lambda s, a: torch.softmax(s, dim=-1), "as if there were no mask"),
    ],
    ids=[
        "nan-rows",
        "minus-1e9",
        "zero-after",
        "inverted",
        "zero-scores",
        "no-shift",
        "no-shift-minus-inf",
        "shift-by-all",
        "shift-by-all-unguarded",
        "exp-before-mask",
        "over-queries",
        "no-mask",
    ],
)
def test_masked_softmax_mistakes_are_named(answer, diagnosis):
    r = check("1.1", answer)
    diagnosed(r, diagnosis)
    assert r.message.count("\n") == 1
    fits_the_box(r)


def test_masked_softmax_tries_a_large_hidden_score_and_64_keys():
    s = spy(masked_softmax_solution)
    accepted(check("1.1", s))
    assert longest(s.calls, dim=-1) >= 64 and longest(s.calls, dim=-2) >= 64
    assert any(bool((sc.masked_fill(a, -math.inf) >= 1000).any()) for (sc, a), _ in s.calls)  # hidden, large


def test_masked_softmax_rejects_writes_into_its_inputs():
    rejected(check("1.1", fills_in_place), "wrote into its argument `scores`", "in-place")


def test_masked_softmax_names_a_wrong_dtype():
    rejected(check("1.1", returns_float32), "has dtype float32, expected float64")


def test_masked_softmax_reports_shapes_exceptions_and_stubs():
    rejected(check("1.1", lambda s, a: torch.softmax(s, dim=-1).sum(-1)), "has shape (4,), expected (4, 6)")

    def broken(scores, allowed):
        return scores @ allowed  # a dtype error inside the student's code

    r = check("1.1", broken)
    assert not r.passed and r.message.startswith("masked_softmax raised RuntimeError on random (4, 6) scores")

    def stub(scores, allowed):
        raise NotImplementedError

    rejected(check("1.1", stub), "not written yet")
    rejected(check("1.1", lambda s, a: None), "returned None")


@pytest.mark.parametrize("exercise_id", ["1.1", "1.2", "1.3", "1.4"])
@pytest.mark.parametrize("answer", ODD_ANSWERS, ids=ODD_IDS)
def test_answers_of_the_wrong_type_get_feedback(exercise_id, answer):
    rejected(check(exercise_id, answer), "expected a function")
    rejected(check(exercise_id, lambda *args: answer))


def test_masked_softmax_solution_matches_the_reference_weights():
    q, k = torch.randn(2, 3, 5, 4, dtype=torch.float64), torch.randn(2, 3, 6, 4, dtype=torch.float64)
    mask = torch.rand(2, 1, 5, 6) > 0.5
    mask[0, 0, 2] = False  # an empty row
    f = reference.softmax_attention
    _, want = f(q, k, k[..., :2], **mask_kw(f, mask), return_weights=True)
    got = masked_softmax_solution(q @ k.transpose(-2, -1) / 2.0, mask.expand(2, 3, 5, 6))
    torch.testing.assert_close(got, want)
    assert torch.equal(got[0, :, 2], torch.zeros(3, 6, dtype=torch.float64))


# --- 1.2 causal attention -------------------------------------------------------------------------------------


def causal_attention_solution(q, k, v):
    N, D = q.shape[-2], q.shape[-1]
    allowed = torch.ones(N, N, dtype=torch.bool).tril()
    scores = q @ k.transpose(-2, -1) / math.sqrt(D)  # (B, H, N, N)
    return torch.softmax(scores.masked_fill(~allowed, -math.inf), dim=-1) @ v


def causal_with_minus_1e9(q, k, v):
    """Right too: every causal row has a key, so -1e9 gives the same weights as -inf."""
    N = q.shape[-2]
    scores = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
    hidden = torch.ones(N, N, dtype=torch.bool).triu(1)
    return torch.softmax(scores.masked_fill(hidden, -1e9), dim=-1) @ v


def causal_with_masked_softmax(q, k, v):
    N = q.shape[-2]
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    return masked_softmax_where(scores, torch.ones(N, N, dtype=torch.bool).tril().expand_as(scores)) @ v


def mask_shifted(diagonal, transpose=False):
    def answer(q, k, v):
        N, D = q.shape[-2], q.shape[-1]
        allowed = torch.ones(N, N, dtype=torch.bool).tril(diagonal)
        allowed = allowed.T if transpose else allowed
        scores = q @ k.transpose(-2, -1) / math.sqrt(D)
        return masked_softmax_solution(scores, allowed.expand_as(scores)) @ v

    return answer


def scaled(scale_of_d):
    def answer(q, k, v):
        N, D = q.shape[-2], q.shape[-1]
        allowed = torch.ones(N, N, dtype=torch.bool).tril()
        scores = q @ k.transpose(-2, -1) * scale_of_d(D)
        return torch.softmax(scores.masked_fill(~allowed, -math.inf), dim=-1) @ v

    return answer


def strictly_lower_nan(q, k, v):
    N, D = q.shape[-2], q.shape[-1]
    hidden = torch.ones(N, N, dtype=torch.bool).triu()  # hides the diagonal too
    scores = q @ k.transpose(-2, -1) / math.sqrt(D)
    return torch.softmax(scores.masked_fill(hidden, -math.inf), dim=-1) @ v


BUFFER = torch.ones(8, 8, dtype=torch.bool).tril()  # a mask made once, for the N of the chapter's examples


def fixed_buffer(q, k, v):
    N = q.shape[-2]
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    return torch.softmax(scores.masked_fill(~BUFFER[:N, :N], -math.inf), dim=-1) @ v


def scales_q_in_place(q, k, v):
    q /= math.sqrt(q.shape[-1])
    N = q.shape[-2]
    scores = (q @ k.transpose(-2, -1)).masked_fill(~torch.ones(N, N, dtype=torch.bool).tril(), -math.inf)
    return torch.softmax(scores, dim=-1) @ v


def in_float64(q, k, v):
    return causal_attention_solution(q.double(), k.double(), v.double())


@pytest.mark.parametrize(
    "answer",
    [
        causal_attention_solution,
        causal_with_minus_1e9,
        causal_with_masked_softmax,
        lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True),
    ],
    ids=["solution", "minus-1e9", "masked-softmax", "sdpa"],
)
def test_causal_attention_right_answers_pass(answer):
    accepted(check("1.2", answer))


@pytest.mark.parametrize(
    "answer, diagnosis",
    [
        (scaled(lambda d: 1.0), "the scores are not divided by sqrt(D)"),
        (scaled(lambda d: 1.0 / d), "divided by D instead of sqrt(D)"),
        (scaled(lambda d: math.sqrt(d)), "multiplied by sqrt(D)"),
        (mask_shifted(1), "off by one: query i sees key i + 1 as well"),
        (mask_shifted(-1), "off by one: query i does not see its own key i (it must"),
        (strictly_lower_nan, "off by one: query i does not see its own key i, so the first query has no key"),
        (mask_shifted(0, transpose=True), "the mask is transposed"),
        (lambda q, k, v: reference.softmax_attention(q, k, v).to(q.dtype), "there is no causal mask"),
    ],
    ids=[
        "no-scale",
        "scale-1-over-D",
        "times-sqrt-D",
        "sees-next",
        "misses-self",
        "misses-self-nan",
        "transposed",
        "no-mask",
    ],
)
def test_causal_attention_mistakes_are_named(answer, diagnosis):
    diagnosed(check("1.2", answer), diagnosis)


def test_causal_attention_tries_64_tokens_and_catches_a_fixed_size_buffer():
    s = spy(causal_attention_solution)
    accepted(check("1.2", s))
    assert longest(s.calls) >= 64
    rejected(check("1.2", fixed_buffer), "raised RuntimeError", "depend on a fixed size")


def test_causal_attention_rejects_writes_into_its_inputs_and_names_a_wrong_dtype():
    rejected(check("1.2", scales_q_in_place), "wrote into its argument `q`")
    rejected(check("1.2", in_float64), "float32 q, k, v", "has dtype float64, expected float32")


def test_causal_attention_reports_exceptions_and_wrong_shapes():
    r = check("1.2", lambda q, k, v: q @ k)  # (.., 5, 4) @ (.., 5, 4): a shape error in the student's code
    assert not r.passed and r.message.startswith("causal_attention raised RuntimeError on q, k (2, 1, 5, 4)")
    rejected(check("1.2", lambda q, k, v: causal_attention_solution(q, k, v)[..., 0]), "expected (2, 1, 5, 3)")


def test_the_causal_reference_is_the_packages():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 11, 4, generator=g, dtype=torch.float64) for _ in range(3))
    mask = torch.ones(11, 11, dtype=torch.bool).tril()
    f = reference.softmax_attention
    torch.testing.assert_close(ch01.causal_reference(q, k, v), f(q, k, v, **mask_kw(f, mask)))


# --- 1.3 and 1.4: formulas ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "answer",
    [
        lambda d: d**0.25,
        lambda d: math.sqrt(math.sqrt(d)),
        lambda d: np.sqrt(np.sqrt(d)),  # numpy.float64
        lambda d: np.float32(d) ** np.float32(0.25),  # numpy.float32
        lambda d: torch.tensor(float(d), dtype=torch.float64) ** 0.25,  # a 0-d tensor
        lambda d: torch.tensor(float(d)) ** 0.25,  # a float32 0-d tensor
        lambda d: math.pow(d, 1 / 4),
    ],
    ids=["power", "sqrt-sqrt", "numpy", "numpy-float32", "tensor", "tensor-float32", "pow"],
)
def test_bandwidth_right_answers_in_every_number_type(answer):
    accepted(check("1.3", answer))


@pytest.mark.parametrize(
    "answer, diagnosis",
    [
        (math.sqrt, "λ = sqrt(D)"),
        (lambda d: 1 / math.sqrt(d), "λ = 1 / sqrt(D)"),
        (lambda d: d**-0.25, "λ = D^(-1/4)"),
        (lambda d: math.sqrt(2) * d**0.25, "λ^2 = 2 sqrt(D)"),
        (lambda d: math.sqrt(d) / 2, "λ = sqrt(D) / 2"),
    ],
    ids=["sqrt", "inverse-sqrt", "inverse-fourth-root", "forgot-the-2", "sqrt-over-2"],
)
def test_bandwidth_mistakes_are_named(answer, diagnosis):
    diagnosed(check("1.3", answer), diagnosis)


def test_bandwidth_a_coincidence_at_one_d_names_nothing():
    # sqrt(D) / 2 equals 1 / sqrt(D) at D = 2 only: that one case must not name λ = 1 / sqrt(D)
    r = check("1.3", lambda d: math.sqrt(d) / 2)
    assert "1 / sqrt(D)" not in r.message


def test_bandwidth_exceptions_and_non_numbers():
    rejected(check("1.3", lambda d: 1 / 0), "bandwidth raised ZeroDivisionError")
    rejected(check("1.3", lambda d: "2"), "expected a number")
    rejected(check("1.3", lambda d: torch.ones(2)), "expected a number")


@pytest.mark.parametrize(
    "answer",
    [
        lambda p, m: math.log(p * (m - 1) / (1 - p)),
        lambda p, m: math.log(p / (1 - p)) + math.log(m - 1),
        lambda p, m: np.log(p) - np.log1p(-p) + np.log(m - 1),
        lambda p, m: torch.log(torch.tensor(p * (m - 1) / (1 - p), dtype=torch.float64)),
    ],
    ids=["log", "logit-plus-log", "numpy", "tensor"],
)
def test_gap_right_answers(answer):
    accepted(check("1.4", answer))


@pytest.mark.parametrize(
    "answer, diagnosis",
    [
        (lambda p, m: math.log(p * m / (1 - p)), "there are M - 1 others"),
        (lambda p, m: math.log(p / (1 - p)), "left out of the sum"),
        (lambda p, m: math.log(p * (m - 1)), "the factor 1 / (1 - ω) is missing"),
        (lambda p, m: math.log((1 - p) * (m - 1) / p), "ω and 1 - ω are swapped"),
        (lambda p, m: p * (m - 1) / (1 - p), "the logarithm is missing"),
        (lambda p, m: math.log10(p * (m - 1) / (1 - p)), "base 10"),
        (lambda p, m: math.log2(p * (m - 1) / (1 - p)), "base 2"),
    ],
    ids=["M-not-M-1", "logit", "no-1-minus-p", "swapped", "no-log", "log10", "log2"],
)
def test_gap_mistakes_are_named(answer, diagnosis):
    diagnosed(check("1.4", answer), diagnosis)


def test_gap_a_wrong_constant():
    r = check("1.4", lambda p, m: 6.0)
    undiagnosed(r)
    assert "gap, on ω = 0.9, M = 64: the result is 6, expected 6.34036" in r.message


# --- shown in an exercise box -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "exercise_id, answer",
    [("1.1", masked_softmax_solution), ("1.1", nan_on_empty_rows), ("1.2", mask_shifted(1)), ("1.4", lambda p, m: 6)],
    ids=["right", "nan-diagnosis", "diagnosis", "number"],
)
def test_results_are_shown_within_the_72_columns_of_an_exercise_box(exercise_id, answer):
    r = check(exercise_id, answer)
    shown = str(r)
    fits_the_box(r)
    assert repr(r) == shown and shown.startswith("✓ " if r.passed else "✗ ")
    assert " ".join(shown[2:].split()) == " ".join(r.message.split())  # only the line breaks differ
    if not r.passed:
        with pytest.raises(AssertionError) as raised:
            r.require()
        assert str(raised.value) == shown


def _masked_after_the_softmax(q, k, v):  # (issue 29) as a student writes it: softmax, then zero the future
    n = q.shape[-2]
    p = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1) * torch.ones(n, n).tril()
    return p / p.sum(-1, keepdim=True) @ v


def _exp_as_is(q, k, v):  # (issue 29) exp of the scores without subtracting the maximum
    n = q.shape[-2]
    e = torch.exp(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])) * torch.ones(n, n).tril()
    return e / e.sum(-1, keepdim=True) @ v


@pytest.mark.parametrize(
    "answer, says",
    [
        (_masked_after_the_softmax, "the future masked afterwards"),
        (_exp_as_is, "overflows to inf"),
    ],
)
def test_causal_attention_catches_a_large_score_on_a_future_or_a_visible_key(answer, says):
    """Both pass on scores of unit size; a score of about 2000 sqrt(D) on a future key (masking after the softmax
    leaves 0 / 0) or on a visible one (exp overflows) makes rows NaN, and the mistake is named."""
    r = check("1.2", answer)
    assert not r.passed and "a large score on" in r.message and says in r.message, r.message


# --- the student's 615 answers: float32, random sizes, diagnoses worded by the numbers -------------------------


def masked_softmax_in_float64(scores, allowed):
    """Right weights, always returned in float64: the chapter asks for the inputs' dtype."""
    return masked_softmax_solution(scores.double(), allowed)


def test_masked_softmax_tries_float32_and_names_a_float64_answer():
    s = spy(masked_softmax_solution)
    accepted(check("1.1", s))
    assert any(sc.dtype == torch.float32 for (sc, a), _ in s.calls)
    rejected(check("1.1", masked_softmax_in_float64), "float32", "has dtype float64, expected float32")


@pytest.mark.parametrize(
    "answer, shows",
    [
        (zero_after_softmax, "sums to"),
        (nan_on_empty_rows, "allows no key and its weights are NaN"),
        (large_negative, "allows no key and its weights are"),
        (inverted_mask, "has weight"),
        (shift_by_all_keys, "it has a hidden score of 1000"),
        (chapter_solution, "is NaN; it has a hidden score of 1000"),
        (no_shift, "whose largest allowed score is 1000, is NaN"),
    ],
    ids=["zero-after", "nan-rows", "minus-1e9", "inverted", "shift-by-all", "exp-before-mask", "no-shift"],
)
def test_masked_softmax_diagnoses_say_first_what_the_numbers_show(answer, shows):
    """The diagnosis starts from the student's numbers (row 0 sums to 0.34 where it should sum to 1), not from
    code the student may not have written."""
    from exercises_support import observation

    r = check("1.1", answer)
    assert shows in observation(r), r.message
    fits_the_box(r)


def test_masked_softmax_row_sum_is_the_students():
    from exercises_support import observation

    r = check("1.1", zero_after_softmax)
    scores, allowed = _softmax_first_case()
    row0 = float(zero_after_softmax(scores, allowed)[0].sum())
    assert f"Row 0 sums to {row0:.3g} where it should sum to 1" in observation(r), r.message


def _softmax_first_case():
    (scores, allowed) = ch01._softmax_cases(ch01.Draw(0))[0].args
    return scores, allowed


BUFFER_128 = torch.ones(128, 128, dtype=torch.bool).tril()  # a buffer larger than every N the old checker tried


def causal_from_a_128_buffer(q, k, v):
    N = q.shape[-2]
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    return torch.softmax(scores.masked_fill(~BUFFER_128[:N, :N], -math.inf), dim=-1) @ v


def test_causal_attention_draws_sizes_past_a_128_buffer_with_a_seed_it_prints():
    s = spy(causal_attention_solution)
    accepted(check("1.2", s))
    assert longest(s.calls) > 128
    widths = set()  # over a few draws: one draw in 300 (seed 187) happens to take only the old fixed widths
    for seed in range(3):
        s = spy(causal_attention_solution)
        accepted(check("1.2", s, seed=seed))
        widths |= {q.shape[-1] for (q, k, v), _ in s.calls}
    assert widths - {2, 3, 4, 8, 16}
    r = check("1.2", causal_from_a_128_buffer)
    rejected(r, "raised RuntimeError", "random, seed ", "depend on a fixed size")
    seed = int(r.message.split("random, seed ")[1].split(")")[0])
    assert check("1.2", causal_from_a_128_buffer, seed=seed).message == r.message  # the seed draws it again


def bandwidth_table(D):
    """Right on the six widths the old checker always tried, sqrt(D) elsewhere."""
    return {16: 2.0, 2: 2**0.25, 64: 64**0.25, 100: 100**0.25, 3: 3**0.25, 1: 1.0}.get(D, math.sqrt(D))


def test_bandwidth_draws_widths_a_table_of_the_fixed_ones_cannot_know():
    r = check("1.3", bandwidth_table)
    rejected(r, "random, seed ")
    diagnosed(r, "λ = sqrt(D)")
    widths = set()
    for seed in range(5):
        s = spy(lambda d: d**0.25)
        accepted(check("1.3", s, seed=seed))
        widths |= {args[0] for args, _ in s.calls}
    assert len(widths - set(ch01.BANDWIDTH_D)) >= 10


def test_gap_draws_other_weights_and_lengths():
    table = {(0.9, 64): ch01._gap(0.9, 64), (0.5, 2): 0.0, (0.99, 1000): ch01._gap(0.99, 1000),
             (0.3, 5): ch01._gap(0.3, 5), (0.75, 9): ch01._gap(0.75, 9)}  # fmt: skip
    rejected(check("1.4", lambda p, m: table.get((p, m), 6.0)), "random, seed ")


# 1.5 -----------------------------------------------------------------------------------------------------------


def test_best_scale_is_registered_and_its_fast_gradients_are_the_chapters():
    from attnbook.exercises import registered

    assert [i for i in registered() if i.startswith("1.")] == ["1.1", "1.2", "1.3", "1.4", "1.5"]
    grads = ch01._gradients()
    for seed in (0, 3):
        for c in (0.25, 2.0, 16.0):
            assert grads[c][seed] == pytest.approx(ch01.softmax_stats(c / 16, seed)[1], rel=1e-9)


def chapter_softmax_stats(scale, qs, ks):
    """The chapter's softmax_stats, on its own (global) random draws."""
    logits = (qs @ ks.T * scale).requires_grad_()
    weights = torch.softmax(logits, dim=-1)
    (weights * torch.randn_like(weights)).sum().backward()
    return weights.max(dim=-1).values.mean().item(), logits.grad.norm(dim=-1).median().item()


def test_best_scale_accepts_what_the_chapters_experiment_finds():
    torch.manual_seed(0)
    qs, ks = torch.randn(512, 256, dtype=torch.float64), torch.randn(64, 256, dtype=torch.float64)
    cs = [2.0**e for e in range(-4, 5)]
    stats = {c: chapter_softmax_stats(c / 16, qs, ks) for c in cs}
    answer = max(cs, key=lambda c: stats[c][1])
    for form in (answer, int(answer), np.float64(answer), torch.tensor(answer)):
        accepted(check("1.5", form))
    accepted(check("1.5", 2.0))
    accepted(check("1.5", 4))


@pytest.mark.parametrize(
    "answer, says",
    [(1.0, "of the largest"), (16, "of the largest"), (0.125, "the scale c / sqrt(D)"), (3, "not one of the c tried"),
     (0.0021, "gradient norm"), (None, "no answer yet")],
)  # fmt: skip
def test_best_scale_wrong_answers(answer, says):
    rejected(check("1.5", answer), says)


@pytest.mark.parametrize("answer", ODD_ANSWERS, ids=ODD_IDS)
def test_best_scale_answers_of_the_wrong_type_get_feedback(answer):
    rejected(check("1.5", answer))


def test_an_exercise_not_answered_yet_fails_marked_o_not_as_a_mistake():
    """The cell as the book ships it (a stub that raises NotImplementedError, a function that returns None, an
    answer left None): the verdict fails (require raises) but is marked "○", as the website shows it."""

    def stub(scores, allowed):
        raise NotImplementedError

    for r in (check("1.1", stub), check("1.3", lambda d: None), check("1.5", None)):
        assert not r.passed and r.unanswered and str(r).startswith("○ "), r
        with pytest.raises(AssertionError):
            r.require()
    wrong = check("1.4", lambda p, m: 6)
    assert not wrong.unanswered and str(wrong).startswith("✗ ")
