import os
import pathlib
import shutil

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


# The browser tests (tests/browser: the website; tests/frontend: Jupyter front-ends) drive Debian's chromium:
# Playwright cannot download its own browsers here. Its background networking is off (the machine's network is
# closed and nothing may reach another host anyway). Used only where pytest-playwright is installed.
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


@pytest.fixture(scope="session")
def browser_type_launch_args(browser_type_launch_args):
    return {
        **browser_type_launch_args,
        "executable_path": CHROMIUM,
        "args": [
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
        ],
    }
