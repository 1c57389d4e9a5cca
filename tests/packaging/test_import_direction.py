"""The allowed direction of imports (docs/architecture.md), read from the source with `ast`:
every import counts, a lazy one inside a function too.

- the operator never imports the ML stack nor the local cluster, and of the workloads only
  their contract (gemma_workloads.config, pydantic only);
- the API (the api package) imports pydantic, the standard library, its own modules and the
  contract modules only;
- the workloads never import the operator or the local cluster, and their contract is pydantic only;
- the workloads' programs (training/, merging/) never import each other, and of the shared modules
  only the runner imports them (and the pre-flight check the reader of the LoRA checkpoint);
- inside the operator, each layer imports only its own and the layers below, with no cycle.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest
from scripts.manifests import ROOT

SOURCES = {
    "gemma_operator": ROOT / "operator",
    "gemma_workloads": ROOT / "workloads",
    "gemma_devcluster": ROOT / "devcluster",
}
ML_STACK = {
    "jax",
    "jaxlib",
    "flax",
    "optax",
    "tunix",
    "qwix",
    "orbax",
    "torch",
    "transformers",
    "safetensors",
    "tokenizers",
}
# The operator's layers, lowest first; a module not named here is in the foundation (types, facts, I/O helpers).
OPERATOR_LAYERS = [
    ("foundation", ()),
    ("plan", ("gemma_operator.plan",)),
    ("children", ("gemma_operator.children",)),
    ("lifecycles", ("gemma_operator.lifecycle", "gemma_operator.plan_text", "gemma_operator.plan_compare")),
    ("reconcile", ("gemma_operator.reconcile", "gemma_operator.reading", "gemma_operator.observed")),
    ("runner", ("gemma_operator.runner",)),
    ("command line", ("gemma_operator.cli",)),
]
WORKLOAD_PROGRAMS = ("gemma_workloads.training", "gemma_workloads.merging")
# The shared modules that import a program, and what of it.
PROGRAM_IMPORTERS = {
    "gemma_workloads.runner": WORKLOAD_PROGRAMS,
    "gemma_workloads.preflight": (
        "gemma_workloads.merging.checkpoint_reader",
        "gemma_workloads.training.evaluation.rows",
    ),
}
API_MAY_IMPORT = {
    "pydantic",
    "gemma_workloads.config",
    "gemma_operator.vllm_flags",
    "gemma_operator.tpu",
    "gemma_operator.model_shapes",
    "gemma_operator.reasons",
}


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, module: str) -> set[str]:
    """Every module `path` imports, `from a import b` as a.b when a.b is a module of ours."""
    out = set()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else [])
                )
            if base == "__future__":
                continue
            submodules = {f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in MODULES}
            out |= submodules if len(submodules) == len(node.names) else submodules | {base}
    return out


MODULES = {_module_name(p, root): p for pkg, root in SOURCES.items() for p in (root / pkg).rglob("*.py")}
IMPORTS = {m: _imports(p, m) for m, p in MODULES.items()}


def _top(name: str) -> str:
    return name.partition(".")[0]


def _within(name: str, prefixes) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def of(package: str) -> list[str]:
    """The modules of a package (`gemma_operator`) or of one of its subpackages (`gemma_operator.api`)."""
    return sorted(m for m in MODULES if _within(m, (package,)))


def test_every_package_is_read():
    assert {
        "gemma_operator.api",
        "gemma_operator.plan.finetune",
        "gemma_workloads.config",
        "gemma_devcluster.dev",
        "gemma_workloads.training.trainer",
        "gemma_workloads.merging.merger",
    } <= set(MODULES)


@pytest.mark.parametrize("module", of("gemma_operator"))
def test_the_operator_imports_no_ml_stack_no_local_cluster_and_only_the_workloads_contract(module):
    wrong = sorted(
        i
        for i in IMPORTS[module]
        if _top(i) in ML_STACK | {"gemma_devcluster", "kmock"}
        or (_top(i) == "gemma_workloads" and i != "gemma_workloads.config")
    )
    assert not wrong, f"{module} imports {wrong}"


@pytest.mark.parametrize("module", [*of("gemma_operator.api"), "gemma_operator.vllm_flags"])
def test_the_api_imports_pydantic_the_standard_library_and_the_contract_only(module):
    wrong = sorted(
        i
        for i in IMPORTS[module]
        if _top(i) not in sys.stdlib_module_names
        and i not in API_MAY_IMPORT
        and not _within(i, ("pydantic", "gemma_operator.api"))
    )
    assert not wrong, f"{module} imports {wrong}"


@pytest.mark.parametrize("module", of("gemma_workloads"))
def test_the_workloads_never_import_the_operator_or_the_local_cluster(module):
    assert not [i for i in IMPORTS[module] if _top(i) in ("gemma_operator", "gemma_devcluster")]


@pytest.mark.parametrize("module", of("gemma_workloads"))
def test_training_and_merging_never_import_each_other_and_only_the_runner_imports_them(module):
    allowed = tuple(p for p in WORKLOAD_PROGRAMS if _within(module, (p,))) + PROGRAM_IMPORTERS.get(module, ())
    wrong = sorted(i for i in IMPORTS[module] if _within(i, WORKLOAD_PROGRAMS) and not _within(i, allowed))
    assert not wrong, f"{module} imports {wrong}"


def test_the_contract_is_pydantic_only():
    """The operator imports it: it must never pull JAX into the operator's image."""
    wrong = [
        i for i in IMPORTS["gemma_workloads.config"] if _top(i) not in sys.stdlib_module_names | {"pydantic", "yaml"}
    ]
    assert not wrong, wrong


def _layer(module: str) -> int:
    return max([i for i, (_, prefixes) in enumerate(OPERATOR_LAYERS) if _within(module, prefixes)] or [0])


@pytest.mark.parametrize("module", of("gemma_operator"))
def test_operator_layers_import_only_downwards(module):
    upward = sorted(
        i for i in IMPORTS[module] if _top(i) == "gemma_operator" and i in MODULES and _layer(i) > _layer(module)
    )
    assert not upward, f"{module} ({OPERATOR_LAYERS[_layer(module)][0]}) imports a higher layer: {upward}"


def test_no_import_cycle():
    ours = {m: {i for i in IMPORTS[m] if i in MODULES and i != m} for m in MODULES}
    # A module importing its own package (whose __init__ hands the module's names on) is no cycle.
    state: dict[str, int] = {}

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for n in sorted(ours[m]):
            if state.get(n) == 1 and not m.startswith(n + "."):
                raise AssertionError("import cycle: " + " -> ".join(path[path.index(n) :] + [n]))
            if n not in state:
                visit(n, path + [n])
        state[m] = 2

    for m in sorted(MODULES):
        if m not in state:
            visit(m, [m])
