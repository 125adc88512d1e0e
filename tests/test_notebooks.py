"""Every chapter follows the book's conventions: stored without outputs, listed in the table of contents,
opens on Colab with a GPU, installs the package only on Colab, picks its device and sizes from attnbook."""

import ast
import json
import pathlib
import re

import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[1]
CONFIG = yaml.safe_load((ROOT / "_config.yml").read_text())
TOC = yaml.safe_load((ROOT / "_toc.yml").read_text())
TOC_FILES = [TOC["root"]] + [entry["file"] for entry in TOC["chapters"]]
CHAPTERS = sorted((ROOT / "book").glob("*.ipynb"))


def load(path):
    return json.loads(path.read_text())


def source(cell):
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def test_there_are_chapters():
    assert [p.name for p in CHAPTERS][:1] == ["01_softmax_attention.ipynb"]


def test_every_chapter_is_in_the_table_of_contents_and_every_entry_exists():
    listed = {f for f in TOC_FILES}
    for path in CHAPTERS:
        assert f"book/{path.stem}" in listed, f"{path.name} is not in _toc.yml"
    for entry in TOC_FILES:
        assert (ROOT / f"{entry}.ipynb").exists() or (ROOT / f"{entry}.md").exists(), entry


def test_chapters_are_numbered_in_toc_order():
    numbered = [f for f in TOC_FILES if re.match(r"book/\d\d_", f)]
    assert numbered == sorted(numbered)


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
class TestChapter:
    def test_stored_without_outputs(self, path):
        for i, cell in enumerate(load(path)["cells"]):
            if cell["cell_type"] == "code":
                assert cell["outputs"] == [], f"cell {i} has outputs"
                assert cell["execution_count"] is None, f"cell {i} has an execution count"

    def test_opens_on_colab_with_a_gpu(self, path):
        meta = load(path)["metadata"]
        assert meta.get("accelerator") == "GPU"
        assert meta["kernelspec"]["name"] == "python3"

    def test_first_cell_installs_from_the_repository_only_on_colab_and_is_hidden(self, path):
        first = load(path)["cells"][0]
        text = source(first)
        assert first["cell_type"] == "code"
        assert "remove-cell" in first["metadata"].get("tags", [])
        assert '"google.colab" in sys.modules' in text or "'google.colab' in sys.modules" in text
        url = CONFIG["repository"]["url"]
        branch = CONFIG["repository"]["branch"]
        assert f"git+{url}@{branch}" in text, f"install cell must install from {url}@{branch}"
        # it must not touch Colab's own torch, numpy or ipywidgets
        assert not re.search(r"\b(torch|numpy|ipywidgets)\b[=<>]", text)
        assert "--upgrade" not in text and "-U " not in text

    def test_device_and_sizes_come_from_attnbook_config(self, path):
        text = "\n".join(source(c) for c in load(path)["cells"] if c["cell_type"] == "code")
        assert "config.device()" in text
        assert "ATTNBOOK_FAST" not in text, "sizes are decided only in attnbook.config"
        assert ".cuda()" not in text

    def test_one_title_then_sections(self, path):
        md = [source(c) for c in load(path)["cells"] if c["cell_type"] == "markdown"]
        titles = [line for text in md for line in text.splitlines() if line.startswith("# ")]
        assert len(titles) == 1 and md[0].startswith("# "), titles


def test_book_configuration():
    ex = CONFIG["execute"]
    assert ex["execute_notebooks"] == "force"
    assert ex["allow_errors"] is False
    assert CONFIG["sphinx"]["config"]["nb_execution_raise_on_error"] is True
    assert CONFIG["sphinx"]["config"]["nb_execution_show_tb"] is True
    assert CONFIG["only_build_toc_files"] is True
    assert CONFIG["repository"]["branch"] == "main"
    assert "colab" in CONFIG["launch_buttons"]["colab_url"]


# ---------------------------------------------------------------------------------------------------------
# The chapter standard (CONTRIBUTING.md): folded checks, no private source, what to take away, exercises.

EXERCISE_START = re.compile(r"```\{exercise-start\}[^\n]*\n:label: (\S+)")
SOLUTION_START = re.compile(r"```\{solution-start\} (\S+)\n:class: dropdown\b")
GATES = re.compile(r"```\{(exercise-start|exercise-end|solution-start|solution-end)\}")
KIND = re.compile(r"^\*\*(Derive|Implement|Explore)\.\*\*", re.M)
# Colab's form title; `ruff format` writes "#@title" as "# @title", which Colab reads the same (and writes itself).
TITLE = re.compile(r"#\s?@title Solution\n")
CHECK_TITLE = re.compile(r"#\s?@title Check: \S")
CITE = re.compile(r"\{cite(?::[a-z]+)?\}`([^`]+)`")
BIBLIOGRAPHY = re.compile(r"```\{bibliography\}\n:filter: docname in docnames\n:keyprefix: (\S+)\n```")
CHECK_CALL = re.compile(r"\b(assert\b|assert_close|assert_matches_reference|\.require\(\))")


def chapter_number(path) -> int:
    return int(path.stem.split("_")[0])


def tags(cell):
    return cell.get("metadata", {}).get("tags", [])


def blocks(path):
    """The chapter's cells, each with the gated block it sits in: None, "exercise" or "solution"."""
    inside, out = None, []
    for cell in load(path)["cells"]:
        text = source(cell)
        if cell["cell_type"] == "markdown":
            for gate in GATES.findall(text):
                kind, edge = gate.split("-")
                if edge == "start":
                    assert inside is None, f"{path.name}: {gate} inside an open {inside} block"
                    inside = kind
                else:
                    assert inside == kind, f"{path.name}: {gate} without a matching {kind}-start"
                    inside = None
            out.append((cell, inside))
        else:
            out.append((cell, inside))
    assert inside is None, f"{path.name}: a {inside} block is never closed"
    return out


def exercises(path):
    """[(label, kind, statement cell text)] in order, from the exercise-start cells."""
    found = []
    for cell in load(path)["cells"]:
        if cell["cell_type"] != "markdown":
            continue
        text = source(cell)
        for match in EXERCISE_START.finditer(text):
            kind = KIND.search(text[match.end() :])
            found.append((match.group(1), kind.group(1) if kind else None))
    return found


def _private_source(tree) -> list[str]:
    """Calls of inspect.getsource / getsourcelines on a name with a private (underscore) part."""
    bad = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not node.args:
            continue
        fn = node.func
        name = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", "")
        if name not in ("getsource", "getsourcelines", "getsourcefile"):
            continue
        parts, arg = [], node.args[0]
        while isinstance(arg, ast.Attribute):
            parts.append(arg.attr)
            arg = arg.value
        if isinstance(arg, ast.Name):
            parts.append(arg.id)
        if any(p.startswith("_") and not p.startswith("__") for p in parts):
            bad.append(".".join(reversed(parts)))
    return bad


# A small chapter that follows CONTRIBUTING.md to the letter: the standard holds on it, and each rule fails
# on a copy of it with that rule broken (test_each_rule_can_fail below).
SAMPLE = ROOT / "tests" / "data" / "09_sample_chapter.ipynb"


@pytest.mark.parametrize("path", CHAPTERS + [SAMPLE], ids=lambda p: p.stem)
class TestChapterStandard:
    def test_setup_cell_installs_the_figure_check(self, path):
        code = [source(c) for c in load(path)["cells"] if c["cell_type"] == "code"]
        assert any("use_book_style()" in text for text in code[:3]), (
            "the setup cell calls attnbook.viz.style.use_book_style() (it checks and stamps every figure)"
        )

    def test_checks_are_folded_on_the_website(self, path):
        loose = []
        for i, (cell, block) in enumerate(blocks(path)):
            if cell["cell_type"] != "code" or block == "solution" or "hide-input" in tags(cell):
                continue
            if CHECK_CALL.search(source(cell)):
                loose.append(f"cell {i}: {source(cell).splitlines()[0][:60]!r}")
        assert loose == [], "checks (assert, assert_close, .require()) go in a cell tagged hide-input:\n" + "\n".join(
            loose
        )

    def test_no_private_source_is_printed(self, path):
        bad = []
        for i, cell in enumerate(load(path)["cells"]):
            if cell["cell_type"] != "code":
                continue
            text = source(cell)
            try:
                tree = ast.parse(
                    "\n".join(line for line in text.splitlines() if not line.lstrip().startswith(("%", "!")))
                )
            except SyntaxError as error:
                pytest.fail(f"cell {i} is not valid Python: {error}")
            bad += [f"cell {i}: {name}" for name in _private_source(tree)]
            bad += [f"cell {i}: {m}" for m in re.findall(r"(?:%psource|%pinfo2)\s+\S*\b_\w+|\b_\w+\?\?", text)]
        assert bad == [], "chapters print public functions only (optimised source: a folded literalinclude):\n" + (
            "\n".join(bad)
        )

    def test_ends_with_what_to_take_away_then_references_then_exercises(self, path):
        sections = [
            line[3:].strip()
            for c in load(path)["cells"]
            if c["cell_type"] == "markdown"
            for line in source(c).splitlines()
            if line.startswith("## ")
        ]
        assert sections[-3:] == ["What to take away", "References", "Exercises"], sections[-4:]

    def test_references_come_from_the_one_bibliography_with_the_chapters_prefix(self, path):
        """The References section is the bibliography of what the page cites (sphinxcontrib-bibtex, keys with the
        chapter's prefix so that a paper cited on several pages is no duplicate), not a list written by hand."""
        md = "\n".join(source(c) for c in load(path)["cells"] if c["cell_type"] == "markdown")
        prefix = f"ch{chapter_number(path)}-"
        assert BIBLIOGRAPHY.findall(md) == [prefix], "one ```{bibliography}``` with :filter: and :keyprefix: " + prefix
        references = md.split("## References", 1)[1].split("## Exercises", 1)[0]
        assert not re.search(r"^\s*[-*] ", references, re.M), "the References section lists entries by hand"
        cited = [key for keys in CITE.findall(md) for key in keys.split(",")]
        assert cited, "the chapter cites nothing"
        assert all(k.strip().startswith(prefix) for k in cited), [k for k in cited if not k.strip().startswith(prefix)]

    def test_every_folded_check_has_a_colab_form_title(self, path):
        """On Colab a check shows only its title ("# @title Check: ..." and "cellView": "form"), as on the website
        it folds behind one line."""
        bad = []
        for i, cell in enumerate(load(path)["cells"]):
            if cell["cell_type"] == "code" and "hide-input" in tags(cell):
                titled = CHECK_TITLE.match(source(cell)) and cell["metadata"].get("cellView") == "form"
                if not titled:
                    bad.append(f"cell {i}: {source(cell).splitlines()[0][:60]!r}")
        assert bad == [], "folded checks without '# @title Check: ...' and cellView form:\n" + "\n".join(bad)

    def test_every_cell_the_website_folds_or_trims_is_a_colab_form(self, path):
        """A code cell tagged hide-* or remove-* (a check, a live explorer whose output the website cannot keep,
        the install cell) has a form title and "cellView": "form", so Colab shows its title, not its code."""
        bad = []
        for i, cell in enumerate(load(path)["cells"]):
            if cell["cell_type"] == "code" and any(t.startswith(("hide-", "remove-")) for t in tags(cell)):
                if not (re.match(r"#\s?@title \S", source(cell)) and cell["metadata"].get("cellView") == "form"):
                    bad.append(f"cell {i}: {source(cell).splitlines()[0][:60]!r}")
        assert bad == [], "folded or trimmed cells without a form title and cellView form:\n" + "\n".join(bad)

    def test_no_visible_code_cell_is_longer_than_25_lines(self, path):
        """A visible cell shows one idea; plumbing goes into attnbook.lab / attnbook.viz. Folded checks and solutions
        (titled forms) and hidden cells are exempt."""
        long = []
        for i, cell in enumerate(load(path)["cells"]):
            if cell["cell_type"] != "code" or cell["metadata"].get("cellView") == "form":
                continue
            if any(t.startswith(("hide-", "remove-")) for t in tags(cell)):
                continue
            n = len(source(cell).strip().splitlines())
            if n > 25:
                long.append(f"cell {i}: {n} lines, {source(cell).splitlines()[0][:50]!r}")
        assert long == [], "visible code cells longer than 25 lines:\n" + "\n".join(long)

    def test_four_to_six_exercises_of_every_kind_numbered_in_order(self, path):
        found = exercises(path)
        n = chapter_number(path)
        assert 4 <= len(found) <= 6, f"{len(found)} exercises"
        assert [label for label, _ in found] == [f"ex-{n}-{k}" for k in range(1, len(found) + 1)]
        kinds = [kind for _, kind in found]
        assert None not in kinds, "every statement starts with **Derive.**, **Implement.** or **Explore.**"
        assert {"Derive", "Implement", "Explore"} <= set(kinds), kinds

    def test_every_exercise_has_one_folded_solution_right_after_it(self, path):
        md = "\n".join(source(c) for c in load(path)["cells"] if c["cell_type"] == "markdown")
        labels = [label for label, _ in exercises(path)]
        solved = SOLUTION_START.findall(md)
        assert solved == labels, "each exercise is followed by its solution-start (with :class: dropdown)"
        order = [g for g in GATES.findall(md)]
        assert order == ["exercise-start", "exercise-end", "solution-start", "solution-end"] * len(labels)

    def test_solution_cells_are_collapsed_in_colab_and_checked(self, path):
        solutions = [
            (i, c) for i, (c, block) in enumerate(blocks(path)) if block == "solution" and c["cell_type"] == "code"
        ]
        assert len(solutions) >= len(exercises(path)), "every solution has a code cell"
        for i, cell in solutions:
            text = source(cell)
            assert TITLE.match(text), f"cell {i}: first line must be '# @title Solution'"
            assert cell["metadata"].get("cellView") == "form", f'cell {i}: metadata needs "cellView": "form"'
            assert ".require()" in text or "assert" in text, (
                f"cell {i}: the solution must call its checker with .require()"
            )
        titled = [i for i, (c, block) in enumerate(blocks(path)) if c["cell_type"] == "code" and TITLE.match(source(c))]
        assert titled == [i for i, _ in solutions], "a '# @title Solution' cell outside a solution block"

    def test_an_exercise_cell_is_shown_whole_as_the_student_gets_it(self, path):
        """The student writes in an exercise's cell, so it is neither folded nor trimmed: the website shows its
        code and what it prints as the book ships it, the checker's "○ ... no answer yet" (marked "○", not "✗":
        attnbook.exercises.Result.unanswered; tests/browser/test_layout.py checks the built pages)."""
        for i, (cell, block) in enumerate(blocks(path)):
            if block == "exercise" and cell["cell_type"] == "code":
                hidden = [t for t in tags(cell) if t.startswith(("hide-", "remove-"))]
                assert hidden == [], f"cell {i}: the student's cell is shown whole, not {hidden}"

    def test_stub_cells_run(self, path):
        for i, (cell, block) in enumerate(blocks(path)):
            if block != "exercise" or cell["cell_type"] != "code":
                continue
            text = source(cell)
            tree = ast.parse(text)
            top_raise = [n for n in tree.body if isinstance(n, ast.Raise)]
            assert not top_raise, f"cell {i}: a stub raises only inside its function, so 'Run all' goes on"
            assert ".require()" not in text, (
                f"cell {i}: a stub's checker call must not .require() (it would stop Run all)"
            )
            assert "cellView" not in cell["metadata"], f"cell {i}: the student's cell is not a form"
            for fn in [n for n in tree.body if isinstance(n, ast.FunctionDef)]:
                raises = any(isinstance(n, ast.Raise) and "NotImplementedError" in ast.unparse(n) for n in ast.walk(fn))
                returns_none = all(
                    n.value is None or (isinstance(n.value, ast.Constant) and n.value.value is None)
                    for n in ast.walk(fn)
                    if isinstance(n, ast.Return)
                )
                assert raises or returns_none, f"cell {i}: stub {fn.name} must raise NotImplementedError or return None"


def _replace(cells, find, old, new):
    for cell in cells:
        if find(cell):
            cell["source"] = source(cell).replace(old, new)
            return
    raise AssertionError(f"the sample has no cell for {old!r}")


def _is_solution(cell):
    return cell["cell_type"] == "code" and TITLE.match(source(cell))


BROKEN = {
    "no figure check": (
        "test_setup_cell_installs_the_figure_check",
        lambda c: _replace(c, lambda x: "use_book_style()" in source(x), "style.use_book_style()", "pass"),
    ),
    "check not folded": (
        "test_checks_are_folded_on_the_website",
        lambda c: next(x for x in c if "hide-input" in tags(x))["metadata"].pop("tags"),
    ),
    "private source": (
        "test_no_private_source_is_printed",
        lambda c: _replace(
            c,
            lambda x: "device = config.device()" in source(x),
            "device = config.device()",
            "device = config.device()\nprint(inspect.getsource(attnbook._fast.causal._tiles))",
        ),
    ),
    "no take-away": (
        "test_ends_with_what_to_take_away_then_references_then_exercises",
        lambda c: _replace(c, lambda x: "## What to take away" in source(x), "## What to take away", "## Summary"),
    ),
    "no references": (
        "test_ends_with_what_to_take_away_then_references_then_exercises",
        lambda c: _replace(c, lambda x: "## References" in source(x), "## References", "## Papers"),
    ),
    "references by hand": (
        "test_references_come_from_the_one_bibliography_with_the_chapters_prefix",
        lambda c: _replace(
            c, lambda x: "## References" in source(x), "## References\n", "## References\n\n- A. Vaswani et al.\n"
        ),
    ),
    "a citation without the prefix": (
        "test_references_come_from_the_one_bibliography_with_the_chapters_prefix",
        lambda c: _replace(c, lambda x: "ch9-vaswani" in source(x), "ch9-vaswani", "vaswani"),
    ),
    "check without a title": (
        "test_every_folded_check_has_a_colab_form_title",
        lambda c: _replace(c, lambda x: "@title Check:" in source(x), "# @title Check: ", "# "),
    ),
    "a long visible cell": (
        "test_no_visible_code_cell_is_longer_than_25_lines",
        lambda c: _replace(
            c, lambda x: "def weights_figure" in source(x), "def weights_figure", "x = 1\n" * 30 + "def weights_figure"
        ),  # fmt: skip
    ),
    "three exercises": (
        "test_four_to_six_exercises_of_every_kind_numbered_in_order",
        lambda c: _replace(
            c, lambda x: ":label: ex-9-4" in source(x), "```{exercise-start} The output\n:label: ex-9-4\n```", ""
        ),
    ),
    "no explore": (
        "test_four_to_six_exercises_of_every_kind_numbered_in_order",
        lambda c: _replace(c, lambda x: "**Explore.**" in source(x), "**Explore.**", "**Implement.**"),
    ),
    "solution not a dropdown": (
        "test_every_exercise_has_one_folded_solution_right_after_it",
        lambda c: _replace(c, lambda x: "solution-start} ex-9-2" in source(x), ":class: dropdown", ""),
    ),
    "no form view": (
        "test_solution_cells_are_collapsed_in_colab_and_checked",
        lambda c: next(x for x in c if _is_solution(x))["metadata"].pop("cellView"),
    ),
    "no title": (
        "test_solution_cells_are_collapsed_in_colab_and_checked",
        lambda c: _replace(c, _is_solution, "# @title Solution", "# Solution"),
    ),
    "solution not required": (
        "test_solution_cells_are_collapsed_in_colab_and_checked",
        lambda c: _replace(c, _is_solution, ".require()", ""),
    ),
    "an exercise cell trimmed": (
        "test_an_exercise_cell_is_shown_whole_as_the_student_gets_it",
        lambda c: next(x for x in c if "exercises.check_value" in source(x))["metadata"].update(tags=["remove-output"]),
    ),
    "stub raises at top level": (
        "test_stub_cells_run",
        lambda c: _replace(
            c,
            lambda x: "raise NotImplementedError  # your code" in source(x),
            "    raise NotImplementedError  # your code",
            "    pass\n\n\nraise NotImplementedError",
        ),
    ),
    "stub returns a value": (
        "test_stub_cells_run",
        lambda c: _replace(
            c, lambda x: "return None  # your code" in source(x), "return None  # your code", "return q"
        ),
    ),
}


@pytest.mark.parametrize("broken", sorted(BROKEN), ids=str)
def test_each_rule_can_fail(broken, tmp_path):
    """The sample passes every rule (TestChapterStandard); a copy of it with one rule broken fails that rule's test."""
    name, breaks = BROKEN[broken]
    nb = load(SAMPLE)
    for cell in nb["cells"]:
        cell["source"] = source(cell)
    breaks(nb["cells"])
    path = tmp_path / SAMPLE.name
    path.write_text(json.dumps(nb))
    with pytest.raises((AssertionError, pytest.fail.Exception)):
        getattr(TestChapterStandard(), name)(path)
