"""Every chapter follows the book's conventions: stored without outputs, listed in the table of contents,
opens on Colab with a GPU, installs the package only on Colab, picks its device and sizes from attnbook."""

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
