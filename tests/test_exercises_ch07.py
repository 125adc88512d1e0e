"""Chapter 7's exercise checkers accept the solutions in every form, name the plausible mistakes, report
exceptions.

The wrong answers marked "(issue 29)" were written from the exercise statements, as a student would, before
reading the checkers."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from exercises_support import ODD_ANSWERS, ODD_IDS, accepted, diagnosed, longest, rejected, spy

from attnbook import exercises
from attnbook.exercises import ch07
from attnbook.lab import lm as lab_lm


def test_every_chapter_7_checker_is_registered():
    ids = [i for i in exercises.registered() if i.startswith("7.")]
    assert ids == ["7.1", "7.2", "7.3", "7.4", "7.5"]


# --- 7.1 derive ----------------------------------------------------------------------------------------


def test_7_1_accepts_the_first_t_where_the_cache_is_larger_and_rejects_neighbours():
    D = 16
    t = exercises.check("7.1", 9)
    assert t.passed, t
    assert 2 * 9 * D > D * D + D >= 2 * 8 * D  # the answer really is the first such t
    for wrong in (8, 8.5, 16, None, "9"):
        r = exercises.check("7.1", wrong)
        assert not r.passed, wrong
    assert "the last t at which the cache is not larger" in exercises.check("7.1", 8).message
    assert "Hint" in exercises.check("7.1", 10).message
    assert ch07.check_cache_crossover(33, D=64).passed and ch07.cache_crossover(2) == 2


# --- 7.2 implement: bits per byte ----------------------------------------------------------------------


def solution_bits_per_byte(logits, tokens):
    logp = torch.log_softmax(logits[:, :-1], dim=-1)
    return -logp.gather(-1, tokens[:, 1:, None]).mean() / math.log(2)


def test_7_2_accepts_the_solution_and_the_package_agrees():
    r = ch07.check_bits_per_byte(solution_bits_per_byte)
    assert r.passed, r
    # the reference is the training code's measure: 8 bits for the uniform guess
    assert ch07.reference_bits_per_byte(torch.zeros(1, 3, 256), torch.tensor([[1, 2, 3]])) == pytest.approx(8.0)
    assert lab_lm.LN2 == pytest.approx(math.log(2))


@pytest.mark.parametrize(
    "wrong, says",
    [
        (lambda lg, tk: F.cross_entropy(lg[:, :-1].flatten(0, 1), tk[:, 1:].flatten()), "nats"),
        (lambda lg, tk: F.cross_entropy(lg.flatten(0, 1), tk.flatten()) / math.log(2), "predict the next one"),
        (lambda lg, tk: F.cross_entropy(lg[:, :-1].flatten(0, 1), tk[:, 1:].flatten()) / math.log(10), "base 10"),
        (
            lambda lg, tk: -torch.log2(lg[:, :-1].softmax(-1).gather(-1, tk[:, 1:, None]).mean()),
            "averaged before taking the log",
        ),
    ],
    ids=["nats", "no-shift", "log10", "mean-probability"],
)
def test_7_2_names_each_plausible_mistake(wrong, says):
    r = ch07.check_bits_per_byte(wrong)
    assert not r.passed and says in r.message, r.message


def test_7_2_reports_an_answer_that_raises_and_a_stub():
    def broken(logits, tokens):
        return logits[:, :-1].gather(-1, tokens)  # wrong index shape: gather raises

    r = ch07.check_bits_per_byte(broken)
    assert not r.passed and "raised RuntimeError" in r.message
    assert "not written yet" in ch07.check_bits_per_byte(lambda *a: (_ for _ in ()).throw(NotImplementedError)).message


# --- 7.3 implement: the KV-cache step ------------------------------------------------------------------


def solution_cached_step(q_t, k_t, v_t, keys, values):
    keys = torch.cat([keys, k_t[:, :, None]], dim=2)
    values = torch.cat([values, v_t[:, :, None]], dim=2)
    out = F.scaled_dot_product_attention(q_t[:, :, None], keys, values)[:, :, 0]
    return out, keys, values


def test_7_3_accepts_the_solution_which_is_the_last_row_of_causal_softmax_attention():
    assert ch07.check_cached_step(solution_cached_step).passed
    q, k, v = (torch.randn(1, 2, 6, 4, dtype=torch.float64) for _ in range(3))
    full = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    step = ch07.reference_cached_step(q[:, :, -1], k[:, :, -1], v[:, :, -1], k[:, :, :-1], v[:, :, :-1])
    torch.testing.assert_close(step.out, full[:, :, -1])


def _before_append(q_t, k_t, v_t, keys, values):
    out = F.scaled_dot_product_attention(q_t[:, :, None], keys, values)[:, :, 0]
    return out, torch.cat([keys, k_t[:, :, None]], 2), torch.cat([values, v_t[:, :, None]], 2)


def _unscaled(q_t, k_t, v_t, keys, values):
    keys, values = torch.cat([keys, k_t[:, :, None]], 2), torch.cat([values, v_t[:, :, None]], 2)
    return F.scaled_dot_product_attention(q_t[:, :, None], keys, values, scale=1.0)[:, :, 0], keys, values


def _causal(q_t, k_t, v_t, keys, values):
    keys, values = torch.cat([keys, k_t[:, :, None]], 2), torch.cat([values, v_t[:, :, None]], 2)
    return F.scaled_dot_product_attention(q_t[:, :, None], keys, values, is_causal=True)[:, :, 0], keys, values


def _prepended(q_t, k_t, v_t, keys, values):
    keys, values = torch.cat([k_t[:, :, None], keys], 2), torch.cat([v_t[:, :, None], values], 2)
    return F.scaled_dot_product_attention(q_t[:, :, None], keys, values)[:, :, 0], keys, values


def _query_axis(q_t, k_t, v_t, keys, values):
    keys, values = torch.cat([keys, k_t[:, :, None]], 2), torch.cat([values, v_t[:, :, None]], 2)
    w = (q_t[:, :, None] @ keys.transpose(-2, -1) / q_t.shape[-1] ** 0.5).softmax(dim=2)
    return (w @ values)[:, :, 0], keys, values


@pytest.mark.parametrize(
    "wrong, says",
    [
        (_before_append, "before the new key and value are added"),
        (_unscaled, "sqrt(D)"),
        (_causal, "causal mask is applied to the single new query"),
        (_prepended, "put first in the cache"),
        (_query_axis, "over the (single) query"),
    ],
    ids=["attend-before-append", "no-scale", "causal-mask", "prepended", "query-axis"],
)
def test_7_3_names_each_plausible_mistake(wrong, says):
    r = ch07.check_cached_step(wrong)
    assert not r.passed and says in r.message, r.message


def test_7_3_reports_an_answer_that_raises_and_a_wrong_shape():
    r = ch07.check_cached_step(lambda q, k, v, K, V: (q @ K, K, V))
    assert not r.passed and "raised RuntimeError" in r.message
    r = ch07.check_cached_step(lambda q, k, v, K, V: solution_cached_step(q, k, v, K, V)[0])
    assert not r.passed and "expected a tuple of 3" in r.message


# --- 7.4 implement: temperature and top-k --------------------------------------------------------------


def solution_distribution(logits, temperature, top_k):
    scaled = logits / temperature
    if top_k is not None:
        kth = torch.topk(scaled, top_k).values[:, -1:]
        scaled = torch.where(scaled >= kth, scaled, -torch.inf)
    return torch.softmax(scaled, dim=-1)


def k_smallest(logits, temperature, top_k):
    """The k smallest logits kept instead of the k largest."""
    scaled = logits / temperature
    if top_k is not None:
        kth = torch.topk(scaled, top_k, largest=False).values[:, -1:]
        scaled = torch.where(scaled <= kth, scaled, -torch.inf)
    return torch.softmax(scaled, dim=-1)


def test_7_4_accepts_the_solution_and_it_is_what_generate_samples_from():
    assert ch07.check_next_byte_distribution(solution_distribution).passed
    p = ch07.reference_next_byte_distribution(torch.randn(2, 256), 0.8, 3)
    assert ((p > 0).sum(-1) == 3).all() and torch.allclose(p.sum(-1), torch.ones(2))


@pytest.mark.parametrize(
    "wrong, says",
    [
        (lambda lg, T, k: solution_distribution(lg * T * T, T, k), "multiplied by the temperature"),
        (
            lambda lg, T, k: (lg / T).softmax(-1) * solution_distribution(lg, T, k).gt(0),
            "not renormalised",
        ),
        (k_smallest, "smallest"),
    ],
    ids=["times-temperature", "not-renormalised", "k-smallest"],
)
def test_7_4_names_each_plausible_mistake(wrong, says):
    r = ch07.check_next_byte_distribution(wrong)
    assert not r.passed and says in r.message, r.message


def test_7_4_reports_an_answer_that_raises():
    r = ch07.check_next_byte_distribution(lambda lg, T, k: torch.topk(lg, k).values.softmax(-1))
    assert not r.passed and ("raised" in r.message or "shape" in r.message)
    r = ch07.check_next_byte_distribution(lambda lg, T, k: 1 / 0)
    assert not r.passed and "raised ZeroDivisionError" in r.message


# --- issue 29 -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", [int, float, np.int64, np.float64, torch.tensor, np.array])
def test_7_1_in_every_number_type(kind):
    accepted(exercises.check("7.1", kind(9)))


@pytest.mark.parametrize("answer, says", [(8.5, "the first whole t"), (17, "2 t D numbers, not t D")])
def test_7_1_wrong_answers_are_named(answer, says):
    rejected(exercises.check("7.1", answer), says)


@pytest.mark.parametrize(
    "answer",
    [
        lambda lg, tk: F.cross_entropy(lg[:, :-1].flatten(0, 1), tk[:, 1:].flatten()) / math.log(2),
        lambda lg, tk: float(solution_bits_per_byte(lg, tk)),  # a Python float
        lambda lg, tk: solution_bits_per_byte(lg, tk).numpy(),  # a 0-d numpy array
        lambda lg, tk: np.float64(solution_bits_per_byte(lg, tk).item()),
    ],
    ids=["cross-entropy", "float", "0-d-array", "numpy-float"],
)
def test_7_2_right_answers_in_every_form(answer):
    accepted(exercises.check("7.2", answer))


@pytest.mark.parametrize(
    "wrong, says",
    [
        (lambda lg, tk: -torch.log_softmax(lg[:, :-1], -1).gather(-1, tk[:, 1:, None]).sum() / math.log(2), "summed"),
        (lambda lg, tk: F.cross_entropy(lg[:, 1:].flatten(0, 1), tk[:, :-1].flatten()) / math.log(2), "wrong way"),
        (lambda lg, tk: torch.log_softmax(lg[:, :-1], -1).gather(-1, tk[:, 1:, None]).mean() / math.log(2), "sign"),
    ],
    ids=["sum", "shift-back", "sign"],
)
def test_7_2_more_mistakes_are_named(wrong, says):
    diagnosed(exercises.check("7.2", wrong), says)


def test_7_2_tries_64_bytes_and_more():
    s = spy(solution_bits_per_byte)
    accepted(exercises.check("7.2", s))
    assert longest(s.calls, dim=1, arg=1) >= 64


def cached_step_lists(q_t, k_t, v_t, keys, values):
    out, keys, values = solution_cached_step(q_t, k_t, v_t, keys, values)
    return [out, keys, values]


def cached_step_einsum(q_t, k_t, v_t, keys, values):
    keys = torch.cat([keys, k_t.unsqueeze(2)], dim=2)
    values = torch.cat([values, v_t.unsqueeze(2)], dim=2)
    w = torch.einsum("bhd,bhtd->bht", q_t, keys).div(q_t.shape[-1] ** 0.5).softmax(-1)
    return torch.einsum("bht,bhtd->bhd", w, values), keys, values


def cached_step_old_cache(q_t, k_t, v_t, keys, values):
    out, _, _ = solution_cached_step(q_t, k_t, v_t, keys, values)
    return out, keys, values


def cached_step_scales_in_place(q_t, k_t, v_t, keys, values):
    q_t /= q_t.shape[-1] ** 0.5
    keys, values = torch.cat([keys, k_t[:, :, None]], 2), torch.cat([values, v_t[:, :, None]], 2)
    w = (keys @ q_t[..., None]).softmax(2)
    return (w * values).sum(2), keys, values


@pytest.mark.parametrize("answer", [cached_step_lists, cached_step_einsum], ids=["lists", "einsum"])
def test_7_3_right_answers_in_other_forms(answer):
    accepted(exercises.check("7.3", answer))


def test_7_3_more_mistakes_writes_and_sizes():
    diagnosed(exercises.check("7.3", cached_step_old_cache), "does not hold the new token")
    rejected(exercises.check("7.3", cached_step_scales_in_place), "wrote into its argument `q_t`")
    s = spy(solution_cached_step)
    accepted(exercises.check("7.3", s))
    assert longest(s.calls, dim=2, arg=3) >= 63  # 64 tokens with the new one


def distribution_top_k_first(logits, temperature, top_k):
    """Right too: top-k on the logits first (dividing by T > 0 keeps the order), then the temperature."""
    if top_k is not None:
        kth = logits.topk(top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, -math.inf)
    return (logits / temperature).softmax(-1)


def distribution_by_powers(logits, temperature, top_k):
    """Right too: p^(1/T), renormalised, is softmax(logits / T)."""
    p = distribution_top_k_first(logits, 1.0, top_k) ** (1 / temperature)
    return p / p.sum(-1, keepdim=True)


def distribution_temperature_only_with_top_k(logits, temperature, top_k):
    if top_k is None:
        return logits.softmax(-1)
    return solution_distribution(logits, temperature, top_k)


def distribution_divides_probabilities(logits, temperature, top_k):
    p = solution_distribution(logits, 1.0, top_k) / temperature
    return p / p.sum(-1, keepdim=True)


def distribution_k_minus_one(logits, temperature, top_k):
    scaled = logits / temperature
    if top_k is not None:
        kth = scaled.topk(top_k, dim=-1).values[:, -1:]
        scaled = scaled.masked_fill(scaled <= kth, -math.inf)
    return scaled.softmax(-1)


def distribution_in_place(logits, temperature, top_k):
    logits /= temperature
    return solution_distribution(logits, 1.0, top_k)


@pytest.mark.parametrize("answer", [distribution_top_k_first, distribution_by_powers], ids=["top-k-first", "powers"])
def test_7_4_right_answers_in_other_forms(answer):
    accepted(exercises.check("7.4", answer))


@pytest.mark.parametrize(
    "wrong, says",
    [
        (distribution_temperature_only_with_top_k, "applied only with top-k"),  # (issue 29) passed: only T = 1
        (distribution_divides_probabilities, "the temperature has no effect"),
        (distribution_k_minus_one, "only k - 1 bytes are kept"),
        (lambda lg, T, k: solution_distribution(lg, T, None if k is None else min(k + 1, 256)), "k + 1"),
        (lambda lg, T, k: solution_distribution(lg * T * T, T, k), "multiplied by the temperature"),
    ],
    ids=["T-only-with-top-k", "divides-probabilities", "k-minus-1", "k-plus-1", "times-T"],
)
def test_7_4_more_mistakes_are_named(wrong, says):
    diagnosed(exercises.check("7.4", wrong), says)


def test_7_4_tries_temperatures_other_than_1_without_top_k():
    s = spy(solution_distribution)
    accepted(exercises.check("7.4", s))
    assert {T for (lg, T, k), _ in s.calls if k is None} - {1.0}
    assert max(lg.shape[0] for (lg, T, k), _ in s.calls) >= 64


def test_7_4_rejects_writes_and_names_dtypes():
    rejected(exercises.check("7.4", distribution_in_place), "wrote into its argument `logits`")
    r = exercises.check("7.4", lambda lg, T, k: solution_distribution(lg.double(), T, k))
    rejected(r, "has dtype float64, expected float32")


@pytest.mark.parametrize("exercise_id", ["7.2", "7.3", "7.4"])
@pytest.mark.parametrize("answer", ODD_ANSWERS, ids=ODD_IDS)
def test_function_answers_of_the_wrong_type_get_feedback(exercise_id, answer):
    rejected(exercises.check(exercise_id, answer), "expected a function")
    rejected(exercises.check(exercise_id, lambda *args: answer))


@pytest.mark.parametrize("answer", ODD_ANSWERS, ids=ODD_IDS)
def test_7_1_answers_of_the_wrong_type_get_feedback(answer):
    rejected(exercises.check("7.1", answer))


def _softmax_as_is(x, dim=-1):  # (issue 29) exp of the logits without subtracting the maximum
    e = x.exp()
    return e / e.sum(dim, keepdim=True)


def _cached_step_with(softmax):
    def cached_step(q_t, k_t, v_t, keys, values):
        keys, values = torch.cat([keys, k_t.unsqueeze(2)], 2), torch.cat([values, v_t.unsqueeze(2)], 2)
        scores = (q_t.unsqueeze(-2) @ keys.transpose(-2, -1)) / math.sqrt(q_t.shape[-1])  # (B, H, 1, t)
        return (softmax(scores, -1) @ values).squeeze(-2), keys, values

    return cached_step


def _distribution_with(softmax):
    def next_byte_distribution(logits, temperature, top_k):
        scaled = logits / temperature
        if top_k is not None:
            kth = scaled.topk(top_k, dim=-1).values[:, -1:]
            scaled = scaled.masked_fill(scaled < kth, float("-inf"))
        return softmax(scaled, -1)

    return next_byte_distribution


def _bits_with(log_softmax):
    def bits_per_byte(logits, tokens):
        logp = log_softmax(logits[:, :-1], -1).gather(-1, tokens[:, 1:, None])
        return -logp.mean() / math.log(2)

    return bits_per_byte


@pytest.mark.parametrize(
    "exercise, right, forms",
    [
        ("7.2", _bits_with(torch.log_softmax), [_bits_with(lambda x, d: x - x.logsumexp(d, keepdim=True))]),
        ("7.3", _cached_step_with(torch.softmax), []),
        ("7.4", _distribution_with(torch.softmax), []),
    ],
)
def test_a_softmax_without_its_maximum_overflows_on_shifted_logits_and_is_told_so(exercise, right, forms):
    """(issue 29) Logits or scores shifted by a few hundred, which changes no probability: exp as it is overflows
    to inf and the answer is NaN there; the note says to subtract the maximum. (log(softmax(x)) survives a shift,
    but not a confidently wrong model: see test_7_2_a_confidently_wrong_model_needs_log_softmax.)"""
    assert exercises.check(exercise, right).passed
    for form in forms:
        assert exercises.check(exercise, form).passed
    wrong = {"7.2": _bits_with(lambda x, d: _softmax_as_is(x, d).log()), "7.3": _cached_step_with(_softmax_as_is),
             "7.4": _distribution_with(_softmax_as_is)}[exercise]  # fmt: skip
    r = exercises.check(exercise, wrong)
    assert not r.passed and "shifted" in r.message and "largest value before exp" in r.message, r.message


# --- the student's 615 answers: float32, a confidently wrong model, random sizes, exercise 7.5 -----------------


def bits_log2_of_softmax(logits, tokens):
    """-log2 of the softmax: right until a probability is 0 in the logits' dtype."""
    return -torch.log2(logits[:, :-1].softmax(-1)).gather(-1, tokens[:, 1:, None]).mean()


@pytest.mark.parametrize(
    "wrong",
    [bits_log2_of_softmax, _bits_with(lambda x, d: torch.softmax(x, d).log())],
    ids=["log2-softmax", "log-softmax-of-softmax"],
)
def test_7_2_a_confidently_wrong_model_needs_log_softmax(wrong):
    """A logit gap of 120 in float32: softmax gives exp(-120) = 0, and -log2 0 = inf; log_softmax gives -120."""
    r = exercises.check("7.2", wrong)
    rejected(r, "confidently wrong", "is inf where")
    diagnosed(r, "-log2 0 = inf overflows the mean; take log_softmax")
    for right in (solution_bits_per_byte, _bits_with(torch.log_softmax)):
        accepted(exercises.check("7.2", right))


def bits_in_float64(logits, tokens):
    """Right, but always a float64 tensor, whatever the logits' dtype."""
    return solution_bits_per_byte(logits.double(), tokens)


def bits_in_float32(logits, tokens):
    """Computed in float32 whatever the logits' dtype: a float32 tensor for float64 logits."""
    return solution_bits_per_byte(logits.float(), tokens)


def bits_from_float32_as_a_float(logits, tokens):
    """Computed in float32, returned as a Python float: on float64 logits it is off in the 7th digit or so."""
    return float(solution_bits_per_byte(logits.float(), tokens))


def test_7_2_tries_float32_and_names_the_dtype_or_shows_the_digits_that_differ():
    """(the student's 615 answers) A float32 answer was rejected with "the result is 0.118417, expected
    0.118417": the dtype is named where it is the problem, and numbers are shown with the digits that differ."""
    s = spy(solution_bits_per_byte)
    accepted(exercises.check("7.2", s))
    assert any(lg.dtype == torch.float32 for (lg, tk), _ in s.calls)
    rejected(exercises.check("7.2", bits_in_float64), "has dtype float64, expected float32")
    r = exercises.check("7.2", bits_in_float32)
    rejected(r, "has dtype float32, expected float64")
    r = exercises.check("7.2", bits_from_float32_as_a_float)
    rejected(r, "off by")
    got, want = r.message.split("the result is ")[1].split(" (off by")[0].split(", expected ")
    assert got != want and float(got) != float(want), r.message  # digits enough to see the difference


def cached_step_in_float64(q_t, k_t, v_t, keys, values):
    """Right, but always in float64."""
    return solution_cached_step(*(x.double() for x in (q_t, k_t, v_t, keys, values)))


BUFFER_128 = torch.ones(128, dtype=torch.bool)  # a key mask made once, for caches of up to 128 tokens


def cached_step_with_a_buffer(q_t, k_t, v_t, keys, values):
    keys, values = torch.cat([keys, k_t[:, :, None]], 2), torch.cat([values, v_t[:, :, None]], 2)
    visible = BUFFER_128[: keys.shape[2]]
    scores = (keys @ q_t[..., None])[..., 0] / q_t.shape[-1] ** 0.5
    return (scores.masked_fill(~visible, -math.inf).softmax(-1)[..., None] * values).sum(2), keys, values


def test_7_3_tries_float32_and_caches_longer_than_128():
    s = spy(solution_cached_step)
    seed = _seed_with_a_long_cache()
    accepted(exercises.check("7.3", s, seed=seed))
    assert any(q.dtype == torch.float32 for (q, *_), _ in s.calls)
    assert longest(s.calls, dim=2, arg=3) > 128
    rejected(exercises.check("7.3", cached_step_in_float64), "has dtype float64, expected float32")
    rejected(exercises.check("7.3", cached_step_with_a_buffer, seed=seed), "random, seed ", "fixed size")


def _seed_with_a_long_cache() -> int:
    """A seed whose random cache is longer than 128 tokens (most are: 64 to 400)."""
    return next(seed for seed in range(100) if ch07._cached_cases(ch07.Draw(seed))[-2].args[3].shape[2] > 128)


def test_7_4_draws_other_temperatures_and_top_k():
    s = spy(solution_distribution)
    accepted(exercises.check("7.4", s, seed=11))
    labels = [c.label for c in ch07._distribution_cases(ch07.Draw(11))]
    assert sum("seed 11" in label for label in labels) == 2


# 7.5 -----------------------------------------------------------------------------------------------------------


def small_writer():
    from attnbook.lab import lm as training

    torch.manual_seed(0)
    return training.SMALL.model("softmax"), torch.tensor([list(b"def ")])


def test_7_5_reruns_the_writing_and_accepts_the_least_varied_temperature():
    model, prompt = small_writer()
    variety = {}
    for temperature in (0, 0.5, 1.0, 1.5):  # the chapter's solution, as it is
        out = model.generate(prompt, 200, temperature=temperature, seed=0)
        variety[temperature] = lab_lm.distinct_fraction(bytes(out[0, 4:].tolist()))
    least = min(variety, key=variety.get)
    for form in (least, float(least), np.float64(least), torch.tensor(float(least))):
        accepted(exercises.check("7.5", form, model=model, prompt=prompt))
    most = max(variety, key=variety.get)
    rejected(exercises.check("7.5", most, model=model, prompt=prompt), "the most varied")
    rejected(exercises.check("7.5", 0.7, model=model, prompt=prompt), "not one of the temperatures")
    rejected(exercises.check("7.5", variety[least], model=model, prompt=prompt), "a fraction of distinct windows")
    rejected(exercises.check("7.5", None, model=model, prompt=prompt), "no answer yet")
    rejected(exercises.check("7.5", 0), "called with the wrong arguments", "model")
    rejected(exercises.check("7.5", 0, model="softmax", prompt=prompt), "model= must be")
    rejected(exercises.check("7.5", 0, model=model, prompt=b"def "), "prompt= must be")


@pytest.mark.parametrize("answer", ODD_ANSWERS, ids=ODD_IDS)
def test_7_5_answers_of_the_wrong_type_get_feedback(answer):
    model, prompt = small_writer()
    rejected(exercises.check("7.5", answer, model=model, prompt=prompt))
