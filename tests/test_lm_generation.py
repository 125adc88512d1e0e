"""attnbook.lab.generation: the generation benchmark measures what it says (counts exactly, times something)."""

import math

import pytest
import torch

from attnbook.lab import generation
from attnbook.lab.lm import Setup

TINY = Setup(dim=16, n_heads=4, n_layers=2)


@pytest.fixture(scope="module")
def result():
    return generation.measure(TINY, positions=[4, 8, 64], repeats=3, warmup=1, progress=False)


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


def test_nothing_to_measure_raises():
    with pytest.raises(ValueError, match="^measure: positions must hold at least 1 position, got 0 positions$"):
        generation.measure(TINY, positions=[], progress=False)
    with pytest.raises(ValueError, match="^measure: positions must be an int >= 1, got 0$"):
        generation.measure(TINY, positions=[0, 4], progress=False)
    with pytest.raises(TypeError, match="^measure: positions must be an int, got 2.5$"):
        generation.measure(TINY, positions=[2.5], progress=False)


def test_both_decoders_are_timed_in_one_run_and_counted_alike():
    both = generation.measure(TINY, positions=[4, 32], repeats=2, warmup=0, decoders=("static", "eager"),
                              burst=2, progress=False)  # fmt: skip
    assert {r["decoder"] for r in both["records"]} == {"static", "eager"} and len(both["records"]) == 2 * 4 * 2
    for name in ("softmax", "linear"):
        static = generation.series(both, "state_bytes", "static")[1][name]
        assert static == generation.series(both, "state_bytes", "eager")[1][name]
    assert generation.series(both, "median_s")[1] == generation.series(both, "median_s", "static")[1]
    with pytest.raises(ValueError, match="decoder must be one of 'static', 'eager', got 'compiled'"):
        generation.series(both, decoder="compiled")


def test_the_static_decoder_is_native_where_it_can_be_and_torch_is_its_operations():
    """ "static" times what generate uses (on the CPU in float32 the native step, for every causal mechanism),
    "torch" the same decoder's torch operations: same state, counted alike."""
    runs = generation.measure(TINY, positions=[4], repeats=2, warmup=0, decoders=("static", "torch"), burst=1,
                              progress=False)  # fmt: skip
    assert {r["decoder"] for r in runs["records"]} == {"static", "torch"}
    for name in ("softmax", "linear", "flow", "moh"):
        assert (
            generation.series(runs, "state_bytes", "static")[1][name]
            == generation.series(runs, "state_bytes", "torch")[1][name]
        )
    text = torch.randint(256, (64,), dtype=torch.uint8)
    model = TINY.model("linear").eval()
    static = generation._Generation(model, text, torch.device("cpu"), "static", 16)
    plain = generation._Generation(model, text, torch.device("cpu"), "torch", 16)
    assert static.fast.native and not plain.fast.native


def test_cost_table_prints_every_decoder_and_mechanism_in_eighty_columns(result):
    table = generation.cost_table(result).splitlines()
    assert table[1].split() == ["t=4", "t=8", "t=64", "t=64", "(KiB)", "this"]
    rows = [line.split() for line in table[2:]]
    assert [r[0] for r in rows] == ["static", "linear", "flow", "moh"] and rows[0][1] == "softmax"
    assert float(rows[0][-1]) == 1.0  # softmax over itself
    ts, held = generation.series(result, "state_bytes")
    assert float(rows[0][-2]) == round(held["softmax"][-1] / 1024, 1)
    assert max(map(len, table)) <= 80
    with pytest.raises(ValueError, match="at must be one of 4, 8, 64, got 5"):
        generation.cost_table(result, at=[5])


def _decoding_recording(result):
    ts, med = generation.series(result)
    floors = {n: {str(t): {"floor_s": y / 4, "bytes": 2e6} for t, y in zip(ts, med[n], strict=True)} for n in med}
    prefill = {"prompt": 64, "linear": {"prefill_s": 0.01, "static_steps_s": 0.2, "steps_over_prefill": 20.0,
                                         "max_logit_difference": 1e-6}}  # fmt: skip
    summary = {"ratio_at_t_max": {d: {"linear": 3.0, "flow": 2.0} for d in ("static", "eager")}, "crossover_t": 8}
    static = {**result, "records": [{**r, "decoder": "static"} for r in result["records"]],
              "config": {**result["config"], "decoders": ["static"]}}  # fmt: skip
    return {**static, "floors": {"floor_s": floors}, "prefill": prefill, "summary": summary}


def test_floor_table_and_the_decoding_summary_read_a_bench_decoding_recording(result):
    recording = _decoding_recording(result)
    floors = generation.floor_table(recording)
    assert set(floors) == {"softmax", "linear", "flow", "moh"}
    assert all(f["times"] == pytest.approx(4.0) for f in floors.values())
    text = generation.decoding_summary(recording)
    assert "median (static), against its floor" in text and " 4.0x" in text and "from t* = 8 on" in text
    assert "(20.0x)" in text and "|" not in text  # no compiled step recorded
    at_floors = floors["softmax"]["floor_s"] / floors["linear"]["floor_s"]
    assert f"softmax / linear: 3.0x static (3.0x eager); {at_floors:.1f}x at the floors" in text
    assert max(map(len, text.splitlines())) <= 80


@pytest.mark.parametrize("other", ["compiled", "torch"])
def test_the_decoding_summary_shows_another_decoder_and_the_eager_prefill_when_recorded(result, other):
    """A recording with the static decoder's torch operations or a compiled decoder: its step beside the static
    one (here half as quick: 8.0x the floor), the ratios; the prompt against the eager steps too (what generate
    took in 0.1). The torch operations are preferred to the compiled step where both are there."""
    recording = _decoding_recording(result)
    slower = [{**r, "decoder": other, "median_s": r["median_s"] * 2} for r in recording["records"]]
    recording = {**recording, "records": recording["records"] + slower,
                 "config": {**recording["config"], "decoders": ["static", other, "compiled"]}}  # fmt: skip
    recording["summary"]["ratio_at_t_max"][other] = {"linear": 5.0, "flow": 4.0}
    recording["prefill"]["linear"]["eager_steps_s"] = 0.5
    text = generation.decoding_summary(recording)
    assert f"median (static | {other})" in text and "4.0x |" in text and " 8.0x" in text
    ratios = "3.0x static (5.0x torch, 3.0x eager)" if other == "torch" else "3.0x static (3.0x eager)"
    assert ratios in text and "500 ms eager (50.0x)" in text
    assert max(map(len, text.splitlines())) <= 80


def test_crossover_is_the_first_position_from_which_softmax_stays_slower():
    def fake(softmax, linear):
        records = [
            {"decoder": "static", "mechanism": n, "t": t, "median_s": y}
            for n, ys in (("softmax", softmax), ("linear", linear))
            for t, y in zip((16, 256, 4096), ys, strict=True)
        ]
        return {"config": {"decoders": ["static"], "mechanisms": ["softmax", "linear"]}, "records": records}

    assert generation.crossover(fake([1, 3, 4], [2, 2, 2])) == 256
    assert generation.crossover(fake([3, 1, 4], [2, 2, 2])) == 4096  # slower at 16, but not from there on
    assert generation.crossover(fake([1, 1, 1], [2, 2, 2])) is None


@pytest.mark.slow
def test_the_compiled_step_is_measured_beside_the_static_one():
    """decoders=("static", "compiled"): both timed on the CPU; the compiled step's peak memory is not counted
    (the CPU count runs under a dispatch mode, which a compiled step cannot run under), its state is."""
    both = generation.measure(
        TINY, mechanism_names=["linear"], positions=[4, 8], repeats=2, warmup=1, decoders=("static", "compiled"),
        progress=False,
    )  # fmt: skip
    records = {(r["decoder"], r["t"]): r for r in both["records"]}
    assert set(records) == {(d, t) for d in ("static", "compiled") for t in (4, 8)}
    for (decoder, _), r in records.items():
        assert r["median_s"] > 0 and r["state_bytes"] == records["static", 4]["state_bytes"]
        assert (r["step_peak_bytes"] is None) == (decoder == "compiled")
