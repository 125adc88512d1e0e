"""Chapter 6's exercise checkers: the solutions pass in every form, plausible mistakes are named, nothing
crashes.

The wrong answers marked "(issue 29)" were written from the exercise statements, as a student would, before
reading the checkers."""

import math

import numpy as np
import pytest
import torch
from exercises_support import ODD_ANSWERS, ODD_IDS, accepted, diagnosed, rejected, spy

from attnbook import exercises
from attnbook.exercises import ch06
from attnbook.lab import headtohead as h2h


def matmul_flops(mechanism, B, H, N, D, Dv):
    """The chapter's solution of exercise 6.2."""
    if mechanism == "softmax":
        return B * H * (2 * N * N * D + 2 * N * N * Dv)  # Q K^T, then A V
    return B * H * (4 * N * D * Dv + 2 * N * D)  # phi(K)^T V, phi(Q) S, phi(Q) z


def test_every_chapter_6_exercise_is_registered():
    assert {"6.1", "6.2", "6.3", "6.4"} <= set(exercises.registered())


def test_crossover_accepts_the_derived_value_and_rejects_the_naive_one():
    D, Dv = ch06.CROSSOVER["D"], ch06.CROSSOVER["Dv"]
    derived = D * (2 * Dv + 1) / (D + Dv)  # 2 N^2 (D + Dv) = 4 N D Dv + 2 N D
    assert derived == 43
    assert exercises.check("6.1", derived).passed
    naive = exercises.check("6.1", D)  # N = D holds only for D_v = D and no normaliser
    assert not naive.passed and "Hint" in naive.message


def test_crossover_counts_are_really_equal_there():
    D, Dv = ch06.CROSSOVER["D"], ch06.CROSSOVER["Dv"]
    assert ch06._counted_flops("softmax", 1, 1, 43, D, Dv) == ch06._counted_flops("linear", 1, 1, 43, D, Dv)


def test_matmul_flops_accepts_the_solution():
    result = exercises.check("6.2", matmul_flops)
    assert result.passed, result.message


@pytest.mark.parametrize(
    ("wrong", "diagnosis"),
    [
        (ch06._half, "multiply-add is counted as one FLOP"),
        (ch06._no_value_product, "weights times V"),
        (ch06._no_normaliser, "normaliser"),
        (ch06._d_for_dv, "value width D_v"),
        (ch06._per_head, "multiply by B H"),
    ],
    ids=["half", "no-AV", "no-normaliser", "D-for-Dv", "per-head"],
)
def test_matmul_flops_names_plausible_mistakes(wrong, diagnosis):
    result = exercises.check("6.2", wrong)
    assert not result.passed
    assert diagnosis in result.message, result.message


def test_matmul_flops_wrong_type_raise_and_stub_are_reported():
    assert "expected a number" in exercises.check("6.2", lambda *a: "many").message
    assert "raised KeyError" in exercises.check("6.2", lambda m, *a: {}[m]).message

    def stub(mechanism, B, H, N, D, Dv):
        raise NotImplementedError

    assert "not written yet" in exercises.check("6.2", stub).message


def test_step_time_fit_accepts_the_least_squares_prediction():
    ops = {"softmax": 187, "linear": 258, "flow": 422, "moh": 237, "mobile": 1561}
    ms = {"softmax": 10.0, "linear": 11.0, "flow": 14.0, "moh": 11.0, "mobile": 30.0}
    x = torch.tensor([187.0, 258, 422, 237])
    y = torch.tensor([10.0, 11, 14, 11])
    b = ((x - x.mean()) * (y - y.mean())).sum() / ((x - x.mean()) ** 2).sum()
    prediction = float(y.mean() + b * (1561 - x.mean()))
    assert exercises.check("6.3", prediction, ops=ops, ms=ms).passed
    assert not exercises.check("6.3", ms["mobile"], ops=ops, ms=ms).passed  # the measurement is not the fit
    assert "same mechanisms" in exercises.check("6.3", 1.0, ops={"mobile": 1}, ms={}).message


def test_lookup_heads_counts_the_heads_of_a_model():
    task = h2h.RecallTask(n_pairs=3, n_keys=4, n_values=3)
    model = h2h.train("softmax", task, steps=2, eval_every=2, d_model=8, n_heads=2, n_layers=1, keep_model=True).model
    tokens, _ = task.batch(16, torch.Generator().manual_seed(0))
    count = int((h2h.lookup_share(model, tokens, task).mean(0) > 0.5).sum())
    assert exercises.check("6.4", count, model=model, tokens=tokens, task=task).passed
    assert not exercises.check("6.4", count + 1, model=model, tokens=tokens, task=task).passed


# --- issue 29 -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", [int, float, np.int64, np.float64, np.float32, torch.tensor, np.array])
def test_crossover_in_every_number_type(kind):
    accepted(exercises.check("6.1", kind(43)))


@pytest.mark.parametrize(
    "answer, says",
    [(32.5, "for D_v = D"), (2 * 32 * 64 / 96, "normaliser's 2 N D is missing"), (32 * 129 / 64, "both products")],
)
def test_crossover_wrong_answers_are_named(answer, says):
    rejected(exercises.check("6.1", answer), says)


def flops_as_numpy(mechanism, B, H, N, D, Dv):
    """Right too: a numpy.int64, and the mechanism's name tested another way."""
    per_head = np.int64(2 * N * N * (D + Dv)) if mechanism.startswith("soft") else np.int64(4 * N * D * Dv + 2 * N * D)
    return B * H * per_head


def flops_as_float(mechanism, B, H, N, D, Dv):
    return float(matmul_flops(mechanism, B, H, N, D, Dv))


def flops_as_tensor(mechanism, B, H, N, D, Dv):
    return torch.tensor(matmul_flops(mechanism, B, H, N, D, Dv))


def flops_forgot_batch(mechanism, B, H, N, D, Dv):
    return H * (2 * N * N * (D + Dv) if mechanism == "softmax" else 4 * N * D * Dv + 2 * N * D)


def flops_forgot_heads(mechanism, B, H, N, D, Dv):
    return B * (2 * N * N * (D + Dv) if mechanism == "softmax" else 4 * N * D * Dv + 2 * N * D)


def flops_macs(mechanism, B, H, N, D, Dv):
    return B * H * (N * N * (D + Dv) if mechanism == "softmax" else 2 * N * D * Dv + N * D)


@pytest.mark.parametrize("answer", [flops_as_numpy, flops_as_float, flops_as_tensor], ids=["numpy", "float", "tensor"])
def test_matmul_flops_right_answers_in_every_number_type(answer):
    accepted(exercises.check("6.2", answer))


@pytest.mark.parametrize(
    "wrong, diagnosis",
    [
        (flops_forgot_batch, "the batch size B is missing"),  # (issue 29) was "a multiply-add counted as one FLOP"
        (flops_forgot_heads, "the number of heads H is missing"),
        (flops_macs, "multiply-add is counted as one FLOP"),
    ],
    ids=["no-B", "no-H", "macs"],
)
def test_matmul_flops_student_mistakes_are_named(wrong, diagnosis):
    diagnosed(exercises.check("6.2", wrong), diagnosis)


def test_matmul_flops_tries_n_64_and_more():
    s = spy(matmul_flops)
    accepted(exercises.check("6.2", s))
    assert max(args[3] for args, _ in s.calls) >= 64


OPS = {"softmax": 187, "linear": 258, "flow": 422, "moh": 237, "mobile": 1561}
MS = {"softmax": 10.0, "linear": 11.0, "flow": 14.5, "moh": 11.2, "mobile": 30.0}


def fit(ops, ms, dtype=torch.float64, include_mobile=False):
    names = [m for m in ops if m != "mobile" or include_mobile]
    x = torch.tensor([ops[m] for m in names], dtype=dtype)
    y = torch.tensor([ms[m] for m in names], dtype=dtype)
    b = ((x - x.mean()) * (y - y.mean())).sum() / ((x - x.mean()) ** 2).sum()
    return y.mean() + b * (ops["mobile"] - x.mean()), b


@pytest.mark.parametrize(
    "answer",
    [
        float(fit(OPS, MS)[0]),
        fit(OPS, MS)[0],  # a 0-d tensor
        fit(OPS, MS, dtype=torch.float32)[0],  # torch's default dtype
        np.polyval(np.polyfit([OPS[m] for m in OPS if m != "mobile"], [MS[m] for m in MS if m != "mobile"], 1), 1561),
    ],
    ids=["float", "tensor", "float32", "numpy-polyfit"],
)
def test_step_time_fit_right_answers_in_every_form(answer):
    accepted(exercises.check("6.3", answer, ops=OPS, ms=MS))


@pytest.mark.parametrize(
    "answer, says",
    [
        (MS["mobile"], "mobile's measured time"),
        (float(fit(OPS, MS, include_mobile=True)[0]), "the fit includes mobile"),
        (sum(OPS[m] * MS[m] for m in OPS if m != "mobile") / sum(OPS[m] ** 2 for m in OPS if m != "mobile") * 1561,
         "through the origin"),
        (float(fit(OPS, MS)[1]), "that is the slope;"),
        (float(fit(OPS, MS)[1]) * 1561, "the intercept is missing"),
        (float(fit(OPS, MS)[0]) * 1.01, "Hint"),
    ],
    ids=["measured", "with-mobile", "origin", "slope", "no-intercept", "one-percent-off"],
)  # fmt: skip
def test_step_time_fit_wrong_answers_are_named(answer, says):
    rejected(exercises.check("6.3", answer, ops=OPS, ms=MS), says)


def test_step_time_fit_summaries_instead_of_numbers_get_feedback():
    summaries = {m: h2h.Summary(mean=0.9, low=0.8, high=1.0, std=0.1, step_ms=t, seeds=3) for m, t in MS.items()}
    rejected(exercises.check("6.3", 20.0, ops=OPS, ms=summaries), "is a Summary, not a number", "step_ms")
    rejected(exercises.check("6.3", 20.0, ops=OPS, ms=[1, 2]), "ms must be a dict")
    rejected(exercises.check("6.3", 20.0, ops=OPS), "called with the wrong arguments")
    rejected(exercises.check("6.3", 20.0, ops=OPS, ms={**MS, "flow": "fast"}), "expected a number")


def test_step_time_fit_never_accepts_when_the_fit_is_undefined():
    flat = {m: 300 for m in OPS} | {"mobile": 1561}  # every other mechanism runs as many operations
    for answer in (float("nan"), 30.0, 0.0):
        rejected(exercises.check("6.3", answer, ops=flat, ms=MS), "undefined for these inputs")


@pytest.mark.parametrize("answer", ODD_ANSWERS, ids=ODD_IDS)
def test_step_time_fit_answers_of_the_wrong_type_get_feedback(answer):
    rejected(exercises.check("6.3", answer, ops=OPS, ms=MS))


def tiny_model(heads=4):
    task = h2h.RecallTask(n_pairs=3, n_keys=4, n_values=3)
    model = h2h.TinyModel("softmax", vocab=task.vocab, length=task.length, n_out=task.n_values, d_model=8,
                          n_heads=heads, n_layers=1)  # fmt: skip
    return model, task.batch(64, torch.Generator().manual_seed(0))[0], task


def with_shares(monkeypatch, shares):
    """lookup_share replaced by fixed (sequences, heads) shares: the count is then known exactly."""
    monkeypatch.setattr(h2h, "lookup_share", lambda model, tokens, task: shares)


def test_lookup_heads_counts_exactly_on_the_probe_it_is_given(monkeypatch):
    """(issue 29) The checker averages the same sequences as the student: a head near one half (0.51 +- noise)
    counts on the side its mean falls, and the count one off is rejected, the close head named. A student's miscount
    of [0.737, 0.858, 0.664, 0.480] as 4 passed while a 3-standard-error margin was allowed."""
    g = torch.Generator().manual_seed(0)
    base = torch.tensor([0.9, 0.2, 0.51, 0.7])  # the third head sits near the threshold
    shares = (base + 0.1 * torch.randn(64, 4, generator=g)).clamp(0, 1)
    with_shares(monkeypatch, shares)
    model, tokens, task = tiny_model()
    kw = dict(model=model, tokens=tokens, task=task)
    exact = int((shares.double().mean(0) > 0.5).sum())  # written out: the mean over the sequences, above 0.5
    assert abs(float(shares.double().mean(0)[2]) - 0.5) < 0.05  # the case is near the edge
    for right in (exact, float(exact), np.int64(exact), torch.tensor(exact)):
        accepted(exercises.check("6.4", right, **kw))
    other = 5 - exact  # 2 <-> 3: the near head counted on the other side
    rejected(exercises.check("6.4", other, **kw), "by one", "head 2", "close to one half")
    rejected(exercises.check("6.4", 1, **kw), "the heads below one half")
    rejected(exercises.check("6.4", 0, **kw), "Hint")
    rejected(exercises.check("6.4", 2.5, **kw), "not a count")
    student = torch.tensor([0.737, 0.858, 0.664, 0.480]).expand(16, 4)  # the helper's race: 3 above one half
    with_shares(monkeypatch, student)
    accepted(exercises.check("6.4", 3, **kw))
    rejected(exercises.check("6.4", 4, **kw), "by one", "head 3 (0.480)")
    on_edge = torch.tensor([0.9, 0.2, 0.5 + 1e-9, 0.7]).expand(8, 4)  # within float rounding: either way
    with_shares(monkeypatch, on_edge)
    accepted(exercises.check("6.4", 2, **kw))
    accepted(exercises.check("6.4", 3, **kw))


def test_lookup_heads_a_curve_instead_of_its_model_gets_feedback():
    model, tokens, task = tiny_model()
    curve = h2h.Curve("softmax", model=model)
    rejected(exercises.check("6.4", 2, model=curve, tokens=tokens, task=task), "is a Curve", ".model")
    rejected(exercises.check("6.4", 2, model="softmax", tokens=tokens, task=task), "must be a trained TinyModel")
    rejected(exercises.check("6.4", 2, model=model, tokens=tokens.tolist(), task=task), "tokens=")
    rejected(exercises.check("6.4", 2, model=model, tokens=tokens, task=None), "task=")
    rejected(exercises.check("6.4", 2), "called with the wrong arguments")


@pytest.mark.parametrize("answer", ODD_ANSWERS, ids=ODD_IDS)
def test_lookup_heads_answers_of_the_wrong_type_get_feedback(monkeypatch, answer):
    with_shares(monkeypatch, torch.full((8, 4), 0.3))
    model, tokens, task = tiny_model()
    rejected(exercises.check("6.4", answer, model=model, tokens=tokens, task=task))


@pytest.mark.parametrize("answer", ODD_ANSWERS, ids=ODD_IDS)
def test_crossover_and_flops_answers_of_the_wrong_type_get_feedback(answer):
    rejected(exercises.check("6.1", answer))
    rejected(exercises.check("6.2", answer), "expected a function")
    rejected(exercises.check("6.2", lambda *args: answer))


def test_the_tolerance_of_the_fit_is_the_spread_of_float32_arithmetic():
    exact = float(fit(OPS, MS)[0])
    low = float(fit(OPS, MS, dtype=torch.float32)[0])
    assert 0 < abs(low - exact) / exact < 1e-4  # float32 moves the prediction, a little
    assert not math.isclose(exact, MS["mobile"], rel_tol=1e-3)  # the wrong answers are much further away


def test_step_time_fit_rounded_as_a_cell_prints_it():
    """(issue 29) The checker printed "20.4636 is right." for the exact fit, yet 20.4636 typed back was rejected,
    and so was 20.5, what the solution cell prints; a right value rounded to 3 or more significant digits passes,
    a value off in its last digit does not."""
    exact = float(fit(OPS, MS)[0])
    for digits in (3, 4, 6):
        accepted(exercises.check("6.3", float(f"{exact:.{digits}g}"), ops=OPS, ms=MS))
    off = float(f"{exact:.4g}") + 10 ** (math.floor(math.log10(abs(exact))) - 3)  # the 4th digit one too high
    rejected(exercises.check("6.3", off, ops=OPS, ms=MS), "Hint")
    rejected(exercises.check("6.3", float(f"{exact:.2g}"), ops=OPS, ms=MS))  # two digits are too few


# --- the student's 615 answers: a measurement is not a model, random shapes, fits of the printed times --------


def flops_measured(mechanism, B, H, N, D, Dv):
    """Counts by running the package under FlopCounterMode: right numbers, but a measurement, not a model."""
    from attnbook import linear_attention, reference
    from attnbook.lab.profiling import matmul_flops as measure

    q, v = torch.zeros(B, H, N, D, dtype=torch.float64), torch.zeros(B, H, N, Dv, dtype=torch.float64)
    run = reference.softmax_attention if mechanism == "softmax" else linear_attention
    return measure(lambda: run(q, q, v))


def flops_einsum_count(mechanism, B, H, N, D, Dv):
    """Right numbers from shapes, but found by running one product on tensors of ones (a measurement too)."""
    a = torch.ones(B * H, N, D if mechanism == "softmax" else N, dtype=torch.float64)
    if mechanism == "softmax":
        return int((a @ a.transpose(1, 2)).sum()) * 2 + B * H * 2 * N * N * Dv
    return matmul_flops(mechanism, B, H, N, D, Dv)


@pytest.mark.parametrize("answer", [flops_measured, flops_einsum_count], ids=["flop-counter", "runs-a-product"])
def test_matmul_flops_rejects_a_function_that_measures(answer):
    r = exercises.check("6.2", answer)
    rejected(r, "matrix products", "not a cost model", "by hand")


def flops_table(mechanism, B, H, N, D, Dv):
    """Right on the eight shapes the old checker always tried (all with N <= 100), D for D_v elsewhere."""
    return matmul_flops(mechanism, B, H, N, D, Dv if N <= 100 else D)


def test_matmul_flops_draws_shapes_past_n_100_with_other_widths():
    s = spy(matmul_flops)
    accepted(exercises.check("6.2", s))
    assert max(args[3] for args, _ in s.calls) > 100
    r = exercises.check("6.2", flops_table)
    rejected(r, "random, seed ")
    diagnosed(r, "D is used where the value width D_v belongs")


MS_MEASURED = {"softmax": 10.0341, "linear": 11.2678, "flow": 14.5512, "moh": 11.1949, "mobile": 30.02}


def test_step_time_fit_of_the_times_as_the_cell_prints_them_is_right():
    """(the student's 615 answers) 40.6254, a fit of the printed times, was rejected while 40.6 passed: the fit
    of the times rounded to 0.1 ms, as the cell prints them, is as right as the fit of the unrounded ones."""
    printed = {m: float(f"{t:5.1f}") for m, t in MS_MEASURED.items()}
    exact, from_printed = float(fit(OPS, MS_MEASURED)[0]), float(fit(OPS, printed)[0])
    assert abs(from_printed - exact) > 0.1  # far more than a one-digit change: no tolerance would cover both
    for answer in (from_printed, float(f"{from_printed:.6g}"), fit(OPS, printed, dtype=torch.float32)[0]):
        r = exercises.check("6.3", answer, ops=OPS, ms=MS_MEASURED)
        accepted(r)
        assert "as the cell prints them" in r.message, r.message
    accepted(exercises.check("6.3", exact, ops=OPS, ms=MS_MEASURED))
    rejected(exercises.check("6.3", exact + 0.01, ops=OPS, ms=MS_MEASURED), "Hint")
    rejected(exercises.check("6.3", from_printed + 0.01, ops=OPS, ms=MS_MEASURED), "Hint")
