"""Build the front-end environments the browser suite runs Jupyter from, under _build/frontend-envs/.

- ``lab``: JupyterLab 4 and Notebook 7 (one server serves both) with ipywidgets 8 (requirements-lab.txt);
- ``classic``: the classic notebook 6.5 with ipywidgets 7.7.1, Colab's version, and whatever
  widgetsnbextension pip resolves for it (requirements-classic.txt).

Each is a fresh virtual environment with its requirements file, the CPU torch (``TORCH``, default
``torch==2.13.0``: ``pip install`` of that pin, once, into ``_build/frontend-envs/torch``, which both
environments put on their path with a ``.pth`` file, so that nothing pulls a CUDA build and the largest
install happens once) and attnbook built from this checkout as a wheel (not editable: the suite tests what a
student installs). An environment is rebuilt only when its requirements, the torch pin or the Python version
change (a stamp records them); attnbook is reinstalled whenever the package's files change. The torch
install and both environments build in parallel, without byte-compiling (modules compile when imported).

Usage: python tests/frontend/envs.py [--no-package] [lab] [classic]      (run by `make frontend`)
       python tests/frontend/envs.py --share-torch VENV     (the shared torch for another venv, if built)

``--no-package`` builds the environments and the shared torch only, with any Python of the same version
(`make test` runs it beside the setup of .venv, which builds the package wheel later).
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import shutil
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
HERE = pathlib.Path(__file__).resolve().parent
BASE = ROOT / "_build" / "frontend-envs"
TORCH = os.environ.get("TORCH", "torch==2.13.0")
ENVS = {"lab": HERE / "requirements-lab.txt", "classic": HERE / "requirements-classic.txt"}
# JupyterLab and Notebook 7 would otherwise ask, in a toast over the notebook, to fetch news from the network.
REPORTED = {
    "lab": ("jupyterlab", "notebook", "ipywidgets", "jupyterlab_widgets", "torch"),
    "classic": ("notebook", "ipywidgets", "widgetsnbextension", "torch"),
}
LAB_OVERRIDES = {"@jupyterlab/apputils-extension:notification": {"fetchNews": "false", "checkForUpdates": False}}


def env_dir(name: str) -> pathlib.Path:
    return BASE / name


def python(name: str) -> pathlib.Path:
    return env_dir(name) / "bin" / "python"


def _digest(*parts: bytes) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part)
        h.update(b"\0")
    return h.hexdigest()


TORCH_DIR = BASE / "torch"


def torch_key() -> str:
    return _digest(TORCH.encode(), sys.version.encode())


def env_key(name: str) -> str:
    """What the environment depends on: its requirements, the torch pin, the Python that builds it."""
    return _digest(ENVS[name].read_bytes(), torch_key().encode())


def package_key() -> str:
    """The checkout's package: every file under src/ and the project metadata."""
    files = sorted(p for p in (ROOT / "src").rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    return _digest(
        (ROOT / "pyproject.toml").read_bytes(), *(str(p.relative_to(ROOT)).encode() + p.read_bytes() for p in files)
    )


def _quiet_pip(py: pathlib.Path, *args: str) -> list[str]:
    # --no-compile: byte-compiling torch and Jupyter took most of the build; modules compile when imported
    return [str(py), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-compile", *args]


def package_source(into: pathlib.Path) -> pathlib.Path:
    """A private copy of what building the package reads (pyproject.toml, README.md, src/), so that a build
    here never writes into the checkout (setuptools writes build/ and *.egg-info where it builds), while
    `make test` runs this beside other targets that build or import the package."""
    shutil.rmtree(into, ignore_errors=True)
    into.mkdir(parents=True)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, into / name)
    junk = shutil.ignore_patterns("__pycache__", "*.egg-info", "build")
    shutil.copytree(ROOT / "src", into / "src", ignore=junk)
    return into


def build_wheel() -> pathlib.Path:
    out = BASE / "wheel"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    source = package_source(BASE / "source")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(out),
            str(source),
        ],
        check=True,
        stderr=subprocess.DEVNULL if os.environ.get("CI") is None else None,
    )
    (wheel,) = out.glob("attnbook-*.whl")
    return wheel


def _create(name: str) -> subprocess.Popen:
    """Start building environment ``name`` from scratch (a shell pipeline, so the two can run at once)."""
    target = env_dir(name)
    shutil.rmtree(target, ignore_errors=True)
    py = target / "bin" / "python"
    return _run_in_background(name, [sys.executable, "-m", "venv", str(target)], _quiet_pip(py, "-r", str(ENVS[name])))


def _create_torch() -> subprocess.Popen:
    shutil.rmtree(TORCH_DIR, ignore_errors=True)
    return _run_in_background("torch", _quiet_pip(pathlib.Path(sys.executable), "--target", str(TORCH_DIR), TORCH))


def _run_in_background(name: str, *steps: list[str]) -> subprocess.Popen:
    script = " && ".join(" ".join(f"'{a}'" for a in step) for step in steps)
    log = open(BASE / f"{name}.log", "w")  # noqa: SIM115 - the child holds it; closed when we exit
    return subprocess.Popen(["bash", "-c", script], stdout=log, stderr=subprocess.STDOUT)


def torch_ready() -> bool:
    """Whether TORCH_DIR holds the ``TORCH`` pin installed for this Python."""
    stamp = TORCH_DIR / ".stamp"
    return stamp.exists() and stamp.read_text() == torch_key()


def share_torch(venv: pathlib.Path) -> None:
    """Put the shared CPU torch of TORCH_DIR on the path of the virtual environment ``venv`` (a .pth file)."""
    (site,) = (venv / "lib").glob("python3*/site-packages")
    (site / "attnbook-frontend-torch.pth").write_text(f"{TORCH_DIR}\n")


def _finish(name: str) -> None:
    py = python(name)
    share_torch(env_dir(name))
    if name == "lab":  # settings overrides of the environment's JupyterLab (and Notebook 7)
        for app in ("lab", "notebook"):
            settings = env_dir(name) / "share" / "jupyter" / app / "settings"
            settings.mkdir(parents=True, exist_ok=True)
            (settings / "overrides.json").write_text(json.dumps(LAB_OVERRIDES, indent=2))
    (env_dir(name) / ".stamp").write_text(env_key(name))
    report = f"import importlib.metadata as m; print({{p: m.version(p) for p in {REPORTED[name]!r}}})"
    versions = subprocess.run([str(py), "-c", report], check=True, capture_output=True, text=True).stdout.strip()
    print(f"{name}: {versions}", flush=True)


def _marked(name: str, key: str) -> bool:
    mark = env_dir(name) / ".attnbook"
    return mark.exists() and mark.read_text() == key


def ensure(names: list[str], *, package: bool = True) -> None:
    BASE.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    building = {}
    if not torch_ready():
        print(f"torch: pip install {TORCH} into {TORCH_DIR}", flush=True)
        building["torch"] = _create_torch()
    for name in names:
        stamp = env_dir(name) / ".stamp"
        if python(name).exists() and stamp.exists() and stamp.read_text() == env_key(name):
            print(f"{name}: up to date ({env_dir(name)})", flush=True)
            continue
        print(f"{name}: building from {ENVS[name].name} and {TORCH}", flush=True)
        building[name] = _create(name)
    for name, proc in building.items():
        if proc.wait() != 0:
            raise SystemExit(f"building {name} failed; see {BASE / (name + '.log')}")
        if name == "torch":
            (TORCH_DIR / ".stamp").write_text(torch_key())
    for name in building:
        if name != "torch":
            _finish(name)
    key = package_key()
    stale = [name for name in names if package and not _marked(name, key)]
    if stale:
        wheel = build_wheel()
        for name in stale:
            subprocess.run(_quiet_pip(python(name), "--no-deps", "--force-reinstall", str(wheel)), check=True)
            (env_dir(name) / ".attnbook").write_text(key)
            print(f"{name}: attnbook installed from {wheel.name}", flush=True)
    print(f"front-end environments ready in {time.perf_counter() - started:.0f} s", flush=True)


if __name__ == "__main__":
    args = sys.argv[1:]
    if args[:1] == ["--share-torch"]:  # python envs.py --share-torch VENV: exit 1 when there is none to share
        if len(args) != 2:
            raise SystemExit("usage: envs.py --share-torch VENV")
        if not torch_ready():
            print(f"no shared {TORCH} in {TORCH_DIR} for this Python", flush=True)
            raise SystemExit(1)
        share_torch(pathlib.Path(args[1]))
        print(f"{args[1]}: {TORCH} from {TORCH_DIR}", flush=True)
        raise SystemExit(0)
    names = [a for a in args if a != "--no-package"]
    unknown = sorted(set(names) - set(ENVS))
    if unknown:
        raise SystemExit(f"unknown front-end environment(s) {unknown}: choose from {sorted(ENVS)}")
    ensure(names or list(ENVS), package="--no-package" not in args)
