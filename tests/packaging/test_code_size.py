"""The operator's code stays readable in one sitting: no file of the operator package over 450 lines
and no function over 60. Measured with `ast`: a function's length is from its `def` line to its last
line (its decorators not counted; a method and a function nested in another count as functions of
their own, and each is counted inside the one that holds it too). A file's length is its line count."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from scripts.manifests import ROOT

PACKAGE = ROOT / "operator" / "gemma_operator"
MAX_FILE_LINES = 450
MAX_FUNCTION_LINES = 60
FILES = sorted(PACKAGE.rglob("*.py"))


def _name(path: Path) -> str:
    return str(path.relative_to(ROOT))


def function_lengths(source: str) -> dict[str, int]:
    """Each function's (and method's) lines, `def` to last line, by its dotted name in the module."""
    lengths: dict[str, int] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                # ast gives a decorated def's own line as lineno (the decorators have theirs).
                lengths[prefix + child.name] = (child.end_lineno or child.lineno) - child.lineno + 1
                visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, prefix)

    visit(ast.parse(source), "")
    return lengths


def test_the_measure_counts_from_the_def_line_to_the_last_line():
    source = "@decorator\n@another(1)\ndef f(\n    a,\n):\n    x = 1\n\n    return x\n\n\nclass C:\n    def m(self):\n        pass\n"
    assert function_lengths(source) == {"f": 6, "C.m": 2}


def test_the_package_is_read():
    assert PACKAGE / "api" / "__init__.py" in FILES and PACKAGE / "reconcile.py" in FILES


@pytest.mark.parametrize("path", FILES, ids=_name)
def test_no_file_of_the_operator_is_over_450_lines(path):
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_FILE_LINES, f"{_name(path)} has {lines} lines: split it by meaning"


@pytest.mark.parametrize("path", FILES, ids=_name)
def test_no_function_of_the_operator_is_over_60_lines(path):
    long = {f: n for f, n in function_lengths(path.read_text()).items() if n > MAX_FUNCTION_LINES}
    assert not long, f"{_name(path)}: functions over {MAX_FUNCTION_LINES} lines: {long}"
