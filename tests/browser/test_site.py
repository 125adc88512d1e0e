"""The website as its readers meet it, page by page, in a real browser."""

import json
import pathlib
import re
import urllib.parse
import urllib.request

import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
CONFIG = yaml.safe_load((ROOT / "_config.yml").read_text())
TOC = yaml.safe_load((ROOT / "_toc.yml").read_text())
PAGES = [TOC["root"]] + [entry["file"] for entry in TOC["chapters"]]
CHAPTERS = [p for p in PAGES if (ROOT / f"{p}.ipynb").exists()]
SCREENSHOTS = ROOT / "_build" / "screenshots"

pytestmark = pytest.mark.browser


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


@pytest.fixture(scope="module", params=PAGES)
def visit(request, browser, site_url):
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    v = PageVisit(page, f"{site_url}/{request.param}.html")
    v.name = request.param
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / f"{pathlib.Path(request.param).name}.png"), full_page=True)
    yield v
    context.close()


def test_no_console_errors(visit):
    assert visit.errors == []


def test_no_failed_requests_and_nothing_from_other_hosts(visit):
    assert visit.failed == []
    assert visit.hosts <= {"127.0.0.1", "data"}, visit.hosts


def test_every_math_element_is_rendered_by_mathjax(visit):
    counts = visit.page.evaluate("""() => {
        const math = [...document.querySelectorAll('.math')];
        return {
            total: math.length,
            unrendered: math.filter(m => !m.querySelector('mjx-container')).map(m => m.textContent.slice(0, 80)),
            errors: document.querySelectorAll('mjx-merror').length,
        };
    }""")
    assert counts["unrendered"] == [] and counts["errors"] == 0, counts
    if visit.name.split("/")[-1][:2].isdigit():
        assert counts["total"] > 0, "a chapter without any rendered math"


def test_every_image_is_loaded(visit):
    broken = visit.page.evaluate("""() => [...document.images]
        .filter(img => !(img.complete && img.naturalWidth > 0)).map(img => img.src.slice(0, 100))""")
    assert broken == []


def test_no_dead_widget_controls_and_fallbacks_work(visit):
    page = visit.page
    # A live ipywidgets control cannot run Python on a static page: none may be shown.
    assert page.locator(".jupyter-widgets, .widget-area, .jp-OutputArea-output .widget-box").count() == 0
    frames = page.locator(".attnbook-frames")
    if has_live_widget(visit.name):
        assert frames.count() > 0, "a chapter with a live explorer needs a kernel-free frame slider"
    for i in range(frames.count()):
        box = frames.nth(i)
        slider = box.locator("input[type=range]")
        images = box.locator("img")
        n = images.count()
        assert n >= 2, "a frame slider with fewer than two frames explores nothing"
        before = box.locator(".attnbook-frame-value").text_content()
        slider.evaluate(f"(s) => {{ s.value = {n - 1}; s.dispatchEvent(new Event('input')); }}")
        shown = [images.nth(j).is_visible() for j in range(n)]
        assert shown == [False] * (n - 1) + [True]
        assert box.locator(".attnbook-frame-value").text_content() != before


def _same_origin_links(page, site_url):
    hrefs = page.evaluate("() => [...document.querySelectorAll('a[href]')].map(a => a.href)")
    return sorted({h for h in hrefs if h.startswith(site_url)})


def test_every_internal_link_and_anchor_resolves(visit, site_url):
    cache: dict[str, str] = {}
    problems = []
    for href in _same_origin_links(visit.page, site_url):
        url, _, fragment = href.partition("#")
        if url not in cache:
            try:
                with urllib.request.urlopen(url) as response:
                    cache[url] = response.read().decode("utf-8", "replace")
            except Exception as error:  # noqa: BLE001 - report every broken link at once
                cache[url] = ""
                problems.append(f"{href}: {error}")
                continue
        if fragment and cache[url]:
            anchor = urllib.parse.unquote(fragment)
            if not re.search(rf'(id|name)="{re.escape(anchor)}"', cache[url]):
                problems.append(f"{href}: no element with id {anchor!r}")
    assert problems == []


def test_colab_link_opens_this_chapter_on_main(visit):
    if visit.name not in CHAPTERS:
        pytest.skip("not a notebook chapter")
    repo = urllib.parse.urlsplit(CONFIG["repository"]["url"]).path.strip("/")
    expected = (
        f"https://colab.research.google.com/github/{repo}/blob/{CONFIG['repository']['branch']}/{visit.name}.ipynb"
    )
    links = visit.page.evaluate(
        "() => [...document.querySelectorAll('a[href*=\"colab.research.google.com\"]')].map(a => a.href)"
    )
    assert links and set(links) == {expected}, links
