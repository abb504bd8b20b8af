"""Every example in a docstring of normaudit runs and prints what it shows (``doctest``): the examples are
documentation a reader copies, so a stale one is a bug."""
from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import normaudit

MODULES = sorted(m.name for m in pkgutil.walk_packages(normaudit.__path__, "normaudit.")
                 if not m.name.endswith("__main__"))


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples of {name} failed"


def test_the_examples_are_found():
    finder = doctest.DocTestFinder()
    examples = sum(len(t.examples) for n in MODULES for t in finder.find(importlib.import_module(n)))
    assert examples >= 50, examples
