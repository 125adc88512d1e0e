"""A stand-in for torchvision, so that timm (installed from PyPI with --no-deps) imports beside the CPU build of
torch: PyPI's torchvision wheels are CUDA builds that do not load beside it. timm imports torchvision's
transforms, datasets and FrozenBatchNorm2d at import time for its data pipeline; building a model never calls
them. Every attribute of the stand-in is an inert placeholder class."""

from __future__ import annotations

import sys
import types


class _Placeholder(type):
    """A class whose every attribute (``InterpolationMode.BILINEAR``) is another placeholder class."""

    def __getattr__(cls, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Placeholder(name, (), {})


class _Module(types.ModuleType):
    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Placeholder(name, (), {})


def install() -> None:
    """Put the stand-in into ``sys.modules`` unless a real torchvision is importable."""
    try:
        import torchvision  # noqa: F401

        return
    except Exception:  # absent, or a CUDA build that fails to load beside the CPU torch
        for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
            del sys.modules[name]
    names = ["torchvision", "torchvision.ops", "torchvision.ops.misc", "torchvision.transforms",
             "torchvision.transforms.functional", "torchvision.datasets", "torchvision.utils",
             "torchvision.models", "torchvision.models.feature_extraction"]  # fmt: skip
    for name in names:
        module = _Module(name)
        module.__path__ = []  # a package: its submodules import
        sys.modules[name] = module
    for name in names:
        parent, _, child = name.rpartition(".")
        if parent:
            setattr(sys.modules[parent], child, sys.modules[name])
