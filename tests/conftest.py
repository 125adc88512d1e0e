import os
import pathlib

import pytest
import torch

import attnbook

if os.environ.get("ATTNBOOK_TEST_INSTALLED") == "1":
    # `make wheel-test`: the tests must exercise the installed wheel, not the checkout's src/.
    _here = pathlib.Path(attnbook.__file__).resolve()
    _src = pathlib.Path(__file__).resolve().parents[1] / "src"
    if _src in _here.parents:
        raise RuntimeError(f"ATTNBOOK_TEST_INSTALLED=1 but attnbook was imported from the checkout: {_here}")


@pytest.fixture(autouse=True)
def _seed():
    """Every test starts from the same random state."""
    torch.manual_seed(0)
