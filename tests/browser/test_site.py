"""The website as its readers meet it, page by page, in a real browser."""

import re
import urllib.parse
import urllib.request

import pytest
from pages import CHAPTERS, CONFIG, WINDOW, has_live_widget
from PIL import Image

pytestmark = pytest.mark.browser


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


def test_the_screenshots_cover_the_page(visit):
    # each tile a whole JPEG (an empty file when a capture fails to encode), together the page's full height
    sizes = [Image.open(path).size for path in visit.screenshots]
    assert {w for w, _ in sizes} == {WINDOW["width"]}, sizes
    assert sum(h for _, h in sizes) == visit.screenshot_height >= WINDOW["height"], sizes


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
