"""The measuring helpers used by the book and the benchmarks."""

import math

import pytest
import torch

from attnbook.lab.profiling import Scaling, compare, matmul_flops, measure_scaling, peak_memory


def test_peak_memory_counts_new_tensors_and_their_peak():
    x = torch.randn(1000, 1000)  # 4 MB that exists before the call

    def two_temporaries():
        a = x * 2  # +4 MB
        b = a + 1  # +4 MB, both alive: peak 8 MB
        del a
        return b.sum()

    peak = peak_memory(two_temporaries)
    assert 8_000_000 <= peak < 8_100_000


def test_peak_memory_ignores_views_and_in_place_writes_of_existing_tensors():
    x = torch.randn(1000, 1000)
    peak = peak_memory(lambda: (x.view(-1), x.reshape(1000, 1000), x.transpose(0, 1), x[:10]))
    assert peak == 0
    y = torch.zeros(1000, 1000)
    assert peak_memory(lambda: y.add_(1.0)) == 0


def test_compare_alternates_and_reports_medians():
    calls = []
    result = compare({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, repeats=4, warmup=1)
    assert calls[:2] == ["a", "b"]  # warm-up
    assert calls[2:] == ["a", "b", "b", "a", "a", "b", "b", "a"]  # alternating order
    assert set(result) == {"a", "b"} and all(len(t.samples) == 4 for t in result.values())
    with pytest.raises(ValueError, match="fns must hold at least one callable to time, got an empty dict"):
        compare({})


# --- measure_scaling, Scaling, matmul_flops (the chapters' cost figures) ---------------------------------------


def _inputs(n):
    return [torch.ones(n, 4), torch.ones(4, n)]


def test_measure_scaling_times_and_counts_memory_at_every_length():
    calls = []

    def outer(a, b):  # an (n, n) result: n * n * 4 bytes
        calls.append(a.shape[0])
        return a @ b

    result = measure_scaling({"outer": outer, "sum": lambda a, b: a.sum()}, [8, 16, 32], _inputs, memory=["outer"])
    assert result.lengths == (8, 16, 32) and set(result.times) == {"outer", "sum"}
    assert all(t > 0 for ts in result.times.values() for t in ts)
    assert list(result.memory) == ["outer"] and result.memory["outer"] == [8 * 8 * 4, 16 * 16 * 4, 32 * 32 * 4]
    assert result.exponent("outer", "memory") == pytest.approx(2.0)
    assert result.exponent("outer", "memory", last=None) == pytest.approx(2.0)
    assert calls.count(32) == 1 + 3 + 1  # one warm-up, 3 timed runs, one run for the memory
    assert calls.count(8) == 5


def test_measure_scaling_stops_an_implementation_above_its_length():
    result = measure_scaling(
        {"quadratic": lambda a, b: a @ b, "linear": lambda a, b: a + 1}, [8, 16, 32], _inputs, up_to={"quadratic": 16},
        timed=["quadratic", "linear"], memory=True, repeats=1, warmup=0,
    )  # fmt: skip
    assert math.isnan(result.times["quadratic"][2]) and math.isnan(result.memory["quadratic"][2])
    assert result.measured("quadratic", "memory") == ([8, 16], [8 * 8 * 4.0, 16 * 16 * 4.0])
    assert result.measured("linear")[0] == [8, 16, 32]
    only_memory = measure_scaling({"f": lambda a, b: a + 1}, [8], _inputs, timed=False, memory=True)
    assert only_memory.times == {} and only_memory.memory["f"] == [8 * 4 * 4]


def test_scaling_exponent_fits_a_power_law_over_the_points_asked_for():
    s = Scaling((1, 2, 4, 8), {"a": [1.0, 2.0, 8.0, 64.0]}, {})
    assert s.exponent("a") == pytest.approx(3.0)  # the two largest: 8 -> 64
    assert s.exponent("a", last=3) == pytest.approx(2.5)  # 2 -> 8 -> 64: a straight line in log-log
    assert 1 < s.exponent("a", last=None) < 3
    shuffled = Scaling((8, 1, 4, 2), {"a": [64.0, 1.0, 8.0, 2.0]}, {})  # measured in any order: the same fit
    assert shuffled.exponent("a") == pytest.approx(3.0) and shuffled.exponent("a", last=3) == pytest.approx(2.5)
    with pytest.raises(ValueError, match=r"^Scaling.exponent: the memory at N = 2 must be a finite number > 0, got 0"):
        Scaling((1, 2), {}, {"a": [4.0, 0.0]}).exponent("a", "memory")  # was "math domain error"


def test_measure_scaling_and_scaling_reject_bad_arguments():
    with pytest.raises(ValueError, match="fns must hold at least 1 implementation"):
        measure_scaling({}, [8], _inputs)
    with pytest.raises(ValueError, match="memory must be among"):
        measure_scaling({"f": lambda a, b: a}, [8], _inputs, memory=["g"])
    with pytest.raises(ValueError, match="up_to must be among"):
        measure_scaling({"f": lambda a, b: a}, [8], _inputs, up_to={"g": 8})
    with pytest.raises(TypeError, match="lengths\\[0\\] must be an int"):
        measure_scaling({"f": lambda a, b: a}, [8.0], _inputs)
    s = Scaling((1, 2), {"a": [1.0, math.nan]}, {})
    with pytest.raises(ValueError, match="be measured at two lengths at least"):
        s.exponent("a")
    with pytest.raises(ValueError, match="metric must be one of"):
        s.exponent("a", "flops")
    with pytest.raises(ValueError, match="name must be"):
        s.exponent("b")


def test_matmul_flops_counts_two_per_multiply_add_and_nothing_elementwise():
    a, b = torch.ones(3, 4), torch.ones(4, 5)
    assert matmul_flops(lambda: a @ b) == 2 * 3 * 4 * 5
    assert matmul_flops(lambda: (a.exp() / 2).sum()) == 0
    with pytest.raises(TypeError, match="fn must be a zero-argument callable"):
        matmul_flops(3)
