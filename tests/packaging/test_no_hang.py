"""No test can hang a run: pytest-timeout fails any test that outlives the suite's limit (pyproject's
`timeout`; the pipeline runs of tests/e2e get the longer one tests/conftest.py gives them), and a CI
run's 90 minutes are never spent waiting on a stuck server."""

import subprocess
import sys
import tomllib
from pathlib import Path

from tests.conftest import PIPELINE_FOLDER, PIPELINE_TIMEOUT

ROOT = Path(__file__).resolve().parents[2]


def test_every_test_has_a_limit_and_the_pipeline_runs_a_longer_one():
    limit = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["timeout"]
    assert 60 <= limit <= 900, "a limit that a loaded machine's slowest test meets, far below a CI run's length"
    assert limit < PIPELINE_TIMEOUT <= 1800 and PIPELINE_FOLDER == "tests/e2e/"


def test_a_hanging_test_fails_with_the_projects_settings(tmp_path):
    hanging = ROOT / "tests" / f"test_hangs_{tmp_path.name}.py"
    hanging.write_text("import time\n\n\ndef test_hangs():\n    time.sleep(600)\n")
    try:
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "timeout=2", str(hanging)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        hanging.unlink()
    assert done.returncode == 1 and "Timeout (>2.0s)" in done.stdout, done.stdout[-2000:]
