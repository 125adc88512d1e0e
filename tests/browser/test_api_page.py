"""The API page documents every public name: each name of ``attnbook.__all__`` and of the ``__all__`` of every
module the page covers has its entry (an anchor ``id="<module>.<name>"``) on the built page."""

import importlib
import re

import pytest
from conftest import SITE

pytestmark = pytest.mark.browser

# The modules a library user imports, and the book's instruments that the page also covers.
MODULES = [
    "attnbook", "attnbook.feature_maps", "attnbook.mechanisms", "attnbook.lm", "attnbook.decoding",
    "attnbook.reference", "attnbook.testing", "attnbook.exercises", "attnbook.config", "attnbook.lab.profiling",
    "attnbook.lab.bench", "attnbook.lab.headtohead", "attnbook.lab.listops", "attnbook.lab.claims",
]  # fmt: skip


@pytest.fixture(scope="module")
def anchors() -> set[str]:
    html = (SITE / "book" / "api.html").read_text()
    return set(re.findall(r'id="(attnbook[\w.]*)"', html))


@pytest.mark.parametrize("module", MODULES)
def test_every_public_name_has_an_entry(module, anchors):
    mod = importlib.import_module(module)
    names = [n for n in mod.__all__ if not isinstance(getattr(mod, n), type(mod))]  # modules have their own section
    missing = [n for n in names if f"{module}.{n}" not in anchors]
    assert missing == [], f"{module}: no entry on the API page for {missing}"
