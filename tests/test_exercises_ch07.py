"""Chapter 7's exercise checkers accept the solutions, name the plausible mistakes, report exceptions."""

import math

import pytest
import torch
import torch.nn.functional as F

from attnbook import exercises
from attnbook.exercises import ch07
from attnbook.lab import lm as lab_lm


def test_every_chapter_7_checker_is_registered():
    ids = [i for i in exercises.registered() if i.startswith("7.")]
    assert ids == ["7.1", "7.2", "7.3", "7.4"]


# --- 7.1 derive ----------------------------------------------------------------------------------------


def test_7_1_accepts_the_first_t_where_the_cache_is_larger_and_rejects_neighbours():
    D = 16
    t = exercises.check("7.1", 9)
    assert t.passed, t
    assert 2 * 9 * D > D * D + D >= 2 * 8 * D  # the answer really is the first such t
    for wrong in (8, 8.5, 16, None, "9"):
        r = exercises.check("7.1", wrong)
        assert not r.passed, wrong
    assert "Hint" in exercises.check("7.1", 8).message
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
