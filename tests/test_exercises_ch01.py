"""Chapter 1's exercise checkers: right answers pass, the mistakes students make are named, nothing crashes."""

import math

import pytest
import torch

from attnbook import reference
from attnbook.exercises import check
from attnbook.exercises.ch01 import masked_softmax_solution

# --- 1.1 masked softmax ---------------------------------------------------------------------------------------


def masked_softmax_where(scores, allowed):
    """Another right answer: -inf, softmax, then NaN rows replaced by zeros."""
    w = torch.softmax(scores.masked_fill(~allowed, -math.inf), dim=-1)
    return torch.nan_to_num(w, nan=0.0)


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


@pytest.mark.parametrize("answer", [masked_softmax_solution, masked_softmax_where], ids=["shifted", "nan-to-zero"])
def test_masked_softmax_right_answers_pass(answer):
    r = check("1.1", answer)
    assert r.passed, r.message
    assert r.message.startswith("masked_softmax is right")


@pytest.mark.parametrize(
    "answer, diagnosis",
    [
        (nan_on_empty_rows, "softmax over nothing but -inf, which is 0 / 0 = NaN"),
        (large_negative, "uniform weights 1/M instead of zeros"),
        (zero_after_softmax, "set to zero after a softmax over all keys"),
        (inverted_mask, "the mask is read the wrong way round"),
        (zero_scores, "set to 0 instead of -inf"),
        (no_shift, "exp overflows: subtract each row's largest allowed score"),
        (lambda s, a: torch.softmax(s, dim=-1), "the mask is ignored"),
    ],
    ids=["nan-rows", "minus-1e9", "zero-after", "inverted", "zero-scores", "no-shift", "no-mask"],
)
def test_masked_softmax_mistakes_are_named(answer, diagnosis):
    r = check("1.1", answer)
    assert not r.passed
    assert "\nIt looks like " in r.message and diagnosis in r.message.split("It looks like ")[1], r.message
    assert r.message.count("\n") == 1


def test_masked_softmax_reports_shapes_exceptions_and_stubs():
    r = check("1.1", lambda s, a: torch.softmax(s, dim=-1).sum(-1))
    assert not r.passed and "has shape (4,), expected (4, 6)" in r.message

    def broken(scores, allowed):
        return scores @ allowed  # a dtype error inside the student's code

    r = check("1.1", broken)
    assert not r.passed and r.message.startswith("masked_softmax raised RuntimeError on random (4, 6) scores")

    def stub(scores, allowed):
        raise NotImplementedError

    assert "not written yet" in check("1.1", stub).message
    assert "returned None" in check("1.1", lambda s, a: None).message


def test_masked_softmax_solution_matches_the_reference_weights():
    q, k = torch.randn(2, 3, 5, 4, dtype=torch.float64), torch.randn(2, 3, 6, 4, dtype=torch.float64)
    mask = torch.rand(2, 1, 5, 6) > 0.5
    mask[0, 0, 2] = False  # an empty row
    _, want = reference.softmax_attention(q, k, k[..., :2], mask=mask, return_weights=True)
    got = masked_softmax_solution(q @ k.transpose(-2, -1) / 2.0, mask.expand(2, 3, 5, 6))
    torch.testing.assert_close(got, want)
    assert torch.equal(got[0, :, 2], torch.zeros(3, 6, dtype=torch.float64))


# --- 1.2 causal attention -------------------------------------------------------------------------------------


def causal_attention_solution(q, k, v):
    N, D = q.shape[-2], q.shape[-1]
    allowed = torch.ones(N, N, dtype=torch.bool).tril()
    scores = q @ k.transpose(-2, -1) / math.sqrt(D)  # (B, H, N, N)
    return torch.softmax(scores.masked_fill(~allowed, -math.inf), dim=-1) @ v


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


def test_causal_attention_right_answers_pass():
    assert check("1.2", causal_attention_solution).passed
    assert check("1.2", lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True))


@pytest.mark.parametrize(
    "answer, diagnosis",
    [
        (scaled(lambda d: 1.0), "the scores are not divided by sqrt(D)"),
        (scaled(lambda d: 1.0 / d), "divided by D instead of sqrt(D)"),
        (mask_shifted(1), "off by one: query i sees key i + 1 as well"),
        (mask_shifted(-1), "off by one: query i does not see its own key i (it must"),
        (strictly_lower_nan, "off by one: query i does not see its own key i, so the first query has no key"),
        (mask_shifted(0, transpose=True), "the mask is transposed"),
        (lambda q, k, v: reference.softmax_attention(q, k, v), "there is no causal mask"),
    ],
    ids=["no-scale", "scale-1-over-D", "sees-next", "misses-self", "misses-self-nan", "transposed", "no-mask"],
)
def test_causal_attention_mistakes_are_named(answer, diagnosis):
    r = check("1.2", answer)
    assert not r.passed
    assert "\nIt looks like " in r.message and diagnosis in r.message.split("It looks like ")[1], r.message


def test_causal_attention_reports_exceptions_and_wrong_shapes():
    r = check("1.2", lambda q, k, v: q @ k)  # (.., 5, 4) @ (.., 5, 4): a shape error in the student's code
    assert not r.passed and r.message.startswith("causal_attention raised RuntimeError on q, k (2, 1, 5, 4)")
    r = check("1.2", lambda q, k, v: causal_attention_solution(q, k, v)[..., 0])
    assert "has shape (2, 1, 5), expected (2, 1, 5, 3)" in r.message


# --- 1.3 and 1.4: formulas ------------------------------------------------------------------------------------


def test_bandwidth():
    assert check("1.3", lambda d: d**0.25).passed
    assert check("1.3", lambda d: math.sqrt(math.sqrt(d))).passed
    assert "It looks like h = sqrt(D)" in check("1.3", math.sqrt).message
    assert "h = D^(-1/4)" in check("1.3", lambda d: d**-0.25).message
    assert "h = 1 / sqrt(D)" in check("1.3", lambda d: 1 / math.sqrt(d)).message
    assert "bandwidth raised ZeroDivisionError" in check("1.3", lambda d: 1 / 0).message
    assert "expected a number" in check("1.3", lambda d: "2").message


def test_gap():
    assert check("1.4", lambda p, m: math.log(p * (m - 1) / (1 - p))).passed
    assert check("1.4", lambda p, m: math.log(p / (1 - p)) + math.log(m - 1)).passed
    assert "there are M - 1 others" in check("1.4", lambda p, m: math.log(p * m / (1 - p))).message
    assert "left out of the sum" in check("1.4", lambda p, m: math.log(p / (1 - p))).message
    assert "the logarithm is missing" in check("1.4", lambda p, m: p * (m - 1) / (1 - p)).message
    r = check("1.4", lambda p, m: 6.0)
    assert not r.passed and "gap, on p = 0.9, M = 64: the result is 6, expected 6.34036" in r.message


# --- shown in an exercise box -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "exercise_id, answer",
    [("1.1", masked_softmax_solution), ("1.1", nan_on_empty_rows), ("1.2", mask_shifted(1)), ("1.4", lambda p, m: 6)],
    ids=["right", "nan-diagnosis", "diagnosis", "number"],
)
def test_results_are_shown_within_the_72_columns_of_an_exercise_box(exercise_id, answer):
    r = check(exercise_id, answer)
    shown = str(r)
    assert all(len(line) <= 72 for line in shown.splitlines()), shown
    assert repr(r) == shown and shown.startswith("✓ " if r.passed else "✗ ")
    assert " ".join(shown[2:].split()) == " ".join(r.message.split())  # only the line breaks differ
    if not r.passed:
        with pytest.raises(AssertionError) as raised:
            r.require()
        assert str(raised.value) == shown
