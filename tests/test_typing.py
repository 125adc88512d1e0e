"""The package's types reach its users: it ships py.typed, and mypy catches a user's mistakes with them."""

import importlib.resources
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
USER_FILE = Path(__file__).resolve().parent / "data" / "typing_user.py"
MARK = re.compile(r"#\s*expect-error\s*$")
ERROR = re.compile(r"^(?P<path>[^:]+):(?P<line>\d+): error: (?P<message>.*)$")


def test_py_typed_is_shipped_inside_the_package():
    """PEP 561: without py.typed a type checker treats the installed package as untyped (every name Any). Under
    `make wheel-test` this checks the installed wheel."""
    marker = importlib.resources.files("attnbook") / "py.typed"
    assert marker.is_file(), f"{marker} is missing: the package's types would not reach its users"


@pytest.mark.slow
def test_mypy_reports_exactly_the_marked_mistakes_of_a_user_file():
    """mypy --strict, with the project's configuration, reports an error on every line of tests/data/typing_user.py
    marked `# expect-error` (a tensor for an int, a wrong keyword, a str for is_causal, the tuple of
    return_flows=True or output_final_state=True used as a tensor, a state of the wrong kind, a misspelt field,
    ...) and on no other line: the correct uses in the same file type-check. The library's own modules are followed
    silently, as mypy treats an installed package (`make lint` checks them)."""
    api = pytest.importorskip("mypy.api")  # make wheel-test installs it; a venv without mypy skips
    lines = USER_FILE.read_text().splitlines()
    marked = {i for i, line in enumerate(lines, start=1) if MARK.search(line)}
    assert len(marked) >= 6, "the user file must hold at least six deliberate mistakes"
    stdout, stderr, status = api.run(
        [
            "--config-file",
            str(ROOT / "pyproject.toml"),
            "--cache-dir",
            str(ROOT / "_build" / "mypy-cache" / "typing_user"),
            "--strict",
            "--follow-imports=silent",
            "--no-error-summary",
            str(USER_FILE),
        ]
    )
    assert status in (0, 1), f"mypy did not run (exit status {status}):\n{stderr}{stdout}"
    errors = [m for m in map(ERROR.match, stdout.splitlines()) if m]
    elsewhere = [m.group(0) for m in errors if Path(m.group("path")).resolve() != USER_FILE]
    assert not elsewhere, "mypy reported errors outside the user file:\n" + "\n".join(elsewhere)
    reported = {int(m.group("line")) for m in errors}
    missed = sorted(marked - reported)
    extra = sorted(reported - marked)
    assert not missed, "mypy missed the marked mistakes on lines " + ", ".join(
        f"{i}: {lines[i - 1].strip()}" for i in missed
    )
    assert not extra, "mypy reported errors on unmarked lines:\n" + "\n".join(
        m.group(0) for m in errors if int(m.group("line")) in extra
    )
