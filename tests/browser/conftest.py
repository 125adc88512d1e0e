"""Browser tests: Debian's chromium, driven by Playwright, against the built site served on 127.0.0.1."""

import functools
import http.server
import os
import pathlib
import threading

import pytest
from pages import PAGES, SCREENSHOTS, WINDOW, PageVisit

# The book to test: this repository, or another book folder (a built scratch book) named by ATTNBOOK_BOOK_ROOT.
ROOT = pathlib.Path(os.environ.get("ATTNBOOK_BOOK_ROOT") or pathlib.Path(__file__).resolve().parents[2])
SITE = ROOT / "_build" / "html"


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="session")
def site_url():
    """Serve _build/html on a free port of 127.0.0.1 for the session."""
    if not (SITE / "index.html").exists():
        pytest.fail("no built site in _build/html: run `make book` (or `make test`) first")
    handler = functools.partial(_QuietHandler, directory=str(SITE))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


# The screenshots are a record to look at, not a check: JPEG (PNG took twice as long), in tiles of at most
# TILE_PX (a JPEG is at most 65,535 px tall; the API page is about 87,000 px), each capture with its own time
# limit (the API page's one full-page PNG ran past Playwright's default 30 s on a slower CI host).
TILE_PX = 30_000
SCREENSHOT_TIMEOUT_MS = 180_000


def screenshot(page, name: str) -> tuple[list[pathlib.Path], int]:
    """The whole page at the window's width: SCREENSHOTS/name.jpg, or name-1.jpg, name-2.jpg, ... when taller
    than TILE_PX. Returns the files written and the page's height in px."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    for old in [*SCREENSHOTS.glob(f"{name}.*"), *SCREENSHOTS.glob(f"{name}-*.jpg")]:  # an earlier run's record
        old.unlink()
    width, height = page.evaluate("[document.documentElement.scrollWidth, document.documentElement.scrollHeight]")
    tops = range(0, height, TILE_PX)
    paths = [SCREENSHOTS / (f"{name}.jpg" if len(tops) == 1 else f"{name}-{i + 1}.jpg") for i in range(len(tops))]
    shot = {"type": "jpeg", "quality": 90, "full_page": True, "timeout": SCREENSHOT_TIMEOUT_MS}
    for path, top in zip(paths, tops, strict=True):
        clip = {"x": 0, "y": top, "width": width, "height": min(TILE_PX, height - top)}
        page.screenshot(path=str(path), clip=clip, **shot)
    return paths, height


# One load per page for the whole session (pytest groups the tests of every module by page); tests that need
# the page as first loaded (folds closed) open a fresh one.
@pytest.fixture(scope="session", params=PAGES)
def visit(request, browser, site_url):
    context = browser.new_context(viewport=WINDOW)
    page = context.new_page()
    v = PageVisit(page, f"{site_url}/{request.param}.html")
    v.name = request.param
    v.screenshots, v.screenshot_height = screenshot(page, pathlib.Path(request.param).name)
    yield v
    context.close()
