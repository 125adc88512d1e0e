"""The examples in the docstrings: every one runs and gives what it shows, and every public name has one."""

import doctest
import importlib
import inspect

import pytest

# The modules a library user reads: the package, the modules that define its names, and the public submodules.
MODULES = [
    "attnbook",
    "attnbook._module",
    "attnbook.softmax",
    "attnbook.linear",
    "attnbook.flow",
    "attnbook.mobile",
    "attnbook.moh",
    "attnbook.feature_maps",
    "attnbook.mechanisms",
    "attnbook.reference",
    "attnbook.lm",
    "attnbook.decoding",
    "attnbook.testing",
    "attnbook.config",
]
# The namespaces whose __all__ is the public API.
PUBLIC = [
    "attnbook",
    "attnbook.mechanisms",
    "attnbook.reference",
    "attnbook.feature_maps",
    "attnbook.lm",
    "attnbook.decoding",
    "attnbook.testing",
    "attnbook.config",
]
# Public names whose module is being changed by someone else: an example is still owed (strict: once one is
# there, the test passes and says to remove the name from this set).
OWED: dict[str, str] = {}
FLAGS = doctest.NORMALIZE_WHITESPACE | doctest.ELLIPSIS


def _doctests():
    finder = doctest.DocTestFinder()
    for name in MODULES:
        module = importlib.import_module(name)
        for test in finder.find(module, name):
            if test.examples:
                yield pytest.param(test, id=test.name)


def _public_objects():
    for name in PUBLIC:
        module = importlib.import_module(name)
        for attr in module.__all__:
            obj = getattr(module, attr)
            if inspect.ismodule(obj) or inspect.isclass(obj) or inspect.isfunction(obj):  # data has no docstring
                qualname = f"{name}.{attr}"
                marks = [pytest.mark.xfail(strict=True, reason=OWED[qualname])] if qualname in OWED else []
                yield pytest.param(obj, id=qualname, marks=marks)


@pytest.mark.parametrize("test", list(_doctests()))
def test_docstring_example_runs_and_shows_what_it_prints(test):
    """Each docstring's examples, run as doctests: every statement runs and every printed value is the one shown."""
    report = []
    runner = doctest.DocTestRunner(optionflags=FLAGS)
    result = runner.run(test, out=report.append, clear_globs=True)
    assert result.attempted > 0
    assert result.failed == 0, "".join(report)


@pytest.mark.parametrize("obj", list(_public_objects()))
def test_every_public_name_has_an_example(obj):
    """Every public module, class and function (the __all__ of the package and its public submodules) has an
    example in its own docstring."""
    assert ">>>" in (obj.__doc__ or ""), f"{obj.__name__} has no example (an 'Example:' section with >>> lines)"
