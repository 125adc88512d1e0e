"""Every number a chapter's prose quotes from an output is asserted by a check next to it.

The rule (the scanner is tests/prose_numbers.py, whose docstring has the details):

* Scanned: the markdown cells of every numbered chapter in _toc.yml (book/NN_*.ipynb; a new chapter is picked up
  when it is listed). A *quoted number* is a decimal (0.42, 12.2), a percentage (13 %), a multiplier (3.8x,
  12.2 times, a factor of 2) or a number with a unit of measurement (0.03 ms, 16 MiB, 4.1 TB/s, 17,032 tokens a
  second). Bare integers (counts, sizes, "chapter 3") are not quotes; neither is anything in code spans, fenced
  blocks, links, HTML, headings, nor section, exercise, equation and version numbers.
* A quoted number passes when a code cell of its own ``##`` section (or the setup above the first ``##``) has it
  as a numeric literal: normally the folded check (``# @title Check: ...``, tagged ``hide-input``) that asserts
  it, ``assert round(ratio, 1) == 12.2``. Forms that match: 12.2 and 12.20; 0.669 for "0.67" (the literal rounds
  to the quote); 0.13 for "13 %", 1.12 for "12 % above"; 3e-5 or 30 for "0.03 ms"; 16 * 2**20 written as 16 for
  "16 MiB". The chapter's opening and its "What to take away" summarise: their numbers may be asserted anywhere
  in the chapter.
* Two visible marks in the chapter itself, and no list in this file, say that a number is not a measured result:
  - **a citation in the same sentence** (``{cite:t}`` or ``{cite:p}``): a paper's claim, marked as the paper's;
  - **math**: a number inside an expression, ``$t = 8192$`` (a setting), ``$10^{-9}$`` (a tolerance),
    ``$38.70 - 16.13 \\approx 22.6$`` (arithmetic the reader can redo). A math span that is only a number
    (``$0.669$``, ``$0.25,\\ 0.33$``) is read as prose: dollars alone do not excuse a result.

A failure lists, per chapter, each unasserted number with its cell index and sentence, and names another section's
check that has the same number, if one does (then repeat or move that assertion into the check beside the text).
"""

import json
import pathlib

import prose_numbers as pn
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
CHAPTERS = pn.chapters(ROOT)

HOW_TO_FIX = (
    "\n\nAssert each number in the check cell after the code that prints it (assert round(x, 2) == 0.67), or mark "
    "it: a paper's claim cites the paper in the same sentence; a setting or arithmetic is written as math "
    "($\\beta = 0.01$, $38.70 - 16.13 \\approx 22.6$). The rule: tests/prose_numbers.py."
)


def test_the_chapters_are_those_of_the_table_of_contents():
    assert [p.name for p in CHAPTERS][:1] == ["01_softmax_attention.ipynb"]
    assert all(p.exists() and p.parent.name == "book" for p in CHAPTERS)
    assert [p.name for p in CHAPTERS] == sorted(p.name for p in CHAPTERS)


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_every_quoted_number_is_asserted_next_to_it(path):
    findings = pn.unasserted(pn.load(path))
    if findings:
        pytest.fail(pn.report({path.name: findings}) + HOW_TO_FIX, pytrace=False)


# ---------------------------------------------------------------------------------------------------------
# The scanner, on small synthetic chapters.


def notebook(*cells):
    """("md", text), ("code", text) or ("check", text) -> a notebook dict."""
    out = []
    for kind, text in cells:
        if kind == "md":
            out.append({"cell_type": "markdown", "metadata": {}, "source": text})
        else:
            tags = ["hide-input"] if kind == "check" else []
            out.append({"cell_type": "code", "metadata": {"tags": tags}, "source": text, "outputs": []})
    return {"cells": out, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}


def findings(prose, code, *, section="## Results"):
    nb = notebook(("md", f"{section}\n\n{prose}"), ("code", "ratio = measure()"), ("check", code))
    return [(f.cell, f.quote.text) for f in pn.unasserted(nb)]


def quoted(prose):
    return [q.text for q in pn.quotes(prose)]


def test_a_number_asserted_by_the_check_passes():
    assert findings("Linear attention is 12.2 times faster.", "assert round(ratio, 1) == 12.2") == []


def test_a_number_no_check_asserts_fails_with_its_cell_and_sentence():
    nb = notebook(
        ("md", "# 9. A chapter"),
        ("md", "## Results\n\nThe setup is short. Linear attention is 12.2 times faster. Then more."),
        ("code", "ratio = measure()"),
        ("check", "# @title Check: the ratio\nassert ratio > 10"),
    )
    (finding,) = pn.unasserted(nb)
    assert (finding.cell, finding.quote.text, finding.quote.value) == (1, "12.2 times", pn.Decimal("12.2"))
    assert finding.quote.sentence == "Linear attention is 12.2 times faster."
    message = pn.report({"09_chapter.ipynb": [finding]})
    assert "09_chapter.ipynb: 1 quoted number" in message
    assert "cell 1: '12.2 times' in \"Linear attention is 12.2 times faster.\"" in message


def test_the_chapter_test_fails_on_a_chapter_with_an_unasserted_number(tmp_path):
    path = tmp_path / "09_chapter.ipynb"
    path.write_text(json.dumps(notebook(("md", "## Results\n\nIt reaches 0.921."), ("check", "assert acc > 0.9"))))
    with pytest.raises(pytest.fail.Exception, match=r"cell 0: '0.921' in \"It reaches 0.921.\""):
        test_every_quoted_number_is_asserted_next_to_it(path)
    path.write_text(json.dumps(notebook(("md", "## Results\n\nIt reaches 0.921."), ("check", "assert a == 0.921"))))
    test_every_quoted_number_is_asserted_next_to_it(path)


@pytest.mark.parametrize(
    ("prose", "code"),
    [
        ("It reads 12.20.", "assert round(x, 1) == 12.2"),
        ("It reaches 1.000.", "assert x == 1.0"),
        ("It reaches 0.67.", "assert round(x, 3) == 0.669"),  # the quote rounds the asserted value
        ("All end between 0.30 and 0.31.", "assert 0.295 < lo and hi < 0.315"),  # a band
        ("It uses 13 % of the time.", "assert round(x, 2) == 0.13"),
        ("It uses 13 % of the time.", "assert round(100 * x) == 13"),
        ("It uses 95 % of its tolerance.", "assert round(x, 3) == 0.951"),
        ("F(32) is 12 % above F(8).", "assert round(ratio, 2) == 1.12"),
        ("It is 4 % slower.", "assert round(ratio, 2) == 0.96"),
        ("It is 3.8x faster.", "assert round(x, 1) == 3.8"),
        ("It is 21x faster.", "assert round(x) == 21"),
        ("A step costs 0.03 ms.", "assert round(t * 1e3, 2) == 0.03"),
        ("A step costs 0.03 ms.", "assert t < 3e-5"),
        ("A step costs 0.03 ms.", "assert round(t_us) == 30"),
        ("The state holds 33 KiB.", "assert round(n / 1024) == 33"),
        ("The cache holds 16 MiB.", "assert n == 16 * 2**20"),
        ("The card reads 4.1 TB/s.", "assert round(bw / 1e12, 1) == 4.1"),
        ("It ranges from 0.013 s to 0.51 s.", "assert (round(a, 3), round(b, 2)) == (0.013, 0.51)"),
        ("Entropy 3.13 against 3.03.", 'assert f"{a:.2f} {b:.2f}" == "3.13 3.03"'),  # strings an assert compares
        ("Half of the heads reach 0.996.", 'quoted = {"0.5": 0.996}\nassert got == quoted'),
    ],
)
def test_normalised_forms_of_an_asserted_number_pass(prose, code):
    assert quoted(prose), prose
    assert findings(prose, code) == []


@pytest.mark.parametrize(
    ("prose", "code"),
    [
        ("It reaches 0.67.", "assert round(x, 2) == 0.68"),
        ("It is 21x faster.", "assert x > 20.6"),  # an integer quote needs the integer
        ("It uses 13 % of the time.", "assert round(x, 2) == 0.14"),
        ("It uses 12 % of the time.", "assert round(r, 2) == 1.12"),  # 1.12 is "12 % above", not "12 %"
        ("It reaches 0.5 at last.", "x = round(y, 5)"),  # round's digits are no value
        ("It reaches 0.5 at last.", "assert x  # about 0.5"),  # a comment is no assertion
        ("It reaches 0.5 at last.", 'print(f"reached {x}: about 0.5")'),  # nor printed text
        ("It reaches 0.5 at last.", 'print("reached about 0.5")'),
        ("A step costs 0.03 ms.", "assert round(t, 2) == 0.05"),
    ],
)
def test_a_different_or_unasserted_number_fails(prose, code):
    assert findings(prose, code) != []


@pytest.mark.parametrize(
    "prose",
    [
        "The call `attention(q, k, eps=0.5)` is the same.",  # code span
        "```python\nx = 0.5\n```",  # fenced code
        "At $t = 8192$ and $\\beta = 0.01$ it holds.",  # settings, written as math
        "It holds to $10^{-9}$ in float64.",  # a tolerance
        "The clamp bounds it by $\\exp(1) \\approx 2.7$.",  # arithmetic the reader can redo
        "Not the paper's $38.70 - 16.13 \\approx 22.6$ points.",
        "$$\nF(\\ell) = 0.5\\, N \\ell\n$$",  # display math
        "{cite:t}`ch3-wu2022flowformer` report 38.70 % on ListOps, 2.5x faster.",  # a paper's claim, cited
        "On ListOps {cite:p}`ch3-tay2021lra` Flowformer reaches 38.70 %.",
        "As in exercise 4.3 and chapter 3.2, see Eq. 7 and Table 6.",  # parts of a text
        "Under torch 2.11 and Python 3.12, version 1.2.3 of it.",  # versions
        "An H200 in float16 and bfloat16, top-2 routing, ex-4-1.",  # glued to words
        "With 16 heads, 3 seeds, 1,000 steps and 64 tokens.",  # counts and sizes
        "See [the data](results/run_0.5.json) and <https://x.org/0.5>.",  # link targets
        "<!-- 0.5 --> <details><summary>Solution</summary>",  # HTML
        "A 2 x 2 matrix.",  # a shape, not a multiplier
        "arXiv [2410.11842](https://arxiv.org/abs/2410.11842)",
    ],
)
def test_math_citations_code_and_references_are_not_quotes(prose):
    assert quoted(prose) == []


@pytest.mark.parametrize(
    ("prose", "expected"),
    [
        ("It reaches $0.669$.", ["0.669"]),  # a bare number in dollars is still prose
        ("The weights are $0.25,\\ 0.33,\\ 0.42$.", ["0.25", "0.33", "0.42"]),
        ("A step costs 2.5 to 10 times the forward.", ["2.5", "10 times"]),  # a range shares its unit
        ("A state of 33 and 36 KiB.", ["33", "36"]),
        ("Within a factor of 2 of the fastest.", ["2"]),
        (
            "It pays 1.5 bits; 17,032 tokens a second; 98 % and 4% and 95 per cent.",
            ["1.5", "17,032", "98 %", "4%", "95 per cent"],
        ),
        ("{cite:t}`ch7-paper` measured 4000 times. A GPU does not give 4000 times.", ["4000 times"]),  # next sentence
    ],
)
def test_quoted_numbers_are_found(prose, expected):
    assert quoted(prose) == expected


def test_a_check_in_another_section_does_not_count_but_is_named():
    nb = notebook(
        ("md", "## Recorded\n\nThe state holds 33 KiB."),
        ("check", "assert round(n / 1024) == 33"),
        ("md", "## Quality against cost\n\nA fixed state (33 KiB)."),
        ("check", "assert True"),
    )
    (finding,) = pn.unasserted(nb)
    assert (finding.cell, finding.elsewhere) == (2, (1,))
    assert "[the same number is in another section's check: cell 1]" in str(finding)


def test_the_setup_counts_for_every_section_and_summaries_for_the_whole_chapter():
    nb = notebook(
        ("md", "# 9. A chapter\n\nWe find that softmax is 12.2 times slower."),  # the opening summarises
        ("code", "lr = 0.02  # the setup"),
        ("md", "## Training\n\nThe learning rate is 0.02."),
        ("md", "## Speed\n\nSoftmax is 12.2 times slower."),
        ("check", "assert round(ratio, 1) == 12.2"),
        ("md", "## What to take away\n\n* Softmax is 12.2 times slower at 0.02."),
        ("md", "## Exercises\n\nIt was 12.2 times."),  # not a summary: its own section has no check
    )
    assert [(f.cell, f.quote.text) for f in pn.unasserted(nb)] == [(6, "12.2 times")]


def test_a_markdown_cell_is_split_at_its_headings():
    nb = notebook(
        ("md", "## One\n\nA ratio of 0.42."),
        ("check", "assert round(r, 2) == 0.42"),
        ("md", "So 0.42 it is.\n\n## Two\n\nAgain 0.42."),  # the text above ## Two belongs to ## One
    )
    assert [(f.cell, f.quote.sentence) for f in pn.unasserted(nb)] == [(2, "Again 0.42.")]
