"""Run the tests that start the operator again and again, with the other cores busy or not, and
count the runs that pass: a test that fails one run in twenty fails CI one submission in twenty.

    python scripts/stability.py                       # 20 runs of the operator integration tests
    python scripts/stability.py --runs 20 --load 1    # the same with one core kept busy
    python scripts/stability.py tests/e2e/test_dev.py --runs 3

Each run is a fresh pytest process (`-p no:randomly` is not needed: the order is pytest's own).
The last line is `N passed, M failed` over whole runs; every failing run's summary is printed.
"""

from __future__ import annotations

import argparse
import multiprocessing
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# The tests that run the real operator (kopf over HTTP against the in-process API server).
OPERATOR_TESTS = [
    *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests" / "operator" / "integration").glob("test_operator_*.py")),
    "tests/operator/integration/test_api_outage.py",
    "tests/operator/integration/test_faults.py",
    "tests/operator/integration/test_leader_election.py",
    "tests/packaging/test_rbac.py",
    "tests/packaging/test_operator_process.py",
]


def _burn(stop: multiprocessing.Event) -> None:
    while not stop.is_set():
        sum(i * i for i in range(10_000))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tests", nargs="*", default=OPERATOR_TESTS)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--load", type=int, default=0, help="processes kept busy beside the tests")
    args = parser.parse_args()

    stop = multiprocessing.Event()
    burners = [multiprocessing.Process(target=_burn, args=(stop,), daemon=True) for _ in range(args.load)]
    for b in burners:
        b.start()
    keep = Path(tempfile.mkdtemp(prefix="stability-"))  # the output of failing runs
    passed = failed = 0
    try:
        for i in range(1, args.runs + 1):
            started = time.monotonic()
            run = subprocess.run(
                [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args.tests],
                cwd=ROOT,
                capture_output=True,
                text=True,
            )
            summary = (run.stdout.strip().splitlines() or ["(no output)"])[-1]
            ok = run.returncode == 0
            passed, failed = passed + ok, failed + (not ok)
            print(f"run {i}/{args.runs}: {'ok' if ok else 'FAILED'} in {time.monotonic() - started:.0f} s: {summary}")
            if not ok:
                failures = [line for line in run.stdout.splitlines() if line.startswith(("FAILED", "ERROR"))]
                kept = keep / f"run-{i}.log"
                kept.write_text(run.stdout + run.stderr)
                print("\n".join(f"    {line}" for line in failures) + f"\n    whole output: {kept}", flush=True)
    finally:
        stop.set()
        for b in burners:
            b.join()
    print(f"load {args.load}: {passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
