"""Checkers for the exercises of chapter 8 (recall and forgetting): 8.1 the half-life of a pair under a decay of
0.95 per token, 8.2 one write of the delta rule, 8.3 the UT transform of one chunk, 8.4 the first number of
random unit keys at which a state that only adds reads them back with a mean relative error above 0.5
(:func:`interference_curve`).
"""

from __future__ import annotations

import math
from functools import partial

import torch
import torch.nn.functional as F

from ._core import Case, Diagnosis, Draw, Result, check_function, check_value, exercise, randn

# ------------------------------------------------------------------------------------------------ 8.1


@exercise("8.1")
def check_half_life(answer) -> Result:
    """Exercise 8.1: the first t with 0.95^t < 1/2."""
    exact = math.log(0.5) / math.log(0.95)  # 13.51
    return check_value(
        "8.1 half-life", answer, math.ceil(exact),
        hint="the weight after t more tokens is 0.95^t; solve 0.95^t < 1/2 for the first whole t",
        mistakes=[
            (exact, f"{exact:.2f} solves 0.95^t = 1/2; the question asks for the first whole number of tokens."),
            (13, "after 13 tokens the weight is 0.95^13 = 0.513, still above one half."),
            (20, "20 = 1 / (1 - 0.95) is the mean lifetime of a pair, not the time to one half."),
        ],
    )  # fmt: skip


# ------------------------------------------------------------------------------------------------ 8.2


def _write(S, k, v, beta, *, error=True, beta_on_v=False, with_beta=True):
    """S + beta k (v - S^T k)^T with one piece changed: k v^T written instead of the error, beta on v only, no beta."""
    predicted = (k.unsqueeze(-1) * S).sum(-2) if error else 0.0  # (B, H, Dv): S^T k
    beta = beta[..., None] if with_beta else 1.0
    u = beta * v - predicted if beta_on_v else beta * (v - predicted)  # (B, H, Dv): the write
    return S + k.unsqueeze(-1) * u.unsqueeze(-2)


def delta_write_reference(S, k, v, beta):
    """S + beta k (v - S^T k)^T for S (B, H, D, Dv), k (B, H, D), v (B, H, Dv), beta (B, H)."""
    return _write(S, k, v, beta)


WRITE_MISTAKES = [
    Diagnosis("the write adds k v^T as linear attention does; the delta rule writes the error v - S^T k",
              partial(_write, error=False)),
    Diagnosis("beta scales only v; it scales the whole error, v - S^T k", partial(_write, beta_on_v=True)),
    Diagnosis("beta is left out: the write is the whole error", partial(_write, with_beta=False)),
]  # fmt: skip


def _write_cases(draw: Draw):
    def write(D, dtype):  # a state S (B, H, D, Dv) with Dv != D, a unit key, a value and a beta in [0, 1]
        B, H, Dv = draw.int(1, 3), draw.int(1, 4), draw.int(2, 24, avoid=(D,))
        S, k = draw.randn(B, H, D, Dv, dtype=dtype), F.normalize(draw.randn(B, H, D), dim=-1).to(dtype)
        v, beta = draw.randn(B, H, Dv, dtype=dtype), draw.rand(B, H).to(dtype)
        return (S, k, v, beta), f"B = {B}, H = {H}, D = {D}, Dv = {Dv}"

    f64 = {"dtype": torch.float64}
    e1, S1 = torch.tensor([[[1.0, 0.0]]], **f64), torch.arange(6, **f64).reshape(1, 1, 2, 3)  # D = 2, Dv = 3
    fixed = [
        Case((S1, e1, torch.ones(1, 1, 3, **f64), torch.ones(1, 1, **f64)), label="beta = 1, key e_1: row 1 replaced"),
        Case((S1, e1, torch.ones(1, 1, 3, **f64), torch.zeros(1, 1, **f64)), label="beta = 0: nothing written"),
        Case((randn(6, 3, 2, 4, 5), F.normalize(randn(7, 3, 2, 4), dim=-1), randn(8, 3, 2, 5),
              randn(9, 3, 2).sigmoid()), label="3 sequences, 2 heads, D = 4, Dv = 5"),
    ]  # fmt: skip
    return fixed + draw.cases(write, long=(2, 24), short=(2, 24))


@exercise("8.2")
def check_delta_write(fn, *, seed: int | None = None) -> Result:
    """Exercise 8.2: ``delta_write(S, k, v, beta)`` -> the state after one delta-rule write."""
    return check_function(
        fn, _write_cases(Draw(seed)), expected=delta_write_reference, name="delta_write", diagnoses=WRITE_MISTAKES,
    )  # fmt: skip


# ------------------------------------------------------------------------------------------------ 8.3


def _ut(k, beta, *, diagonal=-1, invert=True, beta_on_rows=True):
    """(I + tril(diag(beta) K K^T, ``diagonal``))^-1 with one piece changed: the diagonal kept, no inverse, beta
    on the columns."""
    eye = torch.eye(k.shape[-2], dtype=k.dtype)
    kk = k @ k.transpose(-2, -1)  # (..., ell, ell)
    A = eye + (beta.unsqueeze(-1) * kk if beta_on_rows else kk * beta.unsqueeze(-2)).tril(diagonal)
    return torch.linalg.inv(A) if invert else A


def ut_reference(k, beta):
    """(I + tril(diag(beta) K K^T, -1))^-1 for one chunk's keys k (..., ell, D) and beta (..., ell)."""
    A = _ut(k, beta, invert=False)  # (..., ell, ell), unit lower triangular
    eye = torch.eye(k.shape[-2], dtype=k.dtype).expand_as(A)
    return torch.linalg.solve_triangular(A, eye, upper=False, unitriangular=True)


UT_MISTAKES = [
    Diagnosis("the diagonal is kept in tril: only the pairs s < r (earlier keys) enter, tril(..., -1)",
              partial(_ut, diagonal=0)),
    Diagnosis("the matrix itself is returned, not its inverse", partial(_ut, invert=False)),
    Diagnosis("beta multiplies the columns (the earlier key s); it belongs to the row r, the key being written",
              partial(_ut, beta_on_rows=False)),
]  # fmt: skip


def _ut_cases(draw: Draw) -> list[Case]:
    def keys(seed, *shape):
        return F.normalize(randn(seed, *shape), dim=-1)

    fixed = [  # leading dimensions (...) of every count: the statement's k is (..., ell, D)
        Case((keys(1, 4, 3), torch.tensor([1.0, 0.5, 0.25, 1.0], dtype=torch.float64)), label="one chunk (4, 3)"),
        Case((keys(2, 3, 2, 5, 4), randn(3, 3, 2, 5).sigmoid()), label="3 sequences, 2 heads, chunks of 5"),
        Case((keys(4, 1, 1, 6), torch.ones(1, 1, dtype=torch.float64)), label="a chunk of one key: T = [[1]]"),
        Case((keys(5, 2, 6, 3), torch.zeros(2, 6, dtype=torch.float64)), label="beta = 0, nothing written: T = I"),
    ]

    def chunk(L, dtype):  # unit keys (..., L, D) behind one to three leading dimensions, betas in [0, 1]
        # no leading size of 2: an answer unrolled for a batch of two passed every case when all had it
        lead, D = tuple(draw.int(1, 4, avoid=(2,)) for _ in range(draw.int(1, 3))), draw.int(2, 32)
        k = F.normalize(draw.randn(*lead, L, D), dim=-1).to(dtype)
        return (k, draw.rand(*lead, L).to(dtype)), f"k {(*lead, L, D)}"

    return fixed + draw.cases(chunk, long=(2, 40), short=(2, 40))


@exercise("8.3")
def check_ut_transform(fn, *, seed: int | None = None) -> Result:
    """Exercise 8.3: ``ut_transform(k, beta)`` -> T (..., ell, ell)."""
    return check_function(fn, _ut_cases(Draw(seed)), expected=ut_reference, name="ut_transform", diagnoses=UT_MISTAKES)


# ------------------------------------------------------------------------------------------------ 8.4


def interference_curve(max_pairs: int = 64, D: int = 16, seed: int = 0) -> list[float]:
    """For P = 1 .. ``max_pairs``: write P random unit keys (D) with random values (D) into S = sum_i k_i v_i^T
    and read every key back; the mean of |S^T k_i - v_i| / |v_i| over the pairs. The keys and values of P are
    the first P of one draw (generator ``seed``), as in the exercise's cell."""
    g = torch.Generator().manual_seed(seed)
    keys = F.normalize(torch.randn(max_pairs, D, generator=g, dtype=torch.float64), dim=-1)
    values = torch.randn(max_pairs, D, generator=g, dtype=torch.float64)
    errors = []
    for P in range(1, max_pairs + 1):
        read = keys[:P] @ (keys[:P].T @ values[:P])  # (P, D): S^T k_i for every key, S (D, D)
        errors.append(((read - values[:P]).norm(dim=-1) / values[:P].norm(dim=-1)).mean().item())
    return errors


@exercise("8.4")
def check_first_crowded(answer) -> Result:
    """Exercise 8.4: the first P at which the mean relative readout error exceeds 0.5 (D = 16, seed 0)."""
    first = next(P for P, e in enumerate(interference_curve(), start=1) if e > 0.5)
    return check_value(
        "8.4 first crowded P", answer, first,
        hint="read the curve the cell prints: the first P whose error is above 0.5",
        mistakes=[(16, "16 = D is where orthogonal keys would run out; random keys interfere before that.")],
    )  # fmt: skip
