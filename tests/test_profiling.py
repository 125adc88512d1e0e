"""The measuring helpers used by the book and the benchmarks."""

import pytest
import torch

from attnbook.lab.profiling import compare, peak_memory


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
