"""`gemma-tpu dev` lives in gemma_devcluster, which the operator image leaves out: the operator's
command line hands the arguments on, and says what to install where the package is missing."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from gemma_operator.cli import main_exit

# Runs the operator's command line where gemma_devcluster cannot be imported, as in its image.
WITHOUT_DEVCLUSTER = textwrap.dedent("""
    import importlib.abc, sys

    class Missing(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name.partition(".")[0] == "gemma_devcluster":
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)

    sys.meta_path.insert(0, Missing())
    from gemma_operator.cli import main_exit
    sys.exit(main_exit(["dev", "--workdir", "somewhere"]))
""")


def test_dev_without_the_local_cluster_says_what_to_install():
    done = subprocess.run([sys.executable, "-c", WITHOUT_DEVCLUSTER], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert "gemma_devcluster" in done.stderr and "pip install -e '.[operator,workloads,dev]'" in done.stderr


def test_dev_arguments_are_parsed_by_the_local_cluster(capsys):
    with pytest.raises(SystemExit) as exit:
        main_exit(["dev", "--help"])
    assert exit.value.code == 0
    usage = capsys.readouterr().out
    assert usage.startswith("usage: gemma-tpu dev") and "--vllm-python" in usage and "--keep-running" in usage


def test_other_commands_still_refuse_unknown_arguments(capsys):
    with pytest.raises(SystemExit) as exit:
        main_exit(["crds", "--workdir", "x"])
    assert exit.value.code == 2 and "unrecognized arguments: --workdir x" in capsys.readouterr().err
