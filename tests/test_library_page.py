"""The book's page for library users (book/use_in_your_model.md): every Python block on it runs, in order, in
one namespace, and every check it prints holds (no block prints False). What the page shows is what the
package does."""

import contextlib
import io
import pathlib
import re

import pytest

PAGE = pathlib.Path(__file__).resolve().parents[1] / "book" / "use_in_your_model.md"


def blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", PAGE.read_text(), flags=re.S)


@pytest.mark.skipif(not PAGE.exists(), reason="the book's pages are not part of an installed wheel's tests")
def test_every_block_on_the_page_runs_and_its_checks_hold():
    namespace: dict = {}
    printed = io.StringIO()
    assert len(blocks()) >= 6
    for i, block in enumerate(blocks()):
        with contextlib.redirect_stdout(printed):
            exec(compile(block, f"{PAGE.name} block {i + 1}", "exec"), namespace)
    text = printed.getvalue()
    assert "True" in text and "False" not in text, text
    assert "attn_mask must be None" in text  # the refusal the page shows
