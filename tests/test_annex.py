"""The speed annex (attnbook._fast): every path it holds gives the plain form's numbers, and the reference's, and
runs only where it was measured faster (one thread, no gradient); ``ATTNBOOK_PLAIN=1`` and ``config.set_plain`` turn
it off, and then it is not even imported.

The annex's paths are reached through the public functions, with the annex on (``config.set_plain(False)``,
whatever the environment says) and off (``config.set_plain(True)``)."""

import functools
import os
import subprocess
import sys

import pytest
import torch
from support import paths, qkv, tol

import attnbook
from attnbook import config, reference
from attnbook._fast import causal


@pytest.fixture
def annex():
    """Runs the test with the annex on, on one thread (its causal tiles run on one thread only)."""
    with paths(plain=False):
        yield


def both_paths(fn):
    """fn with the annex on and off: (annex result, plain result)."""
    results = []
    for plain in (False, True):
        config.set_plain(plain)
        try:
            results.append(fn())
        finally:
            config.set_plain(None)
    return results


@pytest.mark.parametrize(
    "rows, N, C, positions",
    [(6, 36, 3, 12), (6, 36, 3, 72), (6, 36, 3, 1000), (6, 37, 3, 12), (6, 37, 3, 1000), (1, 5, 5, 4), (7, 8, 4, 64)],
)
def test_tiles_cover_every_position_once_in_time_order(rows, N, C, positions):
    """Every (row, position) belongs to exactly one chunk of one tile; a tile of several rows spans whole
    rows; within a row the spans follow each other in time; no tile exceeds its positions but by one chunk."""
    seen = torch.zeros(rows, N, dtype=torch.int64)
    for r0, R, spans in causal._tiles(rows, N, C, positions):
        assert R == 1 or spans == [(0, N // C, C)], "several rows per tile only for whole rows of whole chunks"
        end = 0
        for s0, m, c in spans:
            assert s0 == end and c <= C and m >= 1
            assert R * m * c <= max(positions, C)
            seen[r0 : r0 + R, s0 : s0 + m * c] += 1
            end = s0 + m * c
        assert end == N
    assert (seen == 1).all()


LAYOUTS = [  # positions per tile
    pytest.param(3, id="one_chunk_per_tile"),  # tiles of one row, one chunk: the carry alone
    pytest.param(10, id="chunks_per_tile"),  # one row, several runs of chunks (the last run shorter)
    pytest.param(80, id="rows_per_tile"),  # several whole rows (N = 36), or one row a tile (N = 37)
    pytest.param(10_000, id="all_rows"),
]


@pytest.mark.parametrize("mask", [False, True], ids=["no_mask", "padded"])
@pytest.mark.parametrize("fmap", ["elu", "relu"])
@pytest.mark.parametrize("N", [36, 37], ids=["whole_chunks", "partial_chunk"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_causal_tiles_give_the_reference_and_the_plain_form(annex, monkeypatch, layout, N, fmap, mask):
    """Every tile layout, with padded keys: the float64 definition's outputs and the plain chunked form's."""
    monkeypatch.setattr(causal, "CPU_TILE", layout)
    B, H, D, Dv = 2, 3, 4, 5
    q, k, v = qkv(B, H, N, N, D, Dv, dtype=torch.float64)
    padding = None
    if mask:
        padding = torch.rand(B, N, generator=torch.Generator().manual_seed(1)) < 0.3
        padding[:, 0] = False
    kwargs = {"is_causal": True, "feature_map": fmap, "key_padding_mask": padding, "chunk_size": 3}
    expected = functools.partial(reference.linear_attention, is_causal=True, feature_map=fmap, key_padding_mask=padding)
    fast = functools.partial(attnbook.linear_attention, **kwargs)
    with torch.no_grad():
        out, plain = both_paths(lambda: fast(q, k, v))
    torch.testing.assert_close(out, expected(q, k, v), **tol(torch.float64))
    torch.testing.assert_close(out, plain, **tol(torch.float64))


def test_causal_takes_views(annex):
    """q, k, v as a layer makes them: a transposed view of (B, L, H, D)."""
    B, L, H, D = 2, 40, 3, 4
    x = torch.randn(B, L, H, 3 * D, dtype=torch.float64)
    q, k, v = (t.transpose(1, 2) for t in x.split(D, dim=-1))  # (B, H, L, D), non-contiguous
    with torch.no_grad():
        out = attnbook.linear_attention(q, k, v, is_causal=True, chunk_size=8)
    torch.testing.assert_close(out, reference.linear_attention(q, k, v, is_causal=True), **tol(torch.float64))


@pytest.mark.parametrize("B", [1, 2])
def test_causal_padding_of_one_sequence_with_whole_chunks(annex, B):
    """0.2.0 failed with "view size is not compatible" for a key_padding_mask, batch 1, two or more heads and a
    length that is a multiple of the chunk size: the padding's rows were a view of stride 0 over the heads."""
    q, k, v = qkv(B, 2, 64, 64, 8, 8, dtype=torch.float64)
    padding = torch.zeros(B, 64, dtype=torch.bool)
    padding[:, 50:] = True
    with torch.no_grad():
        out = attnbook.linear_attention(q, k, v, is_causal=True, key_padding_mask=padding, chunk_size=32)
    expected = reference.linear_attention(q, k, v, is_causal=True, key_padding_mask=padding)
    torch.testing.assert_close(out, expected, **tol(torch.float64))


def test_the_causal_tiles_run_on_one_thread_without_autograd_and_the_plain_form_else(annex, monkeypatch):
    """The tiles are laid out for one core and have no backward; with more threads, or when a gradient is needed,
    the plain form runs (bench_annex.py measured both less than 1.3 times faster)."""
    calls = []
    monkeypatch.setattr(causal, "forward", lambda *a, **k: calls.append(1) or a[-1])
    q, k, v = qkv(1, 2, 8, 8, 4, 4)
    threads = torch.get_num_threads()
    try:
        for n, grad, expected in ((1, False, 1), (2, False, 0), (1, True, 0)):
            torch.set_num_threads(n)
            calls.clear()
            with torch.set_grad_enabled(grad):
                out = attnbook.linear_attention(q, k.requires_grad_(grad), v, is_causal=True)
            assert len(calls) == expected, (n, grad)
            assert out.requires_grad == grad
    finally:
        torch.set_num_threads(threads)


def test_set_plain_wins_over_the_environment_and_none_gives_it_back(monkeypatch):
    monkeypatch.setenv("ATTNBOOK_PLAIN", "1")
    assert config.plain()
    config.set_plain(False)
    try:
        assert not config.plain()
    finally:
        config.set_plain(None)
    assert config.plain()
    monkeypatch.setenv("ATTNBOOK_PLAIN", "0")
    assert not config.plain()
    monkeypatch.setenv("ATTNBOOK_PLAIN", "sometimes")
    with pytest.raises(ValueError, match="ATTNBOOK_PLAIN must be one of '1', '0'"):
        config.plain()
    with pytest.raises(TypeError, match="enable must be True or False"):
        config.set_plain("yes")


def test_with_attnbook_plain_no_module_of_the_annex_is_imported():
    """Every mechanism, causal and not, with and without autograd, a layer and a generation: with
    ``ATTNBOOK_PLAIN=1`` no ``attnbook._fast`` module is imported; without it, the annex is used."""
    script = """
import sys, torch, attnbook
torch.set_num_threads(1)  # the causal tiles run on one thread
from attnbook.mechanisms import MECHANISMS
from attnbook.lm import DecoderLM
q, k, v = (torch.randn(2, 2, 70, 8, requires_grad=True) for _ in range(3))
for name, m in MECHANISMS.items():
    layer = m.module(16, 2)
    layer(torch.randn(2, 70, 16)).sum().backward()
    if m.inputs == "qkvg":  # causal only, with a gate
        m(*(x.requires_grad_() for x in m.example_inputs(2, 2, 70, 8))).sum().backward()
    elif m.function is not None:
        for causal in m.forms:
            m(q, k, v, is_causal=causal).sum().backward()
            with torch.no_grad():
                m(q, k, v, is_causal=causal)
DecoderLM("linear", dim=16, n_heads=2).generate(torch.randint(0, 256, (1, 5)), 3)
print(sorted(n for n in sys.modules if n.startswith("attnbook._fast")))
"""
    annex = "['attnbook._fast', 'attnbook._fast.causal']"
    for plain, expected in (("1", "[]"), ("0", annex)):
        env = {**os.environ, "ATTNBOOK_PLAIN": plain}
        done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip().startswith(expected), done.stdout


def test_the_tests_of_the_annex_pass_with_attnbook_plain():
    """``ATTNBOOK_PLAIN=1`` must leave every unit test passing. This file's tests are the ones that set the annex's
    state (one of them once failed only there), so they run again under it; the whole suite: ``ATTNBOOK_PLAIN=1
    make unit``."""
    this = "test_the_tests_of_the_annex_pass_with_attnbook_plain"
    env = {**os.environ, "ATTNBOOK_PLAIN": "1"}
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__, "-k", f"not {this}"]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert " passed" in done.stdout and "failed" not in done.stdout, done.stdout[-2000:]
