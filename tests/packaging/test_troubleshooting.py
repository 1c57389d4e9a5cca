"""docs/troubleshooting.md has a row for every condition reason and Event reason the operator can report.

The reasons are read from the operator's source with `ast`, so a new one fails this test until it
is documented, wherever it is written and however it is named:
- a string given for a parameter or dataclass field named `reason` (`set_cond(..., "Merged", ...)`,
  `Verdict(False, "MetricMissing", ...)`, `reason=...`), including the branches of `a if c else b`
  and `x or "Default"`, and the strings assigned to a local name or a module constant passed there
  (`MERGED` or `reasons.MERGED`);
- the reason of an Event tuple `("Normal" | "Warning", reason, message)`;
- the reason of a `(reason, message)` pair returned by a function annotated `-> tuple[str, str]`;
- the reason of the kstatus conditions (`("Ready" | "Reconciling" | "Stalled", value, reason, message)`,
  the type written out or as a constant);
- every phase, which is the reason of the phase-change Events and of the kstatus conditions.
"""

from __future__ import annotations

import ast
import re

from scripts.manifests import ROOT

from gemma_operator import api, crd

OPERATOR = ROOT / "operator" / "gemma_operator"
SEVERITIES = {"Normal", "Warning"}  # Event types (core/v1 Event.type)
KSTATUS = {"Ready", "Reconciling", "Stalled"}


def _strings(node: ast.AST, assigned: dict[str, list[ast.AST]], seen: frozenset[str] = frozenset()) -> set[str]:
    """The string constants an expression can evaluate to, following local names."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value} if node.value else set()
    if isinstance(node, ast.IfExp):
        return _strings(node.body, assigned, seen) | _strings(node.orelse, assigned, seen)
    if isinstance(node, ast.BoolOp):
        return set().union(*(_strings(v, assigned, seen) for v in node.values))
    name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None
    if name and name not in seen:
        return set().union(set(), *(_strings(v, assigned, seen | {name}) for v in assigned.get(name, [])))
    return set()


def _reason_positions(trees: list[ast.Module]) -> dict[str, int]:
    """{callable name: position of its `reason` argument} for functions and dataclass-like classes."""
    out = {}
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                names = [a.arg for a in node.args.args if a.arg != "self"]
                if "reason" in names:
                    out[node.name] = names.index("reason")
            elif isinstance(node, ast.ClassDef):
                fields = [
                    s.target.id for s in node.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
                ]
                if "reason" in fields:
                    out[node.name] = fields.index("reason")
    return out


def _assignments(function: ast.AST) -> dict[str, list[ast.AST]]:
    out: dict[str, list[ast.AST]] = {}
    for node in ast.walk(function):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    out.setdefault(target.id, []).append(node.value)
    return out


def _module_constants(trees: list[ast.Module]) -> dict[str, list[ast.AST]]:
    """Module-level `NAME = "..."` (annotated or not) of every module, so that `reasons.MERGED` or `MERGED` resolve."""
    out: dict[str, list[ast.AST]] = {}
    for tree in trees:
        for node in tree.body:
            targets = (
                node.targets
                if isinstance(node, ast.Assign)
                else [node.target]
                if isinstance(node, ast.AnnAssign)
                else []
            )
            if isinstance(getattr(node, "value", None), ast.Constant):  # NAME = "..." or NAME: Final = "..."
                for target in targets:
                    if isinstance(target, ast.Name):
                        out.setdefault(target.id, []).append(node.value)
    return out


def _reasons_in(function: ast.AST, positions: dict[str, int], constants: dict[str, list[ast.AST]]) -> set[str]:
    found: set[str] = set()
    returns_pair = "tuple[str, str]" in ast.unparse(getattr(function, "returns", None) or ast.Constant(""))
    assigned = {**constants, **_assignments(function)}
    for node in ast.walk(function):
        if isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            args = [k.value for k in node.keywords if k.arg == "reason"]
            if name in positions and len(node.args) > positions[name]:
                args.append(node.args[positions[name]])
            for arg in args:
                found |= _strings(arg, assigned)
        elif isinstance(node, ast.Tuple) and node.elts:
            head = _strings(node.elts[0], constants)  # a literal or a named constant (reasons.READY)
            if len(node.elts) == 3 and head and head <= SEVERITIES:
                found |= _strings(node.elts[1], assigned)
            elif len(node.elts) == 4 and head and head <= KSTATUS:
                found |= _strings(node.elts[2], assigned)
        elif isinstance(node, ast.Return) and returns_pair and isinstance(node.value, ast.Tuple):
            found |= _strings(node.value.elts[0], assigned)
    return found


def collect(trees: list[ast.Module]) -> set[str]:
    """Every reason the code in these modules can report."""
    positions, constants = _reason_positions(trees), _module_constants(trees)
    found: set[str] = set()
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                found |= _reasons_in(node, positions, constants)
    return found


def operator_reasons() -> set[str]:
    found = collect([ast.parse(p.read_text(), str(p)) for p in sorted(OPERATOR.rglob("*.py"))])
    for kind in api.KINDS.values():
        status = crd.crd(kind)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
        found |= set(status["properties"]["phase"]["enum"])
    return found


def documented_reasons() -> set[str]:
    text = (ROOT / "docs" / "troubleshooting.md").read_text()
    return {
        m for line in text.splitlines() if line.startswith("| `") for m in re.findall(r"`(\w+)`", line.split("|")[1])
    }


def test_the_collector_finds_reasons_of_each_form():
    found = operator_reasons()
    # a parameter (set_cond), a dataclass field (Verdict), an Event tuple, a (reason, message) pair,
    # a local name, a `x or "Default"`, the kstatus conditions and a phase
    assert {"Merged", "MetricMissing", "NewRun", "FineTuneNotFound", "FineTuneFailed", "TrainingFailed"} <= found
    assert {"Reconciled", "Stalled", "WaitingForModel"} <= found


def test_the_collector_follows_reasons_moved_into_constants():
    reasons = ast.parse('MERGED = "Merged"\nGATE_PASSED = "GatePassed"\n')
    lifecycle = ast.parse(
        "def set_cond(view, st, type_, value, reason, message): ...\n"
        "def merged(v, st, d):\n"
        "    set_cond(v, st, 'Merged', True, reasons.MERGED, '')\n"
        "    d.events.append(('Normal', GATE_PASSED, 'run 1 passes'))\n"
    )
    assert collect([reasons, lifecycle]) == {"Merged", "GatePassed"}


def test_every_reason_is_in_troubleshooting():
    missing = operator_reasons() - documented_reasons()
    assert not missing, f"reasons docs/troubleshooting.md does not explain: {sorted(missing)}"


def test_troubleshooting_explains_no_reason_the_operator_never_reports():
    # A Job's own failure reason is passed through as the fine-tune's (batch/v1 JobReasonPodFailurePolicy).
    passed_through = {"PodFailurePolicy"}
    extra = documented_reasons() - operator_reasons() - passed_through
    assert not extra, f"docs/troubleshooting.md rows for reasons the operator does not report: {sorted(extra)}"
