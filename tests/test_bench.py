"""attnbook.lab.bench: the shared measuring routine returns complete, JSON-ready records (no timing asserted)."""

import json
import math

import pytest
import torch

from attnbook.lab import bench

TINY = dict(batch=1, heads=2, head_dim=8, repeats=1, warmup=0)


@pytest.fixture(scope="module")
def result():
    return bench.run_benchmark([8, 16], progress=False, **TINY)


def test_every_mechanism_of_the_registry_is_benchmarked_with_its_causal_form():
    from attnbook import mechanisms

    both = set(mechanisms.names(causal=True, bidirectional=True))  # a case per form; a causal-only one is its name
    wanted = set(mechanisms.MECHANISMS) | {f"{n}_causal" for n in both}
    assert wanted | {"softmax_literal"} == set(bench.CASES)


def test_one_complete_record_per_mechanism_and_length(result):
    recs = result["records"]
    assert {(r["mechanism"], r["N"]) for r in recs} == {(m, n) for m in bench.CASES for n in (8, 16)}
    assert len(recs) == len(bench.CASES) * 2
    for r in recs:
        assert r["skipped"] is None
        for key in ("forward_s", "forward_backward_s"):
            assert r[key] > 0 and len(r[key.replace("_s", "_samples_s")]) == 1, (r["mechanism"], key)
        for key in ("forward_peak_bytes", "forward_backward_peak_bytes"):
            assert isinstance(r[key], int) and r[key] >= 0, (r["mechanism"], key)
        name = r["mechanism"].removesuffix("_causal")
        causal_only = name in bench.MECHANISMS and not bench.MECHANISMS[name].bidirectional
        assert r["causal"] == (r["mechanism"].endswith("_causal") or causal_only)


def test_result_is_plain_json_with_its_configuration(result):
    again = json.loads(json.dumps(result))
    assert again == result
    c = result["config"]
    assert c["lengths"] == [8, 16] and c["dtype"] == "float32" and c["device"] == "cpu"
    assert set(c["mechanisms"]) == set(bench.CASES)


def test_backward_and_memory_can_be_left_out():
    r = bench.run_benchmark([8], mechanisms=["linear"], backward=False, memory=False, progress=False, **TINY)
    (rec,) = r["records"]
    assert rec["forward_s"] > 0
    assert rec["forward_backward_s"] is None and rec["forward_peak_bytes"] is None


def test_the_quadratic_mechanism_is_skipped_above_the_matrix_cap():
    r = bench.run_benchmark(
        [8, 64], mechanisms=["softmax_literal", "linear"], max_matrix_bytes=2 * 8 * 8 * 4, progress=False, **TINY
    )
    by = {(x["mechanism"], x["N"]): x for x in r["records"]}
    assert by[("softmax_literal", 8)]["skipped"] is None
    assert "max_matrix_bytes" in by[("softmax_literal", 64)]["skipped"]
    assert by[("softmax_literal", 64)]["forward_s"] is None
    assert by[("linear", 64)]["skipped"] is None and by[("linear", 64)]["forward_s"] > 0


def test_memory_reflects_the_n_by_n_matrix_of_the_literal_form():
    """Peak memory is counted, not timed, so it is exact: the literal form's grows ~N^2, linear's ~N."""
    r = bench.run_benchmark([64, 256], mechanisms=["softmax_literal", "linear"], backward=False, progress=False, **TINY)
    ns, mem = bench.series(r, "forward_peak_bytes")
    assert bench.loglog_slope(ns, mem["softmax_literal"]) > 1.7
    assert bench.loglog_slope(ns, mem["linear"]) < 1.2
    assert mem["softmax_literal"][1] >= 2 * 2 * 256 * 256 * 4  # B H N N float32 scores (and softmax)


def test_progress_goes_to_stderr(capsys):
    bench.run_benchmark([8], mechanisms=["linear"], progress=True, **TINY)
    captured = capsys.readouterr()
    assert "[bench]" in captured.err and "N=8" in captured.err
    assert captured.out == ""


def test_unknown_mechanism_or_bad_lengths_raise_value_error():
    with pytest.raises(ValueError, match=r"mechanisms\[0\] must be one of 'softmax', .*got 'nope'"):
        bench.run_benchmark([8], mechanisms=["nope"], progress=False)
    with pytest.raises(ValueError, match=r"lengths\[0\] must be an int >= 1, got 0"):
        bench.run_benchmark([0], progress=False)


def test_series_fills_skipped_points_with_nan():
    result = {
        "config": {"lengths": [8, 16]},
        "records": [{"mechanism": "a", "N": 8, "forward_s": 1.0}, {"mechanism": "a", "N": 16, "forward_s": None}],
    }
    ns, s = bench.series(result, "forward_s")
    assert ns == [8, 16] and s["a"][0] == 1.0 and math.isnan(s["a"][1])
    with pytest.raises(ValueError, match="metric must be one of .*got 'missing'"):
        bench.series(result, "missing")


@pytest.mark.parametrize("p", [1.0, 2.0, 0.5])
def test_loglog_slope_recovers_a_power_law(p):
    ns = [16, 32, 64, 128]
    assert bench.loglog_slope(ns, [3.0 * n**p for n in ns]) == pytest.approx(p)


def test_loglog_slope_ignores_nan_and_needs_two_points():
    assert bench.loglog_slope([1, 2, 4], [1.0, float("nan"), 16.0]) == pytest.approx(2.0)
    with pytest.raises(ValueError, match="two positive points"):
        bench.loglog_slope([1, 2], [1.0, float("nan")])


def test_memory_floor_counts_q_k_v_and_the_output_once():
    floor = bench.memory_floor_seconds(4, 16, 65536, 64, torch.bfloat16, bandwidth=1e12)
    assert floor == pytest.approx(4 * 4 * 16 * 65536 * 64 * 2 / 1e12)


def test_copy_bandwidth_is_a_positive_rate():
    assert bench.copy_bandwidth("cpu", nbytes=2**16, repeats=1) > 0


def test_environment_names_device_versions_and_date():
    env = bench.environment("cpu")
    for key in ("device", "device_name", "torch", "attnbook", "python", "date_utc"):
        assert env[key], key


def test_bench_all_cli_writes_json_labelled_with_device_versions_and_date(tmp_path):
    import pathlib
    import subprocess
    import sys

    root = pathlib.Path(__file__).resolve().parents[1]
    out = tmp_path / "r.json"
    subprocess.run(
        [
            sys.executable,
            str(root / "benchmarks" / "bench_all.py"),
            "--force",  # a test machine is busy: the load gate is tested in test_recording.py
            "--lengths",
            "8",
            "16",
            "--repeats",
            "1",
            "--heads",
            "2",
            "--head-dim",
            "8",
            "--mechanisms",
            "softmax",
            "linear",
            "--out",
            str(out),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    report = json.loads(out.read_text())
    env = report["environment"]
    assert env["device"] == "cpu" and env["device_name"] and env["date_utc"]
    assert env["torch"] == torch.__version__ and env["attnbook"] and env["python"]
    assert report["config"]["dtype"] == "float32" and report["config"]["lengths"] == [8, 16]
    assert {r["mechanism"] for r in report["records"]} == {"softmax", "linear"}
