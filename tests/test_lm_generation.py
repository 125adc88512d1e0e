"""attnbook.lab.generation: the generation benchmark measures what it says (counts exactly, times something)."""

import math

import pytest

from attnbook.lab import generation
from attnbook.lab.lm import Setup

TINY = Setup(dim=16, n_heads=4, n_layers=2)


@pytest.fixture(scope="module")
def result():
    four = ["softmax", "linear", "flow", "moh"]  # a cache and a recurrent state, each twice (chapter 7's four)
    return generation.measure(TINY, mechanism_names=four, positions=[4, 8, 64], repeats=3, warmup=1, progress=False)


def test_every_causal_mechanism_is_measured_at_every_position(result):
    assert result["config"]["mechanisms"] == ["softmax", "linear", "flow", "moh"]
    assert len(result["records"]) == 4 * 3
    for r in result["records"]:
        assert r["median_s"] > 0 and r["min_s"] <= r["median_s"] and len(r["samples_s"]) == 3
    assert result["environment"]["device"] == "cpu" and "device_name" in result["environment"]


def test_every_position_is_measured_where_it_was_asked_for(result):
    """The calls at t = 4 go past 8 (3 timed + 1 warm-up + 1 memory call); t = 8 is reached again by a prefill."""
    ts, _ = generation.series(result)
    assert ts == [4, 8, 64]


def test_state_memory_is_exact_the_cache_grows_with_t_and_the_recurrent_state_does_not(result):
    ts, held = generation.series(result, "state_bytes")
    C, layers = TINY.dim, TINY.n_layers
    for name in ("softmax", "moh"):
        assert held[name] == [2 * layers * C * t * 4 for t in ts]  # keys and values, float32
        assert generation.slope(result, name, "state_bytes", 4, 64) == pytest.approx(1.0)
    for name in ("linear", "flow"):
        assert len(set(held[name])) == 1 and held[name][0] > 0
        assert generation.slope(result, name, "state_bytes", 4, 64) == pytest.approx(0.0, abs=1e-12)


def test_ratio_and_slope_read_the_series(result):
    ts, med = generation.series(result)
    assert generation.ratio(result, "softmax", "linear", 64) == med["softmax"][-1] / med["linear"][-1]
    assert math.isfinite(generation.slope(result, "flow", lo=4, hi=64))
    with pytest.raises(ValueError, match="two positive points"):
        generation.slope(result, "flow", lo=64, hi=64)


def test_measure_refuses_an_empty_list_of_mechanisms():
    """mechanism_names=[] measured every causal mechanism (an empty list read as 'not given')."""
    with pytest.raises(ValueError, match=r"^measure: mechanism_names must hold at least 1 mechanism, got 0"):
        generation.measure(None, mechanism_names=[])  # refused before the setup is read


def test_nothing_to_measure_raises():
    with pytest.raises(ValueError, match="^measure: positions must hold at least 1 position, got 0 positions$"):
        generation.measure(TINY, positions=[], progress=False)
    with pytest.raises(ValueError, match="^measure: positions must be an int >= 1, got 0$"):
        generation.measure(TINY, positions=[0, 4], progress=False)
    with pytest.raises(TypeError, match="^measure: positions must be an int, got 2.5$"):
        generation.measure(TINY, positions=[2.5], progress=False)


def test_both_decoders_are_timed_in_one_run_and_counted_alike():
    """The teaching step and its compiled form (one dynamic graph: no recompilation as t grows), one run."""
    # one mechanism: each compiled step costs 25 s or more on a cold inductor cache (tests/test_compile.py compiles
    # every mechanism's step)
    both = generation.measure(TINY, mechanism_names=["linear"], positions=[4, 32], repeats=2, warmup=0,
                              decoders=("eager", "compiled"), burst=2, progress=False)  # fmt: skip
    assert {r["decoder"] for r in both["records"]} == {"eager", "compiled"} and len(both["records"]) == 2 * 2
    compiled = generation.series(both, "state_bytes", "compiled")[1]["linear"]
    assert compiled == generation.series(both, "state_bytes", "eager")[1]["linear"]
    assert generation.series(both, "median_s")[1] == generation.series(both, "median_s", "eager")[1]
    with pytest.raises(ValueError, match="decoder must be one of 'eager', 'compiled', got 'static'"):
        generation.series(both, decoder="static")


def test_cost_table_prints_every_decoder_and_mechanism_in_eighty_columns(result):
    table = generation.cost_table(result).splitlines()
    assert table[1].split() == ["t=4", "t=8", "t=64", "t=64", "(KiB)", "this"]
    rows = [line.split() for line in table[2:]]
    assert [r[0] for r in rows] == ["eager", "linear", "flow", "moh"] and rows[0][1] == "softmax"
    assert float(rows[0][-1]) == 1.0  # softmax over itself
    ts, held = generation.series(result, "state_bytes")
    assert float(rows[0][-2]) == round(held["softmax"][-1] / 1024, 1)
    assert max(map(len, table)) <= 80
    with pytest.raises(ValueError, match="at must be one of 4, 8, 64, got 5"):
        generation.cost_table(result, at=[5])
