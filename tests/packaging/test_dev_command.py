"""`gemma-tpu dev` lives in gemma_devcluster, which the operator image leaves out: the operator's
command line finds it through pyproject's entry points (never importing it), hands it the
arguments, and says what to install where it is missing.

Each case runs the command line in a fresh interpreter beside the installed metadata that the
entry points of this checkout's pyproject.toml make (what `pip install` writes into a
*.dist-info folder), so it does not depend on how this environment was installed.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import tomllib

import pytest
from scripts.manifests import ROOT

from gemma_operator.cli import COMMANDS, main_exit

ENTRY_POINTS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]
# Hides gemma_devcluster from imports, as in the operator image.
WITHOUT_DEVCLUSTER = textwrap.dedent("""
    import importlib.abc, sys

    class Missing(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name.partition(".")[0] == "gemma_devcluster":
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)

    sys.meta_path.insert(0, Missing())
""")


def gemma_tpu(tmp_path, *argv: str, entry_points: dict | None = None, devcluster: bool = True):
    """`gemma-tpu ARGV` in a fresh interpreter, which sees only `entry_points` as registered commands."""
    site = tmp_path / "site"
    info = site / "gemma_tpu_commands-0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: gemma-tpu-commands\nVersion: 0\n")
    (info / "entry_points.txt").write_text(
        "".join(
            f"[{group}]\n" + "".join(f"{name} = {target}\n" for name, target in names.items())
            for group, names in (entry_points or {}).items()
        )
    )
    code = ("" if devcluster else WITHOUT_DEVCLUSTER) + textwrap.dedent(f"""
        import importlib.metadata, sys
        sys.path.insert(0, {str(site)!r})
        real = importlib.metadata.entry_points
        # Only the commands registered here, not those of however this environment was installed.
        importlib.metadata.entry_points = lambda **kw: [
            e for e in real(**kw) if e.dist is not None and e.dist.name == "gemma-tpu-commands"]
        from gemma_operator.cli import main_exit
        sys.exit(main_exit({list(argv)!r}))
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)


def test_pyproject_registers_the_dev_command_of_the_local_cluster():
    assert ENTRY_POINTS[COMMANDS] == {"dev": "gemma_devcluster.cli:main"}


def test_dev_arguments_are_parsed_by_the_local_cluster(tmp_path):
    done = gemma_tpu(tmp_path, "dev", "--help", entry_points=ENTRY_POINTS)
    assert done.returncode == 0, done.stderr
    assert (
        done.stdout.startswith("usage: gemma-tpu dev")
        and "--vllm-python" in done.stdout
        and "--keep-running" in done.stdout
    )


@pytest.mark.parametrize("case", ["package missing", "command not registered"])
def test_dev_without_the_local_cluster_says_what_to_install(tmp_path, case):
    if case == "package missing":  # the operator image: the metadata names it, the source is not there
        done = gemma_tpu(tmp_path, "dev", "--workdir", "x", entry_points=ENTRY_POINTS, devcluster=False)
    else:
        done = gemma_tpu(tmp_path, "dev", "--workdir", "x", entry_points={})
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and "the local cluster is not installed here" in done.stderr
    assert "pip install -e '.[operator,workloads,dev]'" in done.stderr


def test_other_commands_still_refuse_unknown_arguments(capsys):
    with pytest.raises(SystemExit) as exit:
        main_exit(["crds", "--workdir", "x"])
    assert exit.value.code == 2 and "unrecognized arguments: --workdir x" in capsys.readouterr().err
