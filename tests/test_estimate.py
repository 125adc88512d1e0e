"""benchmarks/estimate_chapters.py, the per-chapter cost estimate, on cheap inputs: the counter's FLOPs, bytes,
kernels and modelled time; SDPA counted as one fused kernel; the training stand-in's weighting by steps and
evaluations; the sizes read from a chapter's cells; the chapter list of _toc.yml; the command on a tiny chapter."""

import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def _load():
    spec = importlib.util.spec_from_file_location(
        "bench_estimate_chapters", ROOT / "benchmarks" / "estimate_chapters.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


est = _load()
META = torch.device("meta")


def test_a_matmul_counts_its_flops_bytes_one_kernel_and_the_roofline_time():
    """(m, k) @ (k, n) in float32: 2 m k n FLOPs, its three matrices' bytes, one kernel; views launch nothing; each
    card's time is max(launch, FLOPs / (peak * efficiency), bytes / (bandwidth * efficiency))."""
    m, k, n = 256, 512, 1024
    a, b = torch.empty(m, k, device=META), torch.empty(k, n, device=META)
    meter = est.Meter()
    with meter:
        a.t().view(k, m)  # views: no kernel
        a @ b
    t = meter.totals
    flops, moved = 2 * m * k * n, 4 * (m * k + k * n + m * n)
    assert (t.flops, t.bytes, t.launches) == (flops, moved, 1)
    for key, card in est.CARDS.items():
        expected = max(card.launch_s, flops / (card.peak(torch.float32) * 0.5), moved / (card.bandwidth * 0.7))
        assert t.card_s[key] == pytest.approx(expected)
    with meter, meter.scaled(3):  # weighted
        a @ b
    assert meter.totals.launches == 4 and meter.totals.flops == 4 * flops


def test_half_precision_uses_the_tensor_core_rate_and_float64_the_float64_rate():
    """The same large matmul is 8x quicker in float16 than in float32 on a T4, and 32x slower in float64."""
    times = {}
    for dtype in (torch.float16, torch.float32, torch.float64):
        a = torch.empty(4096, 4096, device=META, dtype=dtype)
        meter = est.Meter()
        with meter:
            a @ a
        times[dtype] = meter.totals.card_s["T4"]
    assert times[torch.float32] / times[torch.float16] == pytest.approx(65 / 8.1, rel=0.01)
    assert times[torch.float64] / times[torch.float32] == pytest.approx(8.1 / 0.25, rel=0.01)


def test_sdpa_on_meta_counts_as_one_fused_kernel():
    """Under the stand-ins SDPA on meta tensors is one kernel of 4 B H N M D FLOPs (half when causal) forward and
    twice that backward, with no N x M matrix among its bytes (torch's meta dispatch would take the math path)."""
    B, H, N, D = 2, 4, 1024, 64
    q, k, v = (torch.empty(B, H, N, D, device=META, requires_grad=True) for _ in range(3))
    for causal, share in ((False, 1), (True, 0.5)):
        meter = est.Meter()
        with est.instrumented(est.Stand(meter, cpu=False)), meter:
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
            forward = meter.totals.copy()
            torch.autograd.grad(out, (q, k, v), torch.empty_like(out))
        assert forward.launches == 1 and forward.flops == share * 4 * B * H * N * N * D
        assert forward.bytes < B * H * N * N * 4  # q, k, v, the output and the log-sum-exp only
        assert meter.totals.flops - forward.flops == share * 8 * B * H * N * N * D


def test_the_training_stand_in_weights_one_step_by_the_steps_and_one_evaluation_by_the_evaluations():
    """training.fit replaced: one step counted times ``steps``, one evaluation times ``1 + steps // every`` (+1 when
    the last step is not a multiple), so a fit of 10 steps evaluated every 3 counts 10 steps and 5 evaluations."""
    from attnbook.lab import training

    def fit(steps, every):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
        x, y = torch.randn(4, 8), torch.randn(4, 2)
        meter = est.Meter()

        def evaluate(step, seconds):
            with torch.no_grad():
                model(torch.randn(32, 8)).sum()

        with est.instrumented(est.Stand(meter, cpu=False)), meter:
            training.fit(model, lambda s: (x, y), lambda m, b: torch.nn.functional.mse_loss(m(b[0]), b[1]),
                         steps=steps, optim=training.Optim(1e-3, clip=1.0), evaluate=evaluate, eval_every=every,
                         device=torch.device("cpu"))  # fmt: skip
        return meter.totals.launches

    one, two = fit(1, 1), fit(2, 2)  # 1 step + 2 evaluations; 2 steps + 2 evaluations
    step = two - one
    evaluation = (one - step) / 2
    assert step > 0 and evaluation > 0
    assert fit(10, 3) == pytest.approx(10 * step + 5 * evaluation)


def test_sizes_are_read_from_the_cells_picks_and_literals(tmp_path):
    """Every form of config.pick in a chapter: a tuple unpacked, one element of a tuple, a keyword argument, an
    expression; literal assignments and keywords too; --set replaces a pick."""
    nbformat = pytest.importorskip("nbformat")  # the book's tooling, absent from the wheel's venv
    from nbformat.v4 import new_code_cell, new_notebook

    cells = [
        "B, H, N, D = config.pick(small=(1, 2, 3, 4), full=(4, 8, 512, 64))",
        "n_mem, d_mem = config.pick(small=1024, full=8192), 64",
        "live = claims.compare(spec, setup, seeds=config.pick(small=2, full=3))",
        "DTYPE = config.pick(small=torch.float32, full=torch.float16)\nlengths = config.pick(small=[1], "
        "full=[2**i for i in range(3, 6)])\nx = f(repeats=5)",
    ]
    nb = new_notebook(cells=[new_code_cell(c, id=f"c{i}") for i, c in enumerate(cells)])
    path = tmp_path / "09_x.ipynb"
    nbformat.write(nb, path)
    book = est.Notebook(path)
    assert [book.full("c0", n) for n in "BHND"] == [4, 8, 512, 64]
    assert (book.full("c1", "n_mem"), book.full("c1", "d_mem")) == (8192, 64)
    assert book.full("c2", "seeds") == 3 and book.full("c3", "DTYPE") is torch.float16
    assert book.full("c3", "lengths") == [8, 16, 32] and book.full("c3", "repeats") == 5
    assert book.full_or("c3", "n_long", 1024) == 1024 and not book.passes_device("c2")
    assert book.sizes()["c0/B, H, N, D"] == "(4, 8, 512, 64)"
    with pytest.raises(KeyError, match="sets no 'T'"):
        book.full("c0", "T")
    other = est.Notebook(path, {("c2", "seeds"): "1", ("c2", "device"): "device"})
    assert other.full("c2", "seeds") == 1 and other.passes_device("c2")


def test_the_chapters_come_from_the_table_of_contents():
    """The chapter list is _toc.yml's book/NN_name entries, in order, as the Makefile reads them; every one exists."""
    chapters = est.toc_chapters(ROOT / "_toc.yml")
    names = [p.name for p in chapters]
    assert names[:7] == [
        "01_softmax_attention.ipynb",
        "02_linear_attention.ipynb",
        "03_flow_attention.ipynb",
        "04_mobile_attention.ipynb",
        "05_mixture_of_heads.ipynb",
        "06_head_to_head.ipynb",
        "07_language_model.ipynb",
    ]
    assert all(p.exists() for p in chapters) and names == sorted(names)


def test_the_command_estimates_a_tiny_chapter_and_writes_json(tmp_path, capsys):
    """On a one-cell stand-in for chapter 1 (its cost cell at tiny sizes): the table, the JSON report with the
    assumptions, the sizes read, the counted work and each card's time above the fixed charge."""
    nbformat = pytest.importorskip("nbformat")  # the book's tooling, absent from the wheel's venv
    from nbformat.v4 import new_code_cell, new_notebook

    (tmp_path / "book").mkdir()
    cell = new_code_cell("lengths = config.pick(small=[8], full=[32, 64])\nB, H, D = 1, 2, 8", id="cost-code")
    nbformat.write(new_notebook(cells=[cell]), tmp_path / "book" / "01_tiny.ipynb")
    toc = tmp_path / "_toc.yml"
    toc.write_text("format: jb-book\nroot: book/index\nchapters:\n  - file: book/01_tiny\n  - file: book/notation\n")
    out = tmp_path / "estimate.json"
    assert est.main(["--toc", str(toc), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "01_tiny" in printed and "H200 s" in printed
    report = json.loads(out.read_text())
    assert set(report["assumptions"]["cards"]) == {"T4", "H200"}
    (chapter,) = report["chapters"]
    assert chapter["chapter"] == "01_tiny.ipynb" and chapter["errors"] == []
    assert chapter["sizes"] == {"cost-code/lengths": "[32, 64]"}
    (work,) = chapter["workloads"]
    # literal and SDPA at N = 32 and 64, 1 warm-up + 3 repeats each, and the literal's memory once
    assert work["launches"] > 0 and work["gflop"] > 0 and work["where"] == "gpu"
    for card in ("T4", "H200"):
        assert chapter["seconds"][card] == pytest.approx(chapter["fixed_s"] + work["seconds"][card])
        assert work["seconds"][card] > 0 and chapter["within_budget"][card]


def test_the_full_sizes_do_not_leak_into_the_process(monkeypatch):
    """The estimate picks full sizes only while it runs: importing it or running it leaves ATTNBOOK_FAST as it was."""
    from attnbook import config

    monkeypatch.setenv("ATTNBOOK_FAST", "1")
    with est.full_sizes():
        assert not config.fast()
    assert config.fast()
    monkeypatch.delenv("ATTNBOOK_FAST")
    with est.full_sizes():
        assert not config.fast()
    assert "ATTNBOOK_FAST" not in os.environ
