"""The book's page for library users (book/use_in_your_model.md): every Python block on it runs, in order, in
one namespace, every check it prints holds (no block prints False), and each block prints exactly the output
the page shows under it. What the page shows is what the package does."""

import contextlib
import io
import pathlib
import re

import pytest

PAGE = pathlib.Path(__file__).resolve().parents[1] / "book" / "use_in_your_model.md"


def blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", PAGE.read_text(), flags=re.S)


def shown() -> list[str]:
    """The text block right after each Python block: what the page says it prints."""
    return re.findall(r"```python\n.*?```\n\n```text\n(.*?)```", PAGE.read_text(), flags=re.S)


@pytest.mark.skipif(not PAGE.exists(), reason="the book's pages are not part of an installed wheel's tests")
def test_every_block_on_the_page_runs_and_its_checks_hold():
    namespace: dict = {}
    printed = io.StringIO()
    assert len(blocks()) >= 7 and len(shown()) == len(blocks()), "every block has its output shown under it"
    for i, (block, expected) in enumerate(zip(blocks(), shown(), strict=True)):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(block, f"{PAGE.name} block {i + 1}", "exec"), namespace)
        assert out.getvalue() == expected, f"block {i + 1} prints\n{out.getvalue()}\nthe page shows\n{expected}"
        printed.write(out.getvalue())
    text = printed.getvalue()
    assert "True" in text and "False" not in text, text
    assert "attn_mask must be None" in text  # the refusal the page shows
