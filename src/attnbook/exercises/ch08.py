"""Chapter 8's exercise checkers.

* 8.1 ``answer``: the number of tokens after which a pair written under a decay of 0.95 per token has less than
  half its weight in the state;
* 8.2 ``delta_write(S, k, v, beta)``: one write of the delta rule into S (B, H, D, Dv);
* 8.3 ``ut_transform(k, beta)``: T = (I + tril(diag(beta) K K^T, -1))^-1 of one chunk;
* 8.4 ``answer``: the first number of random unit keys at which a state that only adds reads them back with a
  mean relative error above 0.5 (:func:`interference_curve`).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ._core import Case, Diagnosis, Draw, Result, check_function, check_value, exercise

# ------------------------------------------------------------------------------------------------ 8.1


@exercise("8.1")
def check_half_life(answer) -> Result:
    """Exercise 8.1: the first t with 0.95^t < 1/2."""
    exact = math.log(0.5) / math.log(0.95)  # 13.51
    return check_value(
        "8.1 half-life",
        answer,
        math.ceil(exact),
        hint="the weight after t more tokens is 0.95^t; solve 0.95^t < 1/2 for the first whole t",
        mistakes=[
            (exact, f"{exact:.2f} solves 0.95^t = 1/2; the question asks for the first whole number of tokens."),
            (13, "after 13 tokens the weight is 0.95^13 = 0.513, still above one half."),
            (20, "20 = 1 / (1 - 0.95) is the mean lifetime of a pair, not the time to one half."),
        ],
    )  # fmt: skip


# ------------------------------------------------------------------------------------------------ 8.2


def delta_write_reference(S, k, v, beta):
    """S + beta k (v - S^T k)^T for S (B, H, D, Dv), k (B, H, D), v (B, H, Dv), beta (B, H)."""
    predicted = (k.unsqueeze(-1) * S).sum(-2)  # (B, H, Dv): S^T k
    return S + beta[..., None, None] * k.unsqueeze(-1) * (v - predicted).unsqueeze(-2)


def _write_cases(draw: Draw) -> list[Case]:
    cases = []
    for dtype in (torch.float64, torch.float32):
        B, H, D, Dv = draw.int(1, 3), draw.int(1, 4), draw.int(2, 24), draw.int(2, 24)
        while Dv == D:
            Dv = draw.int(2, 24)
        S = draw.randn(B, H, D, Dv, dtype=dtype)
        k = F.normalize(draw.randn(B, H, D), dim=-1).to(dtype)
        v, beta = draw.randn(B, H, Dv, dtype=dtype), draw.rand(B, H).to(dtype)
        label = draw.label(f"{str(dtype).removeprefix('torch.')}, B = {B}, H = {H}, D = {D}, Dv = {Dv}")
        cases.append(Case((S, k, v, beta), label=label))
    return cases


WRITE_MISTAKES = [
    Diagnosis("the write adds k v^T as linear attention does; the delta rule writes the error v - S^T k",
              lambda S, k, v, beta: S + beta[..., None, None] * k.unsqueeze(-1) * v.unsqueeze(-2)),
    Diagnosis("beta scales only v; it scales the whole error, v - S^T k",
              lambda S, k, v, beta: S + k.unsqueeze(-1) * (beta[..., None] * v - (k.unsqueeze(-1) * S).sum(-2))
              .unsqueeze(-2)),
    Diagnosis("beta is left out: the write is the whole error",
              lambda S, k, v, beta: delta_write_reference(S, k, v, torch.ones_like(beta))),
]  # fmt: skip


@exercise("8.2")
def check_delta_write(fn, *, seed: int | None = None) -> Result:
    """Exercise 8.2: ``delta_write(S, k, v, beta)`` -> the state after one delta-rule write."""
    return check_function(fn, _write_cases(Draw(seed)), expected=delta_write_reference, name="delta_write",
                          diagnoses=WRITE_MISTAKES)  # fmt: skip


# ------------------------------------------------------------------------------------------------ 8.3


def ut_reference(k, beta):
    """(I + tril(diag(beta) K K^T, -1))^-1 for one chunk's keys k (..., L, D) and beta (..., L)."""
    eye = torch.eye(k.shape[-2], dtype=k.dtype)
    A = eye + (beta.unsqueeze(-1) * (k @ k.transpose(-2, -1))).tril(-1)
    return torch.linalg.solve_triangular(A, eye.expand_as(A), upper=False, unitriangular=True)


def _ut_cases(draw: Draw) -> list[Case]:
    cases = []
    for dtype in (torch.float64, torch.float32):
        L, D = draw.int(2, 40), draw.int(2, 32)
        k = F.normalize(draw.randn(2, L, D), dim=-1).to(dtype)
        beta = draw.rand(2, L).to(dtype)
        cases.append(Case((k, beta), label=draw.label(f"{str(dtype).removeprefix('torch.')}, L = {L}, D = {D}")))
    return cases


UT_MISTAKES = [
    Diagnosis("the diagonal is kept in tril: only the pairs s < r (earlier keys) enter, tril(..., -1)",
              lambda k, beta: torch.linalg.inv(torch.eye(k.shape[-2], dtype=k.dtype)
                                               + (beta.unsqueeze(-1) * (k @ k.transpose(-2, -1))).tril())),
    Diagnosis("the matrix itself is returned, not its inverse",
              lambda k, beta: torch.eye(k.shape[-2], dtype=k.dtype)
              + (beta.unsqueeze(-1) * (k @ k.transpose(-2, -1))).tril(-1)),
    Diagnosis("beta multiplies the columns (the earlier key s); it belongs to the row r, the key being written",
              lambda k, beta: torch.linalg.inv(torch.eye(k.shape[-2], dtype=k.dtype)
                                               + ((k @ k.transpose(-2, -1)) * beta.unsqueeze(-2)).tril(-1))),
]  # fmt: skip


@exercise("8.3")
def check_ut_transform(fn, *, seed: int | None = None) -> Result:
    """Exercise 8.3: ``ut_transform(k, beta)`` -> T (..., L, L)."""
    return check_function(fn, _ut_cases(Draw(seed)), expected=ut_reference, name="ut_transform",
                          diagnoses=UT_MISTAKES)  # fmt: skip


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
        S = keys[:P].T @ values[:P]  # (D, D)
        read = keys[:P] @ S  # (P, D): S^T k_i for every key
        errors.append(((read - values[:P]).norm(dim=-1) / values[:P].norm(dim=-1)).mean().item())
    return errors


@exercise("8.4")
def check_first_crowded(answer) -> Result:
    """Exercise 8.4: the first P at which the mean relative readout error exceeds 0.5 (D = 16, seed 0)."""
    errors = interference_curve()
    first = next(P for P, e in enumerate(errors, start=1) if e > 0.5)
    return check_value(
        "8.4 first crowded P",
        answer,
        first,
        hint="read the curve the cell prints: the first P whose error is above 0.5",
        mistakes=[(16, "16 = D is where orthogonal keys would run out; random keys interfere before that.")],
    )
