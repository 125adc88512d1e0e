"""The native step of :class:`attnbook.decoding.StaticDecoder`: ``_step.c`` compiled on first use, called by ctypes.

A token of chapter 7's model is a few tens of microseconds of arithmetic, done as about fifty torch operations
of a few microseconds' dispatch each. ``_step.c`` does the whole step (every block and the head) in one C call
on the decoder's own buffers, which stay at fixed addresses. It is compiled once per process with the host's C
compiler (``$CC``, else Python's, else ``cc``; the one ``torch.compile`` needs on the CPU too) into a private
temporary directory, and loaded with :mod:`ctypes`. Where there is no compiler, or ``ATTNBOOK_NATIVE=0`` is set,
:func:`library` returns None with the reason in :func:`unavailable`, and the decoder keeps its torch operations.
"""

from __future__ import annotations

import ctypes
import os
import shlex
import shutil
import subprocess
import sysconfig
import tempfile
from importlib import resources
from pathlib import Path

__all__ = ["Layer", "Model", "library", "unavailable"]


class Layer(ctypes.Structure):
    """``layer_t`` of ``_step.c``: one block's sizes, weights (stored (in, out)) and state."""

    _fields_ = [
        *[(name, ctypes.c_int64) for name in ("kind", "H", "D", "hidden", "phi", "competition", "allocation")],
        *[(name, ctypes.c_int64) for name in ("shared", "picked", "experts")],
        *[(name, ctypes.c_float) for name in ("eps", "ln1_eps", "ln2_eps", "scale")],
        *[
            (name, ctypes.c_void_p)
            for name in ("ln1_w", "ln1_b", "wqkv", "bqkv", "wo", "bo", "ln2_w", "ln2_b", "w1", "b1", "w2", "b2")
        ],
        *[(name, ctypes.c_void_p) for name in ("wg", "wg0", "wg1")],
        *[(name, ctypes.c_void_p) for name in ("s0", "s1", "s2", "s3")],
    ]


class Model(ctypes.Structure):
    """``model_t`` of ``_step.c``: the model's sizes, embeddings, final norm, head, scratch and layers."""

    _fields_ = [
        *[(name, ctypes.c_int64) for name in ("B", "C", "V", "L", "capacity")],
        ("lnf_eps", ctypes.c_float),
        ("unused", ctypes.c_float),
        *[(name, ctypes.c_void_p) for name in ("embed", "positions", "lnf_w", "lnf_b", "head", "work")],
        ("layers", ctypes.POINTER(Layer)),
    ]


# -fassociative-math (with the two flags it needs) lets the compiler vectorise the sums (dot products, norms);
# it changes their rounding, not their treatment of NaN or infinity, which -ffast-math would.
_FLAGS = ["-O3", "-shared", "-fPIC", "-fno-math-errno", "-fassociative-math", "-fno-signed-zeros"]
_FLAGS += ["-fno-trapping-math"]
_NATIVE_ARCH = "-march=native"  # tried first; dropped if the compiler refuses it

_state: dict[str, object] = {}


def _compiler() -> list[str]:
    for candidate in (os.environ.get("CC"), sysconfig.get_config_var("CC"), "cc", "gcc", "clang"):
        if candidate:
            command = shlex.split(str(candidate))
            if command and shutil.which(command[0]):
                return command
    return []


def _build() -> tuple[ctypes.CDLL | None, str]:
    if os.environ.get("ATTNBOOK_NATIVE", "1") == "0":
        return None, "ATTNBOOK_NATIVE=0 is set"
    compiler = _compiler()
    if not compiler:
        return None, "no C compiler was found ($CC, Python's, cc, gcc, clang)"
    source = resources.files("attnbook").joinpath("_step.c").read_text()
    folder = Path(tempfile.mkdtemp(prefix="attnbook-native-"))
    try:
        (folder / "_step.c").write_text(source)
        target = folder / "_step.so"
        errors = ""
        for arch in ([_NATIVE_ARCH], []):
            command = [*compiler, *_FLAGS, *arch, "-o", str(target), str(folder / "_step.c"), "-lm"]
            try:
                done = subprocess.run(command, capture_output=True, text=True, timeout=120)
            except (OSError, subprocess.SubprocessError) as error:
                errors = str(error)
                continue
            if done.returncode == 0:
                try:
                    lib = ctypes.CDLL(str(target))  # mapped: the file may go
                except OSError as error:  # e.g. a temporary folder mounted noexec
                    return None, f"the compiled _step.c could not be loaded: {error}"
                lib.attnbook_step.restype = ctypes.c_int64
                lib.attnbook_step.argtypes = [ctypes.POINTER(Model), ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p]
                lib.attnbook_work_size.restype = ctypes.c_int64
                lib.attnbook_work_size.argtypes = [ctypes.POINTER(Model)]
                return lib, ""
            lines = done.stderr.strip().splitlines()  # its first error, else its last line, else its status
            errors = next((x for x in lines if "error" in x), lines[-1] if lines else f"exit status {done.returncode}")
        return None, f"{shlex.join(compiler)} could not compile _step.c: {errors}"
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def library() -> ctypes.CDLL | None:
    """The compiled ``_step.c`` (compiled on the first call in this process), or None (see :func:`unavailable`)."""
    if "lib" not in _state:
        _state["lib"], _state["why"] = _build()
    return _state["lib"]  # type: ignore[return-value]


def unavailable() -> str:
    """Why :func:`library` returned None ('' when it did not)."""
    library()
    return str(_state["why"])
