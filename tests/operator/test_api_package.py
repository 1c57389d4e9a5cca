"""The api package hands on every public name its modules define: the rest of the operator reads each
type as `api.Name`, so a type added to one module and not to api/__init__.py is caught here, not by
the first module that needs it. Read with `ast`: a name counts where a module assigns or defines it
at its top level (either branch of an `if TYPE_CHECKING` too), not where it imports it."""

from __future__ import annotations

import ast
import importlib
import pkgutil
from pathlib import Path

import pytest

from gemma_operator import api

MODULES = sorted(f"{api.__name__}.{m.name}" for m in pkgutil.iter_modules(api.__path__))


def _defined(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.If):
            names |= _defined(ast.Module(body=node.body + node.orelse, type_ignores=[]))
        elif isinstance(node, ast.ClassDef | ast.FunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return {n for n in names if not n.startswith("_")}


def test_the_api_has_one_module_per_part():
    assert {m.rpartition(".")[2] for m in MODULES} >= {"common", "finetune", "serve"}


@pytest.mark.parametrize("module", MODULES)
def test_every_public_name_a_module_defines_is_handed_on_by_the_api(module):
    loaded = importlib.import_module(module)
    defined = _defined(ast.parse(Path(loaded.__file__ or "").read_text()))
    assert defined, f"{module} defines nothing"
    missing = sorted(defined - set(api.__all__))
    assert not missing, f"{module} defines {missing}: add them to gemma_operator/api/__init__.py"
    assert all(getattr(api, n) is getattr(loaded, n) for n in defined)


def test_every_name_the_api_hands_on_exists():
    assert [n for n in api.__all__ if not hasattr(api, n)] == []
