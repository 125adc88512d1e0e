"""Chapter 4's exercise checkers: the solutions pass, plausible mistakes are named, nothing propagates."""

import pytest
import torch

import attnbook
from attnbook.exercises import check, registered

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


@pytest.mark.parametrize("answer, says", [(10, "10 = N is Flow-Attention's budget"), (1, "Hint"), (None, "no answer")])
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
    assert r.passed and "H = 1 included" in r.message, r.message


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


@pytest.mark.parametrize("answer, says", [(1, "Flow-Attention's row sum"), (12, "12 = N"), (3, "Hint")])
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
    assert all(check("4.4", r).passed for r in ratios), ratios


@pytest.mark.parametrize("answer, says", [(0.07, "the spread shrinks"), (2.0, "too small"), (100.0, "Hint")])
def test_spread_growth_wrong_answers(answer, says):
    r = check("4.4", answer)
    assert not r.passed and says in r.message
