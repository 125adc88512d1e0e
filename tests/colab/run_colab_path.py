"""The Colab path, taken the way Colab takes it.

1. A fresh virtual environment that looks like a Colab runtime before the chapter runs: the CPU torch,
   ipywidgets 7.7.1 (Colab's), numpy, matplotlib and a kernel already installed (torch from the front-end
   environments' shared copy when ``make frontend-envs`` has installed the same pin, put on the path with a
   ``.pth`` file, else pip-installed here).
2. The chapter's own install cell is executed there, as on Colab (``google.colab`` present), with the
   repository URL pointed at this checkout.
3. Colab's torch, numpy, matplotlib and ipywidgets must be untouched by that install.
4. The widget tests (the viz tests that build widgets) run against ipywidgets 7.7.1, and the chapter runs top
   to bottom with nbmake.

Usage: python tests/colab/run_colab_path.py [CHAPTER.ipynb]   (run by `make colab`, part of `make test`)
"""

from __future__ import annotations

import fcntl
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys

import yaml

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "frontend"))
import envs  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
VENV = ROOT / "_build" / "colab-venv"
PY = VENV / "bin" / "python"
# Colab's ipywidgets pin is kept in one place, the classic front-end environment of the browser suite
# (tests/frontend/requirements-classic.txt), so that the two Colab-like environments cannot drift apart.
IPYWIDGETS = next(
    line.strip()
    for line in (ROOT / "tests" / "frontend" / "requirements-classic.txt").read_text().splitlines()
    if line.startswith("ipywidgets==")
)
COLAB_PREINSTALLED = ["torch==2.13.0", IPYWIDGETS, "numpy", "matplotlib", "ipykernel"]
TEST_TOOLS = ["pytest", "pytest-xdist", "nbmake", "hypothesis"]
KEPT = ["torch", "numpy", "matplotlib", "ipywidgets"]


def run(*args: str, **kwargs) -> subprocess.CompletedProcess:
    print("+", " ".join(args), flush=True)
    return subprocess.run(args, check=True, **kwargs)


def versions() -> dict[str, str]:
    code = "import importlib.metadata as m, json, sys; print(json.dumps({p: m.version(p) for p in sys.argv[1:]}))"
    out = subprocess.run([str(PY), "-c", code, *KEPT], check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def default_chapter() -> pathlib.Path:
    """The first chapter in the table of contents that builds an ipywidgets explorer."""
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    for entry in toc["chapters"]:
        path = ROOT / f"{entry['file']}.ipynb"
        if path.exists() and "_explorer(" in path.read_text():
            return path
    return ROOT / "book" / "01_softmax_attention.ipynb"


def install_cell(chapter: pathlib.Path) -> str:
    cell = json.loads(chapter.read_text())["cells"][0]
    source = "".join(cell["source"])
    config = yaml.safe_load((ROOT / "_config.yml").read_text())["repository"]
    remote = f"git+{config['url']}@{config['branch']}"
    if remote not in source:
        raise SystemExit(f"{chapter.name}: the install cell does not install {remote}")
    # A private copy of the checkout's package source (pip builds a local folder in place).
    # The folder's name has no hyphen: pip reads a local folder named like "colab-source" as a project
    # "colab" at version "source" and keeps the wheel it builds in its persistent cache under that folder's
    # URL, so a later run on the same machine installed an old attnbook (CI failed on a stale viz.flow).
    return source.replace(remote, envs.package_source(ROOT / "_build" / "colab_source").as_uri())


def stale_files() -> list[str]:
    """The package's files that differ between the checkout's src/ and what the install cell installed."""
    code = "import attnbook, pathlib; print(pathlib.Path(attnbook.__file__).parent)"
    installed = pathlib.Path(
        subprocess.run([str(PY), "-c", code], check=True, capture_output=True, text=True, cwd=str(VENV)).stdout.strip()
    )
    source = ROOT / "src" / "attnbook"
    names = {p.relative_to(source) for p in source.rglob("*") if p.is_file() and "__pycache__" not in p.parts}
    names |= {p.relative_to(installed) for p in installed.rglob("*") if p.is_file() and "__pycache__" not in p.parts}

    def same(name: pathlib.Path) -> bool:
        a, b = source / name, installed / name
        return a.is_file() and b.is_file() and a.read_bytes() == b.read_bytes()

    return sorted(str(n) for n in names if not same(n))


def main() -> None:
    chapter = pathlib.Path(sys.argv[1]).resolve() if len(sys.argv) > 1 else default_chapter()
    shutil.rmtree(VENV, ignore_errors=True)
    run(sys.executable, "-m", "venv", str(VENV))
    preinstalled = COLAB_PREINSTALLED
    # the front-end environments' CPU torch (make frontend-envs), when it is this pin, on the path like theirs
    if envs.TORCH == COLAB_PREINSTALLED[0] and envs.torch_ready():
        envs.share_torch(VENV)
        preinstalled = [p for p in COLAB_PREINSTALLED if not p.startswith("torch")]
    # --no-compile: byte-compiling torch took most of the install; modules compile when imported
    run(str(PY), "-m", "pip", "install", "--quiet", "--no-compile", *preinstalled, *TEST_TOOLS)
    before = versions()
    print("Colab-like runtime:", before, flush=True)

    # The install cell, executed as Colab executes it: google.colab is importable.
    prelude = "import sys, types; sys.modules['google.colab'] = types.ModuleType('google.colab')\n"
    # no wheel cache either: what is installed is built from this checkout, now
    run(str(PY), "-c", prelude + install_cell(chapter), env={**os.environ, "PIP_NO_CACHE_DIR": "1"})
    stale = stale_files()
    if stale:
        raise SystemExit(f"the install cell installed an attnbook that is not this checkout's: {stale[:10]} differ")
    after = versions()
    if after != before:
        raise SystemExit(f"installing attnbook changed Colab's packages: {before} -> {after}")
    print("install cell kept Colab's packages:", after, flush=True)

    # one thread: the chapter and the two test workers below share two cores with the rest of `make test`
    env = {**os.environ, "ATTNBOOK_FAST": "1", "MPLBACKEND": "Agg", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    # Run outside the checkout's src/ so that the installed package is the one imported.
    run(
        str(PY),
        "-c",
        "import attnbook, ipywidgets; print(attnbook.__file__, ipywidgets.__version__)",
        cwd=str(VENV),
        env=env,
    )
    # the viz tests that build widgets (the figure-only modules' tests do not depend on ipywidgets)
    widget_tests = sorted(
        str(p) for p in (ROOT / "tests").glob("test_viz_*.py") if re.search(r"widget|slider|explorer", p.read_text())
    )
    run(str(PY), "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2", *widget_tests, cwd=str(ROOT), env=env)
    # then the chapter, under make notebooks' lock (Makefile: KERNELS_LOCK): kernels started at the same moment
    # can race for a TCP port. The widget tests run first, while `make notebooks` may still hold the lock.
    with open(ROOT / "_build" / ".kernels.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        run(
            str(PY),
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "--nbmake",
            f"--nbmake-timeout={os.environ.get('NBMAKE_TIMEOUT', '120')}",  # the Makefile's NBMAKE_TIMEOUT
            str(chapter),
            cwd=str(ROOT),
            env=env,
        )


if __name__ == "__main__":
    main()
