"""Every page as a reader sees it at a 1300 x 900 window: nothing scrolls sideways, figures are shown at their
natural size with readable text, no figure twice, and every exercise's solution is folded until opened.

The figure checks read what ``attnbook.viz.style.use_book_style()`` stamped into each PNG when the chapter was
executed: its smallest text in points, multiplied by the scale at which the page shows the image, and a
fingerprint of what it shows, the same for one figure rendered twice at two resolutions.
"""

import base64
import hashlib
import io
import urllib.request

import numpy as np
import pytest
from pages import WINDOW, PageVisit
from PIL import Image

from attnbook.viz import style

pytestmark = pytest.mark.browser

MIN_SCALE = 0.85  # an image may be shown at no less than this fraction of its natural width
MIN_TEXT_PX = 10.0  # the smallest text of a figure, in CSS pixels as shown
# For images without a fingerprint (drawn without use_book_style): two "look the same" when their aspect ratios
# agree within ASPECT and their ink (255 - grey, on a 96 px wide thumbnail) correlates at SAME or more.
# Measured on the chapters as first built: a figure repeated at another dpi correlates at 0.997-0.999,
# distinct frames of one slider at 0.77-0.996, distinct figures below 0.6.
ASPECT = 0.02
SAME = 0.997
# Opens every fold a reader can open: <details> (hide-input cells, {dropdown}) and sphinx-togglebutton's
# admonition toggles (sphinx-exercise's solutions).
OPEN_FOLDS = """() => {
    document.querySelectorAll('details').forEach(d => { d.open = true; });
    document.querySelectorAll('.toggle-hidden').forEach(t => {
        const b = t.querySelector('button.toggle-button') || document.querySelector(`[data-target="${t.id}"]`);
        if (b) b.click();
    });
    return true;
}"""

SIDEWAYS = """() => {
    const root = document.querySelector('article.bd-article') || document.querySelector('main') || document.body;
    const found = [];
    for (const el of root.querySelectorAll('*')) {
        const cs = getComputedStyle(el);
        const scrolls = ['auto', 'scroll'].includes(cs.overflowX);
        if (el.tagName !== 'PRE' && !scrolls) continue;
        if (!el.getClientRects().length) continue;  // not displayed
        if (el.scrollWidth > el.clientWidth + 1) {
            const kind = el.closest('.cell_output') ? 'output' : el.closest('.cell_input') ? 'code'
                : el.tagName === 'PRE' ? 'pre' : el.tagName.toLowerCase();
            found.push({kind, scroll: el.scrollWidth, client: el.clientWidth,
                        text: (el.textContent || '').trim().split('\\n')[0].slice(0, 60)});
        }
    }
    return {found, page: document.documentElement.scrollWidth, window: window.innerWidth};
}"""

# Every image of the article with the width it is shown at; a frame slider's hidden frames are shown one at a
# time to measure them, then the slider is put back as it was.
IMAGES = """() => {
    const root = document.querySelector('article.bd-article') || document.querySelector('main') || document.body;
    const out = [];
    for (const img of root.querySelectorAll('img')) {
        if (!img.naturalWidth || img.naturalWidth < 64) continue;  // icons
        const box = img.closest('.attnbook-frames');
        let shown = img.getBoundingClientRect().width;
        if (box && !img.getClientRects().length) {
            const was = img.style.display;
            const visible = [...box.querySelectorAll('img')].filter(i => i.getClientRects().length);
            visible.forEach(i => { i.dataset.was = i.style.display; i.style.display = 'none'; });
            img.style.display = 'block';
            shown = img.getBoundingClientRect().width;
            img.style.display = was;
            visible.forEach(i => { i.style.display = i.dataset.was; });
        }
        const boxes = [...document.querySelectorAll('.attnbook-frames')];
        out.push({src: img.currentSrc || img.src, natural: img.naturalWidth, shown,
                  slider: box ? boxes.indexOf(box) : -1,
                  where: (img.alt || img.src).slice(-60)});
    }
    return out;
}"""


def _open_all_folds(page):
    page.evaluate(OPEN_FOLDS)
    page.wait_for_timeout(400)  # the toggles animate their height


def _ink(image: Image.Image, width: int = 96) -> np.ndarray:
    height = max(1, round(width * image.size[1] / image.size[0]))
    grey = image.convert("L").resize((width, height), Image.BILINEAR)
    return 255.0 - np.asarray(grey, dtype=np.float32)


def _looks_the_same(a: dict, b: dict) -> bool:
    if abs(a["aspect"] - b["aspect"]) > ASPECT * a["aspect"]:
        return False
    x, y = a["ink"], b["ink"]
    if x.shape != y.shape:
        y = np.asarray(Image.fromarray(y).resize(x.shape[::-1], Image.BILINEAR))
    if x.std() == 0 or y.std() == 0:
        return bool(np.array_equal(x, y))
    return float(np.corrcoef(x.ravel(), y.ravel())[0, 1]) >= SAME


def _bytes(src: str) -> bytes:
    if src.startswith("data:"):
        return base64.b64decode(src.split(",", 1)[1])
    with urllib.request.urlopen(src) as response:
        return response.read()


@pytest.fixture(scope="module")
def images(visit):
    """Every image of the page: where it is, its bytes, its natural and shown widths, its stamp."""
    _open_all_folds(visit.page)
    found = []
    for info in visit.page.evaluate(IMAGES):
        data = _bytes(info["src"])
        image = Image.open(io.BytesIO(data))
        info.update(
            data=data,
            digest=hashlib.sha256(data).hexdigest(),
            dpi=float(image.info.get("dpi", (72.0, 72.0))[0]),
            stamp=image.info.get(style.STAMP_FONT),
            fingerprint=image.info.get(style.STAMP_FINGERPRINT),
            aspect=image.size[0] / image.size[1],
            ink=_ink(image),
        )
        found.append(info)
    return found


def test_no_block_scrolls_sideways(visit):
    _open_all_folds(visit.page)
    result = visit.page.evaluate(SIDEWAYS)
    wide = [f"{b['kind']} {b['scroll']} px in {b['client']} px: {b['text']!r}" for b in result["found"]]
    assert result["page"] <= result["window"], "the page itself scrolls sideways"
    assert wide == [], f"{len(wide)} blocks scroll sideways at {WINDOW['width']} px:\n" + "\n".join(wide)


# For each kind of box that holds code on the page (a cell, a folded check, a dropdown, an exercise, a solution),
# a copy of one of its code blocks with one line of 80 characters: the book's line length must fit every box.
EIGHTY_COLUMNS = """() => {
    const kinds = {cell: '.cell_input', 'folded check': '.tag_hide-input .cell_input', dropdown: 'details',
                   exercise: 'div.exercise', solution: 'div.solution'};
    const out = [];
    for (const [kind, where] of Object.entries(kinds)) {
        for (const box of document.querySelectorAll(`article.bd-article ${where}`)) {
            const pre = box.querySelector('div.highlight pre');
            if (!pre || !pre.getClientRects().length || pre.closest('.wrap')) continue;
            const copy = pre.cloneNode(false);
            copy.textContent = '='.repeat(80);
            pre.parentNode.insertBefore(copy, pre);
            out.push({kind, fits: copy.scrollWidth <= copy.clientWidth + 1, scroll: copy.scrollWidth,
                      client: copy.clientWidth, px: parseFloat(getComputedStyle(copy).fontSize)});
            copy.remove();
            break;
        }
    }
    return out;
}"""


def test_eighty_columns_fit_every_code_box(visit):
    """Book cells are linted at 80 columns (book/ruff.toml): a line that long fits in every box that shows code,
    at a font of at least 12 px."""
    _open_all_folds(visit.page)
    boxes = visit.page.evaluate(EIGHTY_COLUMNS)
    if not boxes:
        pytest.skip("no code on this page")
    bad = [f"{b['kind']}: {b['scroll']} px in {b['client']} px at {b['px']} px" for b in boxes if not b["fits"]]
    assert bad == [], "80 columns do not fit:\n" + "\n".join(bad)
    small = [f"{b['kind']}: {b['px']} px" for b in boxes if b["px"] < 12]
    assert small == [], "code shrunk below 12 px:\n" + "\n".join(small)


def test_every_image_is_shown_at_its_natural_size(images):
    small = [
        f"{i['where']}: shown at {i['shown'] / i['natural']:.0%} ({i['shown']:.0f} of {i['natural']} px)"
        for i in images
        if i["shown"] < MIN_SCALE * i["natural"]
    ]
    assert small == [], f"{len(small)} images shown below {MIN_SCALE:.0%} of their size:\n" + "\n".join(small)


def test_smallest_figure_text_is_readable(images):
    problems = []
    for i in images:
        if i["stamp"] is None:
            problems.append(f"{i['where']}: no size stamp (drawn without style.use_book_style())")
            continue
        if i["stamp"] == "none":  # a figure without any text
            continue
        px = float(i["stamp"]) * i["dpi"] / 72.0 * (i["shown"] / i["natural"])
        if px < MIN_TEXT_PX:
            problems.append(f"{i['where']}: smallest text {i['stamp']} pt renders at {px:.1f} px")
    assert problems == [], f"{len(problems)} figures with text below {MIN_TEXT_PX:g} px:\n" + "\n".join(problems)


def test_no_figure_twice(images):
    seen, twice = {}, []
    for i in images:
        if i["digest"] in seen:
            twice.append(f"{i['where']}: the same bytes as {seen[i['digest']]['where']}")
        seen.setdefault(i["digest"], i)
    # The same figure rendered twice, at another resolution or crop (a static default and its slider's first
    # frame): one fingerprint of what it shows, stamped by style.use_book_style().
    for k, a in enumerate(images):
        for b in images[k + 1 :]:
            if a["digest"] == b["digest"]:
                continue  # reported above
            if a["fingerprint"] and b["fingerprint"]:
                same = a["fingerprint"] == b["fingerprint"]
            else:  # not stamped (test_smallest_figure_text_is_readable fails it): compare the pixels
                same = not (a["slider"] == b["slider"] >= 0) and _looks_the_same(a, b)
            if same:
                twice.append(f"{b['where']}: the same figure as {a['where']}")
    assert twice == [], f"{len(twice)} figures shown twice:\n" + "\n".join(twice)


SOLUTIONS = """() => [...document.querySelectorAll('div.solution')].map(s => {
    const content = [...s.querySelectorAll('pre')];
    const visible = content.filter(p => {
        const r = p.getBoundingClientRect();
        return r.height > 0 && getComputedStyle(p).visibility !== 'hidden';
    });
    const link = s.querySelector('.admonition-title a');
    return {id: s.id, folded: s.classList.contains('toggle-hidden'), code: s.querySelectorAll('.cell_input pre').length,
            visible: visible.length, target: link ? link.getAttribute('href') : null};
})"""


def test_every_solution_is_folded_and_opens_to_show_code(browser, visit):
    exercises = visit.page.evaluate("() => [...document.querySelectorAll('div.exercise')].map(e => e.id)")
    if not exercises:
        pytest.skip("no exercises on this page")
    context = browser.new_context(viewport=WINDOW)
    try:
        page = context.new_page()
        PageVisit(page, visit.url)  # a fresh load: the other tests open every fold
        before = page.evaluate(SOLUTIONS)
        assert sorted(s["target"] for s in before) == sorted(f"#{e}" for e in exercises), (
            "every exercise has exactly one solution"
        )
        for s in before:
            assert s["folded"] and s["visible"] == 0, f"solution {s['id']} is not folded when the page loads"
            assert s["code"] > 0, f"solution {s['id']} has no code cell"
        for button in page.locator("div.solution button.toggle-button").all():
            button.click()
        page.wait_for_timeout(500)
        for s in page.evaluate(SOLUTIONS):
            assert not s["folded"] and s["visible"] > 0, f"solution {s['id']} does not open to show its code"
    finally:
        context.close()


FOLDED_CHECKS = r"""() => [...document.querySelectorAll('div.cell.tag_hide-input')].map(cell => {
    const code = (cell.querySelector('.cell_input') || {}).textContent || '';
    const out = [...cell.querySelectorAll('.cell_output pre, .cell_output img')]
        .map(o => o.tagName === 'IMG' ? '(an image)' : o.textContent).join('\n');
    return {code: code.trim().split('\n').slice(0, 1).join(''), checks: /\bassert|\.require\(\)/.test(code),
            lines: out.split('\n').map(l => l.trim()).filter(l => l)};
})"""


def test_every_folded_check_shows_one_checked_line(visit):
    """A check folded behind hide-input shows the reader exactly one line, "checked: ..." (CONTRIBUTING.md)."""
    bad = [
        f"{c['code'][:50]!r} shows {len(c['lines'])} lines: {c['lines'][:2]}"
        for c in visit.page.evaluate(FOLDED_CHECKS)
        if c["checks"] and not (len(c["lines"]) == 1 and c["lines"][0].startswith("checked:"))
    ]
    assert bad == [], "folded checks must print one line 'checked: ...':\n" + "\n".join(bad)


EXERCISE_OUTPUTS = """() => [...document.querySelectorAll('div.exercise')].map(e => ({
    id: e.id, cells: e.querySelectorAll('.cell_input').length,
    output: [...e.querySelectorAll('.cell_output')].map(o => o.innerText).join('\\n')}))"""


def test_every_exercise_shows_its_cell_and_the_checker_waiting_for_an_answer(visit):
    """The student's cell is shown whole, with what it prints as the book ships it: the checker's verdict marked
    "○" (no answer yet), never "✗" (a mistake), which would read as a broken build."""
    found = visit.page.evaluate(EXERCISE_OUTPUTS)
    if not found:
        pytest.skip("no exercises on this page")
    for e in found:
        assert e["cells"] == 1, f"exercise {e['id']}: {e['cells']} code cells"
        assert "○ " in e["output"] and "✗" not in e["output"], f"exercise {e['id']} shows {e['output'][:200]!r}"
