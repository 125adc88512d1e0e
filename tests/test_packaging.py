"""What ``pip install attnbook`` gives a library user: torch as the only requirement, the book's pieces behind an
extra that says so when missing, one version, a license. Run against the installed package: in ``make test``
the wheel, installed into a fresh venv (``make wheel-test``)."""

import importlib
import importlib.metadata as metadata
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement

import attnbook

ROOT = Path(__file__).resolve().parents[1]


def requirements() -> list[Requirement]:
    return [Requirement(r) for r in metadata.requires("attnbook") or []]


def test_the_library_requires_torch_only():
    plain = [r for r in requirements() if r.marker is None]
    assert [r.name for r in plain] == ["torch"], plain
    assert str(plain[0].specifier) == ">=2.2"  # loose: an install keeps Colab's (or your) torch


def test_the_books_pieces_come_with_the_book_extra():
    extra = {r.name for r in requirements() if r.marker is not None and r.marker.evaluate({"extra": "book"})}
    assert extra == {"numpy", "matplotlib", "ipywidgets"}
    assert "book" in (metadata.metadata("attnbook").get_all("Provides-Extra") or [])


def test_importing_the_books_pieces_without_the_extra_says_which_extra(monkeypatch):
    real_find_spec = importlib.util.find_spec

    def find_spec(name, *args, **kwargs):
        return None if name == "matplotlib" else real_find_spec(name, *args, **kwargs)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    for module in [m for m in sys.modules if m == "attnbook.viz" or m.startswith("attnbook.viz.")]:
        monkeypatch.delitem(sys.modules, module)
    with pytest.raises(ImportError, match=r"attnbook.viz must have the packages of attnbook's 'book' extra .*"
                       r"pip install 'attnbook\[book\]'\), got no matplotlib"):  # fmt: skip
        importlib.import_module("attnbook.viz")


def test_the_library_imports_none_of_the_books_packages():
    """``import attnbook`` (and its registry, references, language model, decoder) loads no numpy-only,
    matplotlib or ipywidgets code of its own: a subprocess that forbids them can use the library."""
    import subprocess

    code = (
        "import builtins, sys\n"
        "real = builtins.__import__\n"
        "def guard(name, *a, **k):\n"
        "    if name.split('.')[0] in ('matplotlib', 'ipywidgets'):\n"
        "        raise ImportError('blocked: ' + name)\n"
        "    return real(name, *a, **k)\n"
        "builtins.__import__ = guard\n"
        "import torch, attnbook, attnbook.mechanisms, attnbook.reference, attnbook.lm, attnbook.decoding\n"
        "x = torch.randn(1, 5, 16)\n"
        "attnbook.mechanisms.MECHANISMS['flow'].module(16, 4)(x)\n"
        "print('ok')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.stdout.strip() == "ok", done.stderr


def test_one_version_read_from_the_metadata():
    assert attnbook.__version__ == metadata.version("attnbook")
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert attnbook.__version__ == project["version"]
    assert f"## {project['version']}" in (ROOT / "CHANGELOG.md").read_text()


def test_an_spdx_license_and_its_file_ship_with_the_package():
    meta = metadata.metadata("attnbook")
    assert meta.get("License-Expression") == "MIT"
    files = [str(f) for f in metadata.files("attnbook") or []]
    assert any(f.endswith("LICENSE") for f in files), files[:10]
