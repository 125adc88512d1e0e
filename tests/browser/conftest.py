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


# One load per page for the whole session (pytest groups the tests of every module by page); tests that need
# the page as first loaded (folds closed) open a fresh one.
@pytest.fixture(scope="session", params=PAGES)
def visit(request, browser, site_url):
    context = browser.new_context(viewport=WINDOW)
    page = context.new_page()
    v = PageVisit(page, f"{site_url}/{request.param}.html")
    v.name = request.param
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / f"{pathlib.Path(request.param).name}.png"), full_page=True)
    yield v
    context.close()
