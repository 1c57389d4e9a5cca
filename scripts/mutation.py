"""Mutation testing of the operator's pure core against each module's own fast tests (run by hand,
never in CI: it runs the tests once per mutant).

    python scripts/mutation.py                      # every module, 40 mutants each
    python scripts/mutation.py --sample 0 fit.py    # every mutant of fit.py

Uses cosmic-ray (pinned below), installed by this script into .venv-mutation. Each module's mutants
are sampled evenly (every k-th of cosmic-ray's list, so a rerun draws the same ones), each is applied
to the working tree in turn and the module's fast tests run against it; a mutant survives when they
pass. Survivors listed in mutation_equivalent.txt (beside this script: "path | operator | source
line | why"; the operator may be a glob) are equivalent mutants, left out of the score. Prints each module's score and every
other survivor's diff; exits 1 when a module scores below --target.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import subprocess
import sys
import tempfile
import venv
from fnmatch import fnmatch
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COSMIC_RAY = "cosmic-ray==8.7.0"
TOOL_VENV = ROOT / ".venv-mutation"
EQUIVALENT = Path(__file__).with_name("mutation_equivalent.txt")

# module -> its fast tests (no servers, no training)
MODULES: dict[str, list[str]] = {
    "operator/gemma_operator/rollout_gate.py": ["tests/operator/test_rollout_gate.py"],
    "workloads/gemma_workloads/merging/lora_mapping.py": ["tests/workloads/merging/test_lora_mapping.py"],
    "operator/gemma_operator/plan/finetune.py": [
        "tests/operator/plan/test_plan.py",
        "tests/operator/plan/test_remat_choice.py",
        "tests/operator/plan/test_host_memory.py",
        "tests/operator/plan/test_plan_schedule.py",
    ],
    "operator/gemma_operator/lifecycle/finetune.py": [
        "tests/operator/lifecycle/test_lifecycle_tables.py",
        "tests/operator/lifecycle/test_lifecycle_accounting.py",
        "tests/operator/lifecycle/test_chip_hours.py",
    ],
    "operator/gemma_operator/failure_policy.py": [
        "tests/operator/test_failure_policy_tables.py",
        "tests/operator/lifecycle/test_lifecycle_accounting.py",
    ],
    "operator/gemma_operator/fit.py": [
        "tests/operator/test_fit_hand_checked.py",
        "tests/operator/plan/test_remat_choice.py",
        "tests/operator/plan/test_plan.py",
    ],
}

_SAMPLE = """
import json
import sys
from cosmic_ray.work_db import WorkDB, use_db
from cosmic_ray.work_item import WorkResult, WorkerOutcome
keep, unread = int(sys.argv[2]), json.loads(sys.argv[3])
with use_db(sys.argv[1], WorkDB.Mode.open) as db:
    def place(w):
        m = w.mutations[0]
        return str(m.module_path), m.start_pos, m.operator_name, m.occurrence
    def in_annotation(w):
        return any(tuple(s) <= tuple(w.mutations[0].start_pos) < tuple(e) for s, e in unread)
    items = sorted(db.pending_work_items, key=place)
    db.set_multiple_results(
        [w.job_id for w in items if in_annotation(w)], WorkResult(worker_outcome=WorkerOutcome.SKIPPED)
    )
    items = [w for w in items if not in_annotation(w)]
    if 0 < keep < len(items):
        step = len(items) / keep
        chosen = {items[int(i * step)].job_id for i in range(keep)}
        skipped = [w.job_id for w in items if w.job_id not in chosen]
        db.set_multiple_results(skipped, WorkResult(worker_outcome=WorkerOutcome.SKIPPED))
"""


def tool_python() -> Path:
    python = TOOL_VENV / "bin" / "python"
    if not (TOOL_VENV / "bin" / "cosmic-ray").exists():
        venv.create(TOOL_VENV, with_pip=True)
        subprocess.run([python, "-m", "pip", "install", "-q", COSMIC_RAY], check=True)
    return python


def unread_annotations(source: str) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """(start, end) of the annotations Python never evaluates: every one of a function, of a module
    variable and of a dataclass field in a module with `from __future__ import annotations` (PEP 563).
    A mutant there is equivalent, so it is left out before sampling rather than tested."""
    tree = ast.parse(source)
    future = [a.name for n in tree.body if isinstance(n, ast.ImportFrom) and n.module == "__future__" for a in n.names]
    if "annotations" not in future:
        return []
    nodes: list[ast.expr] = [n.annotation for n in tree.body if isinstance(n, ast.AnnAssign)]
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args
            every = [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]
            nodes += [a.annotation for a in every if a is not None and a.annotation is not None]
            nodes += [node.returns] if node.returns is not None else []
        elif isinstance(node, ast.ClassDef) and any("dataclass" in ast.unparse(d) for d in node.decorator_list):
            nodes += [f.annotation for f in node.body if isinstance(f, ast.AnnAssign)]
    return [((n.lineno, n.col_offset), (n.end_lineno or n.lineno, n.end_col_offset or 0)) for n in nodes]


def equivalents() -> set[tuple[str, str, str]]:
    out = set()
    for line in EQUIVALENT.read_text().splitlines() if EQUIVALENT.exists() else []:
        if line.strip() and not line.startswith("#"):
            path, operator, rest = line.split(" | ", 2)
            source = rest.rsplit(" | ", 1)[0]  # the source line may hold " | " itself; the reason may not
            out.add((path.strip(), operator.strip(), source.strip()))
    return out


def run_module(module: str, tests: list[str], sample: int, timeout: float) -> dict:
    python = tool_python()
    pythonpath = os.pathsep.join(str(ROOT / p) for p in ("operator", "workloads", "devcluster", "."))
    command = f"{sys.executable} -m pytest -x -q -p no:cacheprovider -m 'not slow' {' '.join(tests)}"
    with tempfile.TemporaryDirectory(prefix="mutation-") as tmp:
        config, session = Path(tmp) / "config.toml", Path(tmp) / "session.sqlite"
        config.write_text(
            "[cosmic-ray]\n"
            f'module-path = "{module}"\n'
            f"timeout = {timeout}\n"
            "excluded-modules = []\n"
            f'test-command = "{command}"\n'
            '[cosmic-ray.distributor]\nname = "local"\n'
        )
        env = {**os.environ, "PYTHONPATH": pythonpath}
        bin_dir = python.parent
        subprocess.run([bin_dir / "cosmic-ray", "init", config, session], cwd=ROOT, env=env, check=True)
        unread = json.dumps(unread_annotations((ROOT / module).read_text()))
        subprocess.run([python, "-c", _SAMPLE, session, str(sample), unread], check=True)
        subprocess.run([bin_dir / "cosmic-ray", "exec", config, session], cwd=ROOT, env=env, check=True)
        dump = subprocess.run([bin_dir / "cosmic-ray", "dump", session], cwd=ROOT, capture_output=True, text=True)
    lines = (ROOT / module).read_text().splitlines()
    known = equivalents()
    killed, survivors, equivalent = 0, [], 0
    for line in dump.stdout.splitlines():
        item, result = json.loads(line)
        if not result or result["worker_outcome"] != "normal":
            continue
        mutation = item["mutations"][0]
        source = lines[mutation["start_pos"][0] - 1].strip()
        if result["test_outcome"] == "survived":
            if any(p == module and fnmatch(mutation["operator_name"], o) and s == source for p, o, s in known):
                equivalent += 1
            else:
                survivors.append((mutation["operator_name"], mutation["start_pos"][0], source, result["diff"]))
        elif result["test_outcome"] == "killed":
            killed += 1
    tested = killed + len(survivors)
    return {
        "module": module,
        "killed": killed,
        "survived": survivors,
        "equivalent": equivalent,
        "score": killed / tested if tested else 1.0,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("modules", nargs="*", help="file names or paths (default: all)")
    parser.add_argument("--sample", type=int, default=40, help="mutants per module; 0: all")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per mutant's test run")
    parser.add_argument("--target", type=float, default=0.85)
    args = parser.parse_args()
    chosen = [m for m in MODULES if not args.modules or any(m.endswith(a) for a in args.modules)]
    reports = []
    for m in chosen:  # each module's survivors as soon as it is done: a long run can be stopped
        r = run_module(m, MODULES[m], args.sample, args.timeout)
        for operator, line, source, diff in r["survived"]:
            print(f"\nSURVIVED {r['module']}:{line} {operator}: {source}\n{diff}", flush=True)
        print(f"{r['module']}: {100 * r['score']:.0f} %", flush=True)
        reports.append(r)
    print(f"\n{'module':52} {'killed':>6} {'survived':>8} {'equiv.':>6} {'score':>6}")
    for r in reports:
        print(f"{r['module']:52} {r['killed']:6} {len(r['survived']):8} {r['equivalent']:6} {100 * r['score']:5.0f}%")
    return 0 if all(r["score"] >= args.target for r in reports) else 1


if __name__ == "__main__":
    sys.exit(main())
