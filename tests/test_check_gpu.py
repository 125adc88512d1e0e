"""attnbook.lab.check_gpu at tiny sizes on the CPU: the report is complete and the check fails when it should."""

import dataclasses
import json

import pytest
import torch

from attnbook import mechanisms
from attnbook.lab import check_gpu

TINY = check_gpu.TINY.accuracy
quiet = dict(log=lambda *a: None)


def test_tolerance_table_covers_every_dtype_with_both_tolerances():
    assert set(check_gpu.TOLERANCES) == set(check_gpu.DTYPES.values())
    for dtype, tol in check_gpu.TOLERANCES.items():
        assert set(tol) == {"rtol", "atol"} and all(0 < x < 0.1 for x in tol.values()), dtype
    f32, bf16, f16 = (check_gpu.TOLERANCES[d] for d in (torch.float32, torch.bfloat16, torch.float16))
    assert f32["rtol"] < f16["rtol"] < bf16["rtol"]  # looser as the precision drops


def test_every_mechanism_of_the_registry_has_an_accuracy_case_and_one_per_causal_form():
    both = mechanisms.names(causal=True, bidirectional=True)  # a case per form; a causal-only one is its name
    expected = set(mechanisms.MECHANISMS) | {f"{n}_causal" for n in both}
    assert set(check_gpu.CASES) == expected
    assert {"softmax", "linear_causal", "flow_causal", "mobile", "moh", "moh_causal"} <= expected


@pytest.mark.parametrize("dtype", list(check_gpu.DTYPES.values()), ids=str)
def test_every_mechanism_passes_in_every_dtype(dtype):
    records = check_gpu.check_accuracy("cpu", dtypes=[dtype], sizes=TINY, compile_backend=None, **quiet)
    assert len(records) == len(check_gpu.CASES)
    for r in records:
        assert r["passed"], r
        inputs = mechanisms.get(r["mechanism"].removesuffix("_causal")).inputs  # every input's gradient checked
        assert len(r["grads"]) == {"x": 1, "qkv": 3, "qkvg": 4}[inputs]
        assert r["output"]["finite"] and 0 <= r["worst"] <= 1


def test_compiled_path_is_checked_and_labelled():
    records = check_gpu.check_accuracy(
        "cpu", dtypes=[torch.float32], mechanisms=["linear"], sizes=TINY, compile_backend="eager", **quiet
    )
    assert [r["compile"] for r in records] == ["eager", "compiled:eager"]
    assert all(r["passed"] for r in records), records


def _replace(monkeypatch, name, function):
    """Put ``function`` in the registry in place of the mechanism ``name``'s fast function."""
    entry = mechanisms.MECHANISMS[name]
    monkeypatch.setitem(mechanisms.MECHANISMS, name, dataclasses.replace(entry, function=function))


def _off_by(factor):
    real = mechanisms.MECHANISMS["linear"].function

    def wrong(q, k, v, **kw):
        return real(q, k, v, **kw) * factor

    return wrong


@pytest.mark.parametrize(
    "dtype,factor",
    [(torch.float32, 1.01), (torch.bfloat16, 1.15), (torch.float16, 1.03)],
    ids=["float32-1pct", "bfloat16-15pct", "float16-3pct"],
)
def test_an_implementation_off_by_a_little_is_marked_failed(monkeypatch, dtype, factor):
    _replace(monkeypatch, "linear", _off_by(factor))
    records = check_gpu.check_accuracy(
        "cpu", dtypes=[dtype], mechanisms=["linear", "flow"], sizes=TINY, compile_backend=None, **quiet
    )
    by = {r["mechanism"]: r for r in records}
    assert not by["linear"]["passed"] and by["linear"]["worst"] > 1
    assert by["flow"]["passed"]  # the others are unaffected


def test_a_wrong_gradient_alone_is_caught(monkeypatch):
    real = mechanisms.MECHANISMS["linear"].function

    class ScaleGrad(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, g):
            return g * 1.05

    _replace(monkeypatch, "linear", lambda q, k, v, **kw: real(ScaleGrad.apply(q), k, v, **kw))
    (r,) = check_gpu.check_accuracy(
        "cpu", dtypes=[torch.float32], mechanisms=["linear"], sizes=TINY, compile_backend=None, **quiet
    )
    assert r["output"]["worst"] <= 1 and r["grads"][0]["worst"] > 1 and not r["passed"]


def test_nan_or_a_crash_is_a_failure_not_the_end_of_the_run(monkeypatch):
    _replace(monkeypatch, "flow", lambda q, k, v, **kw: (q + k + v) * float("nan"))

    def boom(*a, **k):
        raise RuntimeError("kernel exploded")

    _replace(monkeypatch, "mobile", boom)
    records = check_gpu.check_accuracy(
        "cpu",
        dtypes=[torch.float32],
        mechanisms=["flow", "mobile", "linear"],
        sizes=TINY,
        compile_backend=None,
        **quiet,
    )
    by = {r["mechanism"]: r for r in records}
    assert not by["flow"]["passed"] and not by["flow"]["output"]["finite"]
    assert not by["mobile"]["passed"] and "kernel exploded" in by["mobile"]["error"]
    assert by["linear"]["passed"]


def test_no_forward_synchronises_host_and_device():
    records = check_gpu.check_sync("cpu", sizes=TINY, **quiet)
    assert {r["mechanism"] for r in records} == set(check_gpu.CASES)
    assert all(r["passed"] and r["sync_ops"] == [] for r in records), records


def test_a_forward_that_reads_a_device_value_is_caught(monkeypatch):
    real = mechanisms.MECHANISMS["flow"].function

    def syncing(q, k, v, **kw):
        if (q > 0).any():  # bool(tensor): the host waits for the device
            q = q * 1.0
        return real(q, k, v, **kw) * q.abs().max().item() / q.abs().max().item()

    _replace(monkeypatch, "flow", syncing)
    records = check_gpu.check_sync("cpu", mechanisms=["flow", "linear"], sizes=TINY, **quiet)
    by = {r["mechanism"]: r for r in records}
    assert not by["flow"]["passed"] and "_local_scalar_dense" in by["flow"]["sync_ops"]
    assert by["linear"]["passed"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message shown without CUDA")
def test_without_cuda_it_exits_with_a_clear_message(capsys):
    assert check_gpu.main([]) == 2
    err = capsys.readouterr().err
    assert "no CUDA device" in err and "--device cpu --tiny" in err


def test_cpu_needs_tiny(capsys):
    assert check_gpu.main(["--device", "cpu"]) == 2
    assert "--tiny" in capsys.readouterr().err


@pytest.fixture(scope="module")
def tiny_report(tmp_path_factory):
    out = tmp_path_factory.mktemp("report") / "r.json"
    code = check_gpu.main(
        [
            "--device",
            "cpu",
            "--tiny",
            "--dtypes",
            "float32",
            "--compile-backend",
            "eager",
            "--budget-s",
            "0",
            "--out",
            str(out),
        ]
    )
    return code, json.loads(out.read_text())


def test_tiny_run_writes_one_complete_report(tiny_report):
    code, report = tiny_report
    assert code == 0 and report["passed"] is True
    assert report["sections_done"] == ["accuracy", "sync", "targets", "benchmark", "accuracy_compiled"]
    assert report["environment"]["device"] == "cpu" and report["environment"]["torch"] == torch.__version__
    assert set(report["tolerances"]) == {"float32", "bfloat16", "float16"}
    assert len(report["accuracy"]) == len(check_gpu.CASES) and report["accuracy_failed"] == []
    # a zero budget: every compiled case is reported as not run, which is not a failure
    assert all(r["skipped"] == "time budget" for r in report["accuracy_compiled"])
    assert len(report["accuracy_not_run"]) == len(check_gpu.CASES)
    assert report["sync_failed"] == []
    b = report["benchmark"]
    assert {r["mechanism"] for r in b["records"]} >= set(check_gpu.CASES)
    assert b["config"]["dtype"] == "bfloat16"


def test_tiny_report_has_every_target_figure(tiny_report):
    t = tiny_report[1]["targets"]
    assert t["copy_bandwidth_bytes_per_s"] > 0
    long = t["non_causal"]
    assert long["memory_floor_s"] > 0 and {"sdpa", "linear_eager", "flow_eager"} <= set(long["impls"])
    for name in ("linear", "flow"):
        assert set(long[name]) == {"best", "speedup_vs_sdpa", "times_memory_floor", "met_10x_sdpa", "met_3x_floor"}
    assert isinstance(t["causal"]["met_faster_than_sdpa_causal"], bool)
    assert t["causal"]["N"] == check_gpu.TINY.n_causal


def test_a_failed_check_gives_exit_status_one(monkeypatch, tmp_path):
    _replace(monkeypatch, "linear", _off_by(1.5))
    out = tmp_path / "r.json"
    code = check_gpu.main(
        [
            "--device",
            "cpu",
            "--tiny",
            "--dtypes",
            "float32",
            "--compile-backend",
            "none",
            "--no-benchmark",
            "--no-targets",
            "--out",
            str(out),
        ]
    )
    report = json.loads(out.read_text())
    assert code == 1 and report["passed"] is False
    assert report["accuracy_failed"] == ["linear/float32/eager", "linear_causal/float32/eager"]


def test_on_the_cpu_the_compiled_checks_default_to_the_eager_backend(tmp_path):
    out = tmp_path / "r.json"
    code = check_gpu.main(
        [
            "--device",
            "cpu",
            "--tiny",
            "--dtypes",
            "float32",
            "--no-benchmark",
            "--no-targets",
            "--budget-s",
            "0",
            "--out",
            str(out),
        ]
    )
    report = json.loads(out.read_text())
    assert code == 0 and report["compile_backend"] == "eager"
    assert {r["compile"] for r in report["accuracy_compiled"]} == {"compiled:eager"}
