"""Peer implementations that the benchmarks compare against, built on request into a cache directory.

fast-transformers (Katharopoulos et al.'s library, ``pytorch-fast-transformers==0.4.0`` on PyPI) ships a
hand-written C++ kernel for causal linear attention (``fast_transformers.causal_product``). It builds from its
sdist with the C++ compiler (about 6 minutes on 2 cores) against the torch that is installed; its setup script
also tries to build CUDA kernels when it finds ``nvcc``, so the build runs with PATH limited to the virtual
environment and the system directories and without CUDA_HOME.

    python benchmarks/peers.py --build      # build into the cache (once)
    python benchmarks/peers.py              # say whether it is there

Nothing here runs in CI or in the tests; a benchmark that needs the peer skips the comparison with a message
when it is not built.
"""

from __future__ import annotations

import argparse
import importlib
import os
import subprocess
import sys
from pathlib import Path

import torch

FAST_TRANSFORMERS = "pytorch-fast-transformers==0.4.0"


def cache_dir() -> Path:
    """``$ATTNBOOK_CACHE`` or ``~/.cache/attnbook``, per torch version (the extension is built against it)."""
    root = Path(os.environ.get("ATTNBOOK_CACHE", Path.home() / ".cache" / "attnbook"))
    return root / "peers" / f"fast-transformers-0.4.0-torch{torch.__version__}"


def build_fast_transformers(target: Path | None = None) -> Path:
    """Build fast-transformers from its sdist into ``target`` (default :func:`cache_dir`); returns it."""
    target = cache_dir() if target is None else target
    target.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUDA")}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), "/usr/bin", "/bin"])  # no nvcc
    env["FORCE_CUDA"] = "0"
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--no-build-isolation",
        "--no-deps",
        "--no-binary",
        ":all:",
        "--target",
        str(target),
        FAST_TRANSFORMERS,
    ]
    print("building", FAST_TRANSFORMERS, "into", target, "(several minutes)", file=sys.stderr)
    subprocess.run(cmd, env=env, check=True)
    return target


def import_causal_product():
    """fast-transformers' ``causal_dot_product`` (the C++ kernel) or None when it has not been built."""
    target = cache_dir()
    if not (target / "fast_transformers").is_dir():
        return None
    if str(target) not in sys.path:
        sys.path.insert(0, str(target))
    try:
        return importlib.import_module("fast_transformers.causal_product").causal_dot_product
    except ImportError as exc:
        print(f"fast-transformers in {target} does not import ({exc}); rebuild with --build", file=sys.stderr)
        return None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build", action="store_true", help="build fast-transformers into the cache")
    args = parser.parse_args(argv)
    if args.build:
        build_fast_transformers()
    fn = import_causal_product()
    print(f"fast-transformers causal_dot_product: {'available' if fn else 'not built'} ({cache_dir()})")
    return 0 if fn else 1


if __name__ == "__main__":
    sys.exit(main())
