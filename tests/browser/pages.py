"""What the browser tests visit: the pages of the table of contents, the window, one page load."""

import json
import os
import pathlib
import re
import urllib.parse

import yaml

# The book to test: this repository, or another book folder (a built scratch book) named by ATTNBOOK_BOOK_ROOT.
ROOT = pathlib.Path(os.environ.get("ATTNBOOK_BOOK_ROOT") or pathlib.Path(__file__).resolve().parents[2])
CONFIG = yaml.safe_load((ROOT / "_config.yml").read_text())
TOC = yaml.safe_load((ROOT / "_toc.yml").read_text())
PAGES = [TOC["root"]] + [entry["file"] for entry in TOC["chapters"]]
CHAPTERS = [p for p in PAGES if (ROOT / f"{p}.ipynb").exists()]
SCREENSHOTS = ROOT / "_build" / "screenshots"
WINDOW = {"width": 1300, "height": 900}  # the reader's window for every layout check


def has_live_widget(page: str) -> bool:
    """True when a chapter builds an ipywidgets explorer (it must then offer a kernel-free fallback)."""
    path = ROOT / f"{page}.ipynb"
    if not path.exists():
        return False
    cells = json.loads(path.read_text())["cells"]
    return any(c["cell_type"] == "code" and re.search(r"\w+_explorer\(", "".join(c["source"])) for c in cells)


class PageVisit:
    """Load one page, recording console errors, failed requests and every requested host."""

    def __init__(self, page, url):
        self.page = page
        self.url = url
        self.errors, self.failed, self.hosts = [], [], set()
        page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: self.errors.append(str(e)))
        page.on("requestfailed", lambda r: self.failed.append(f"{r.url} ({r.failure})"))
        page.on("request", lambda r: self.hosts.add(urllib.parse.urlsplit(r.url).hostname or "data"))
        page.goto(url, wait_until="networkidle")
        # MathJax typesets asynchronously; its startup promise resolves after the first typeset
        if page.locator(".math").count():
            page.wait_for_function("() => window.MathJax && MathJax.startup && MathJax.startup.promise", timeout=30_000)
            page.evaluate("() => MathJax.startup.promise.then(() => true)")
        page.wait_for_load_state("networkidle")
