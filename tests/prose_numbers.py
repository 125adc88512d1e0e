"""Find the numbers a chapter's prose quotes, and whether a code cell near them asserts or computes them.

The book's rule (issue: "every number a paragraph quotes from an output comes from the same cell's value, or is
asserted by a check next to it"): a result quoted in running text is written, as a literal, in the source of a
code cell of the same section, normally the folded check cell (``# @title Check: ...``) that asserts it, e.g.
``assert round(ratio, 1) == 12.2`` for "12.2 times". This module is the scanner; tests/test_prose_numbers.py
applies it to every chapter and tests it on small synthetic notebooks.

What counts as a quoted number (in markdown cells, outside code and math):

* a decimal: 0.42, 12.2, 1.000, 2.5e-3;
* a percentage: 13 %, 4%, 95 per cent;
* a multiplier: 3.8x, 21x, 12.2 times, a factor of 2;
* a number with a unit of measurement: 0.03 ms, 4 µs, 2 s, 64 KiB, 3 GB, 4.1 TB/s, 900 tokens/s, 5 FLOPs.

A bare integer ("16 heads", "3 seeds", "chapter 3") is a count or a setting, not a quoted result. Also not
scanned: code spans and fenced blocks (so MyST roles and directives), link targets, HTML tags and comments,
headings, directive options, numbers glued to letters (``H200``, ``float16``, ``top-2``), section, chapter,
exercise, equation, table and figure numbers ("exercise 4.3", "Eq. 7"), version numbers ("torch 2.11",
"1.2.3"), and:

* **math**: a ``$...$`` or ``$$...$$`` span that is an expression (it has a variable, an operator, a relation or
  a command) is a setting, a tolerance or derived arithmetic the reader can redo: "$t = 8192$", "$10^{-9}$",
  "$\\exp(1) \\approx 2.7$", "$32 \\cdot 129 / 96 = 43$". This is the book's one visible marker for a number that
  is not a measured result: write it as the equation it is. A math span that is only a number ("$0.669$",
  "$12\\,\\%$") is scanned like prose: dollars alone do not hide a result.
* **a paper's claim**: every number in a sentence that cites (``{cite:t}`` or ``{cite:p}``) is the paper's,
  marked by its citation.

Where a quoted number must be found (the code cells' numeric literals, read with ``ast``: numbers, and strings
that are a number such as ``"0.5"``; not comments, not printed text, not the digits argument of ``round``):

* in a code cell of the same section: the cells between the same two ``##`` headings (``###`` subsections belong
  to their section; the part of a markdown cell above a heading belongs to the section before). The chapter's
  setup, the code cells before the first ``##`` heading, counts for every section.
* a chapter's summaries, its opening (above the first ``##``) and "What to take away", repeat numbers measured
  further down or up: their numbers may be found in any code cell of the chapter.

A literal matches a quoted number when they are equal as numbers (12.2 and 12.20; 1.000 and 1), when the literal
rounds to it at the number of decimals quoted, ties either way (0.669 for "0.67"; the band 0.295 < x < 0.315 for
"0.30 to 0.31"; an integer quote needs the exact integer), for a percentage also as a fraction (0.13 or 0.127 for
"13 %"; 1.12 for "12 % above", 0.96 for "4 % slower"), and for a number with a unit also in that unit's scaled
forms, powers of 1000 and of 1024 ("0.03 ms": 0.03, 3e-5 or 30; "16 MiB": 16 in ``16 * 2**20``). Strings that an
assert compares count too: ``assert f"{a:.2f}" == "3.13"``.

A failure names, when there is one, a check in another section that has the same number (at least two significant
digits, so that 0.9 or 3 do not point anywhere by chance): the fix is then to assert it beside the text as well.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import pathlib
import re
from decimal import ROUND_HALF_DOWN, ROUND_HALF_UP, Decimal, InvalidOperation

# ------------------------------------------------------------------------------------------------- reading


def source(cell) -> str:
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def chapters(root: pathlib.Path) -> list[pathlib.Path]:
    """The numbered chapters (book/NN_*.ipynb) that _toc.yml lists, in its order."""
    import yaml

    def files(entries):  # a jb-book toc: chapters, or parts of chapters, each perhaps with sections
        for entry in entries:
            if "file" in entry:
                yield entry["file"]
            yield from files(entry.get("chapters", []) + entry.get("sections", []))

    toc = yaml.safe_load((root / "_toc.yml").read_text())
    listed = [toc["root"], *files(toc.get("chapters", []) + toc.get("parts", []))]
    numbered = [f for f in listed if re.fullmatch(r"book/\d\d_[^/]+", f)]
    return [root / f"{f}.ipynb" for f in numbered if (root / f"{f}.ipynb").exists()]


# ------------------------------------------------------------------------------------------------- masking
# Every span that is not running prose is blanked out with the same number of characters, so that offsets into
# the masked text are offsets into the original (for the sentence shown in a failure).


def _blank(text: str, start: int, end: int, fill: str = " ") -> str:
    span = text[start:end]
    return text[:start] + "".join("\n" if ch == "\n" else fill for ch in span) + text[end:]


FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[^\n]*\n.*?^(?P=indent)(?P=fence)[ \t]*$", re.M | re.S)
COLON_FENCE_LINE = re.compile(r"^[ \t]*:{3,}[^\n]*$", re.M)  # ":::{dropdown} title" and ":::": keep the body
DIRECTIVE_OPTION = re.compile(r"^[ \t]*:[\w-]+:[^\n]*$", re.M)  # ":class: dropdown", ":label: ex-4-1"
HEADING = re.compile(r"^[ \t]{0,3}#{1,6}[ \t][^\n]*$", re.M)
TARGET = re.compile(r"^\([\w-]+\)=[ \t]*$", re.M)  # "(gpu-recording)="
CODE_SPAN = re.compile(r"(`+)(?!`).*?(?<!`)\1(?!`)", re.S)
ROLE = re.compile(r"\{[\w:-]+\}(?=`)")  # the "{cite:t}" before its code span
HTML_COMMENT = re.compile(r"<!--.*?-->", re.S)
HTML_TAG = re.compile(r"</?[A-Za-z][^<>]*>")
LINK_TARGET = re.compile(r"\]\([^)\s]*\)")
URL = re.compile(r"https?://\S+")
DISPLAY_MATH = re.compile(r"\$\$.+?\$\$", re.S)
INLINE_MATH = re.compile(r"(?<![\\$])\$(?!\$)(?P<body>(?:\\.|[^$\\])+?)(?<!\\)\$(?!\$)", re.S)
# A math span that is only a number, perhaps with a percent sign, thin spaces or a thousands separator.
BARE_MATH_NUMBER = re.compile(r"[\s~]*(?:\\[,;:! ]|[\d.{},])+(?:\\?[\s~]*\\?%)?[\s~]*")


def _mask_math(text: str) -> str:
    def bare(body: str) -> bool:
        return bool(re.search(r"\d", body)) and bool(BARE_MATH_NUMBER.fullmatch(body))

    for match in list(DISPLAY_MATH.finditer(text)):
        if not bare(match.group()[2:-2]):
            text = _blank(text, match.start(), match.end(), "~")
    for match in list(INLINE_MATH.finditer(text)):
        if bare(match.group("body")):  # "$0.669$": scanned as prose, without its dollars and braces
            for m in re.finditer(r"\\[,;:! ]|[${}]", match.group()):
                text = _blank(text, match.start() + m.start(), match.start() + m.end())
        else:
            text = _blank(text, match.start(), match.end(), "~")
    return text


def mask(text: str) -> str:
    """The markdown with everything but running prose blanked out (same length, same line breaks)."""
    for pattern in (FENCE, HTML_COMMENT):
        for match in list(pattern.finditer(text)):
            text = _blank(text, match.start(), match.end())
    for match in list(CODE_SPAN.finditer(text)):
        text = _blank(text, match.start(), match.end(), "~")
    for pattern in (ROLE, COLON_FENCE_LINE, DIRECTIVE_OPTION, HEADING, TARGET, HTML_TAG, LINK_TARGET, URL):
        for match in list(pattern.finditer(text)):
            text = _blank(text, match.start(), match.end())
    return _mask_math(text)


# ------------------------------------------------------------------------------------------------- quotes

NUMBER = re.compile(
    r"(?P<num>(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?|\.\d+)"
    r"(?P<after>[ \u00a0\u2009\u202f]?(?:%|per ?cent\b|percent\b|×|times\b)|x(?!\w))?"
)
UNIT = re.compile(
    r"[ \u00a0\u2009\u202f]?(?P<unit>"
    r"(?:[KMGTP]i?B|kB|B|bytes?|tokens|tok|samples|steps|it|FLOPs?|[kMGTP]FLOPs?)/s\b|"
    r"(?:tokens|bytes|samples|steps) a second\b|"
    r"(?:tokens|samples|steps) per second\b|"
    r"[kMGTP]?FLOP/s\b|[GT]FLOPS\b|[kMGTP]?FLOPs?\b|"
    r"[kKMGTP]i?B\b|"
    r"ns\b|µs\b|μs\b|us\b|ms\b|s\b|sec\b|seconds?\b|minutes?\b|min\b|hours?\b|"
    r"GHz\b|MHz\b|pt\b|dpi\b|inch(?:es)?\b|W\b)"
)
SCALED = {  # unit -> the scales at which its number may be written in code: powers of 1000 and of 1024
    "time": [Decimal(10) ** (3 * k) for k in range(-4, 5)],
    "bytes": [Decimal(10) ** (3 * k) for k in range(-4, 5)] + [Decimal(1024) ** k for k in range(-4, 5)],
}
# Words after which a number names a part of a text, not a result: "chapter 3", "exercise 4.3", "Eq. 7".
REFERENCE_WORD = re.compile(
    r"(?:\b(?:chapters?|ch|sections?|sec|exercises?|ex|equations?|eqs?|tables?|figures?|figs?|algorithms?|"
    r"appendix|appendices|theorems?|lemmas?|propositions?|definitions?|steps? of|lines?|pages?|pp?|parts?|"
    r"listings?|cells?)\.?|§)[ \u00a0]*(?:\d+(?:\.\d+)*[ \u00a0]*(?:,|and|or|to|-|–)[ \u00a0]*)*$",
    re.I,
)
# Words after which a number is a version: "torch 2.11", "Python 3.12", "version 1.2", "v0.4".
VERSION_WORD = re.compile(
    r"(?:\b(?:torch|pytorch|python|cuda|cudnn|numpy|triton|jupyter(?: book)?|jupyterlab|notebook|sphinx|myst|"
    r"timm|transformers|jax|scipy|matplotlib|ipywidgets|colab|ubuntu|debian|version|release|versions|v)"
    r"[ \u00a0]*)$",
    re.I,
)
RELATIVE = re.compile(
    r"[ \u00a0]*(?:above|below|more|less|higher|lower|faster|slower|larger|smaller|fewer|over|under|up|down)\b"
)
CITE = re.compile(r"\{cite(?::\w+)?\}`")


@dataclasses.dataclass(frozen=True)
class Quote:
    """A number the prose quotes: its text as written, its value, what makes it a quote, where it is."""

    text: str
    value: Decimal
    decimals: int  # digits after the point as written: 12.20 -> 2
    kind: str  # "decimal", "percent", "multiplier" or "unit"
    unit: str | None
    relative: bool  # "12 % above", "4 % slower": also 1.12, 0.96
    start: int
    end: int
    sentence: str


def _sentence_bounds(masked: str, start: int, end: int) -> tuple[int, int]:
    """The sentence around [start, end): bounded by a blank line, a list item, a table row, or . ! ? before a
    capital."""
    stop = re.compile(r"\n[ \t]*\n|\n[ \t]*(?:[-*+]|\d+\.)[ \t]|\n[ \t]*\||[.!?](?=[ \t\n]+[\"'(*_\[]*[A-Z])")
    left = 0
    for m in stop.finditer(masked, 0, start):
        left = m.end()
    m = stop.search(masked, end)
    right = m.start() + 1 if m else len(masked)
    return left, right


def _value(text: str) -> tuple[Decimal, int] | None:
    clean = text.replace(",", "")
    try:
        value = Decimal(clean)
    except InvalidOperation:
        return None
    mantissa = re.split(r"[eE]", clean)[0]
    decimals = len(mantissa.split(".")[1]) if "." in mantissa else 0
    exponent = int(re.split(r"[eE]", clean)[1]) if re.search(r"[eE]", clean) else 0
    return value, max(decimals - exponent, 0)


def quotes(markdown: str) -> list[Quote]:
    """The quoted numbers of one markdown cell (citing sentences left out)."""
    masked = mask(markdown)
    found = []
    pending_unit = []  # numbers of a range "2.5 to 10 times", "16 to 48 ms": the first takes the second's unit
    for match in NUMBER.finditer(masked):
        start, end = match.span("num")
        before, after = masked[max(0, start - 40) : start], masked[end:]
        if before[-1:].isalnum() or before[-1:] in "_." or (before[-1:] == "-" and before[-2:-1].isalpha()):
            continue  # glued to a word: H200, float16, top-2, ex-4-1
        if before[-1:] in "/" and before[-2:-1].isalnum():
            continue  # a path or a ratio of names, "claims/heads"
        if re.match(r"\.\d|[A-Za-z_]", masked[end:]) and not match.group("after"):
            if not UNIT.match(after):
                continue  # "1.2.3" (a version), "2D", "3rd", "64k"
        if REFERENCE_WORD.search(before) or VERSION_WORD.search(before) or re.search(r"arxiv\W{0,3}$", before, re.I):
            continue
        parsed = _value(match.group("num"))
        if parsed is None:
            continue
        value, decimals = parsed
        kind, unit = None, None
        suffix = (match.group("after") or "").strip()
        if suffix in ("x", "×") and re.match(r"\s*\d", masked[match.end() :]):
            continue  # a shape, "2 x 2"
        unit_match = UNIT.match(after)
        if suffix == "%" or suffix.startswith("per"):
            kind = "percent"
        elif suffix in ("x", "×", "times"):
            kind = "multiplier"
        elif unit_match:
            kind, unit = "unit", unit_match.group("unit")
        elif re.search(r"\bfactor of[ \u00a0]*$", before):
            kind = "multiplier"
        elif "." in match.group("num") or re.search(r"[eE]", match.group("num")):
            kind = "decimal"
        if kind is None:  # a bare integer: counted, a quote only as the first end of a range "16 to 48 ms"
            pending_unit.append((match, value, decimals))
            continue
        for first, first_value, first_decimals in pending_unit[-1:] if kind != "decimal" else []:
            between = masked[first.end("num") : start]
            if re.fullmatch(r"[ \u00a0]*(?:-|–|to|and|or)[ \u00a0]*", between):
                found.append((first, first_value, first_decimals, kind, unit))
        pending_unit = []
        found.append((match, value, decimals, kind, unit))
    out = []
    for match, value, decimals, kind, unit in found:
        start, end = match.span("num")
        left, right = _sentence_bounds(masked, start, end)
        sentence = markdown[left:right]
        if CITE.search(sentence):
            continue  # a paper's claim, marked by its citation
        out.append(
            Quote(
                text=match.group().strip(),
                value=value,
                decimals=decimals,
                kind=kind,
                unit=unit,
                relative=kind == "percent" and bool(RELATIVE.match(masked, match.end())),
                start=start,
                end=end,
                sentence=" ".join(sentence.split()),
            )
        )
    return out


# ------------------------------------------------------------------------------------------------- code


LITERAL_NUMBER = r"(?<![\w.])\d+(?:\.\d+)?(?:[eE][-+]?\d+)?(?![\w.])"


def code_literals(code: str) -> set[Decimal]:
    """The numeric literals of a code cell: numbers, and strings that are a number ("0.5"); not comments, not
    text in strings, not the digits argument of round()."""
    lines = [line for line in code.splitlines() if not line.lstrip().startswith(("%", "!"))]
    try:
        tree = ast.parse("\n".join(lines))
    except SyntaxError:  # not Python: the numbers of its text, comments aside
        text = re.sub(r"#[^\n]*", "", code)
        return {parsed[0] for parsed in map(_value, re.findall(LITERAL_NUMBER, text)) if parsed}
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "round":
            skip.update(id(a) for a in node.args[1:])
            skip.update(id(k.value) for k in node.keywords if k.arg == "ndigits")
        if isinstance(node, ast.JoinedStr):  # an f-string's text and format specs are printed text
            skip.update(id(n) for n in ast.walk(node) if isinstance(n, ast.Constant))
    compared = set()  # strings an assert compares: assert f"{a:.2f} {b:.2f}" == "3.13 3.03"
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assert, ast.Compare)):
            test = node.test if isinstance(node, ast.Assert) else node
            compared.update(id(n) for n in ast.walk(test) if isinstance(n, ast.Constant))
    found = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Constant) or id(node) in skip or isinstance(node.value, bool):
            continue
        if isinstance(node.value, (int, float)):
            texts = [repr(abs(node.value))]
        elif isinstance(node.value, str) and (id(node) in compared or re.fullmatch(LITERAL_NUMBER, node.value.strip())):
            texts = re.findall(LITERAL_NUMBER, node.value)
        else:
            continue
        found.update(parsed[0] for parsed in map(_value, texts) if parsed)
    return found


def _rounds_to(literal: Decimal, value: Decimal, decimals: int, extra: int = 0) -> bool:
    """Whether the literal is the value, or rounds to it at the quoted decimals (ties either way: the bounds of
    a band check 0.295 < x < 0.315 round to 0.30 and 0.31). An integer quote needs the exact integer; extra are
    the decimals a fraction carries beyond its percentage (0.127 for "13 %")."""
    if literal == value:
        return True
    if decimals + extra == 0:
        return False
    quantum = Decimal(1).scaleb(-(decimals + extra))
    scaled = literal.scaleb(-extra) if extra else literal
    target = value.scaleb(-extra) if extra else value
    return any(scaled.quantize(quantum, rounding=r) == target for r in (ROUND_HALF_UP, ROUND_HALF_DOWN))


def matches(quote: Quote, literals: set[Decimal]) -> bool:
    """Whether one of the literals is the quoted number, in one of its normalised forms."""
    for literal in literals:
        if quote.kind == "percent":  # "13 %": 13, 0.13; "12 % above" 1.12; "4 % below" 0.96
            shifted = (literal - 1, 1 - literal) if quote.relative else ()
            forms = [(literal, 0)] + [(x * 100, 2) for x in (literal, *shifted) if x > 0]
        elif quote.kind == "unit":  # "0.03 ms": 0.03, 3e-5, 30
            binary = re.fullmatch(r"[kKMGTP]i?B", quote.unit)
            forms = [(literal / scale, 0) for scale in SCALED["bytes" if binary else "time"]]
        else:
            forms = [(literal, 0)]
        for form, extra in forms:
            if _rounds_to(form, quote.value, quote.decimals, extra):
                return True
    return False


# ------------------------------------------------------------------------------------------------- chapters

SUMMARY = re.compile(r"what to take away", re.I)
SECTION_HEADING = re.compile(r"^[ \t]{0,3}(#{1,2})[ \t]+([^\n]*)$", re.M)


@dataclasses.dataclass(frozen=True)
class Finding:
    cell: int
    quote: Quote
    section: str
    elsewhere: tuple[int, ...] = ()  # check cells of other sections that have it

    def __str__(self) -> str:
        sentence = self.quote.sentence
        if len(sentence) > 150:  # keep the number in view
            at = sentence.find(self.quote.text)
            lo = max(0, at - 70)
            sentence = ("..." if lo else "") + sentence[lo : lo + 150] + "..."
        cells = ", ".join(map(str, self.elsewhere))
        hint = f" [the same number is in another section's check: cell {cells}]" if self.elsewhere else ""
        return f'cell {self.cell}: {self.quote.text!r} in "{sentence}"{hint}'


def _segments(cells):
    """(cell index, cell, section, text) for every cell, a markdown cell split at its ## headings; a section is
    (its number, its title), (0, "") the opening above the first ## heading."""
    section = (0, "")
    for i, cell in enumerate(cells):
        text = source(cell)
        if cell["cell_type"] != "markdown":
            yield i, cell, section, text
            continue
        last = 0
        for m in SECTION_HEADING.finditer(_unfenced(text)):
            yield i, cell, section, text[last : m.start()]
            if len(m.group(1)) == 2 or section[0]:  # the title (#) opens the opening
                section = (section[0] + 1, m.group(2).strip())
            last = m.start()
        yield i, cell, section, text[last:]


def _unfenced(text: str) -> str:
    for match in list(FENCE.finditer(text)):
        text = _blank(text, match.start(), match.end())
    return text


def _is_check(cell, text: str) -> bool:
    """A folded check or a solution: tagged hide-input, or titled "# @title Check: ..." / "# @title Solution"."""
    tagged = "hide-input" in cell.get("metadata", {}).get("tags", [])
    return tagged or bool(re.match(r"#\s?@title (?:Check:|Solution)", text))


def unasserted(notebook: dict) -> list[Finding]:
    """The quoted numbers of a chapter that no code cell of their section (or the setup) has as a literal."""
    segments = list(_segments(notebook["cells"]))
    by_section: dict[tuple[int, str], set[Decimal]] = {}
    by_cell: dict[int, set[Decimal]] = {}
    for i, cell, section, text in segments:
        if cell["cell_type"] == "code":
            by_cell[i] = code_literals(text)
            by_section.setdefault(section, set()).update(by_cell[i])
    everywhere = set().union(*by_cell.values())
    checks = {i for i, cell, _, text in segments if cell["cell_type"] == "code" and _is_check(cell, text)}
    setup = by_section.get((0, ""), set())
    findings, seen = [], set()
    for i, cell, section, text in segments:
        if cell["cell_type"] != "markdown":
            continue
        summary = section == (0, "") or SUMMARY.search(section[1])
        literals = everywhere if summary else by_section.get(section, set()) | setup
        for quote in quotes(text):
            if matches(quote, literals) or (i, quote.text) in seen:
                continue
            seen.add((i, quote.text))
            specific = len(quote.value.normalize().as_tuple().digits) >= 2  # 0.65, 33; not 0.9, 3: too common
            elsewhere = tuple(j for j in checks if specific and matches(quote, by_cell[j]))
            findings.append(Finding(i, quote, section[1] or "opening", elsewhere))
    return findings


def report(findings_by_chapter: dict[str, list[Finding]]) -> str:
    lines = []
    for name, findings in findings_by_chapter.items():
        if findings:
            lines.append(f"{name}: {len(findings)} quoted number(s) that no check asserts")
            lines += [f"  {f}" for f in findings]
    return "\n".join(lines)


def load(path: pathlib.Path) -> dict:
    return json.loads(path.read_text())
