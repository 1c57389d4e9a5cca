"""The one entry point of both workloads (`python -m gemma_workloads train|merge`): whatever goes
wrong ends with the exit code the operator acts on and a result in the termination log."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gemma_devcluster import tiny
from gemma_workloads import runner
from gemma_workloads.config import EXIT_FAILED, EXIT_INVALID_INPUT

NOT_YAML = {"train": "dataset: {path: x\n", "merge": "base_model_path: [unclosed\n"}
# Python's JSON parser gives up on nesting this deep (RecursionError, not a JSONDecodeError).
TOO_DEEP = "[" * 100_000 + "]" * 100_000


@pytest.mark.parametrize("workload", ["train", "merge"])
def test_a_config_that_is_not_valid_yaml_exits_2_with_a_termination_message_naming_it(workload, tmp_path, capsys):
    path = tmp_path / "config.yaml"
    path.write_text(NOT_YAML[workload])
    log = tmp_path / "termination-log"  # what Kubernetes' default path is in a pod, the config being unread
    assert runner.main([workload, "--config", str(path)], termination_log=str(log)) == EXIT_INVALID_INPUT
    result = json.loads(log.read_text())
    assert result["status"] == "failed"
    assert result["error"].startswith(f"config {path}: line 2 column 1: neither JSON nor YAML"), result
    assert f"error: {result['error']}" in capsys.readouterr().err


@pytest.mark.parametrize("workload", ["train", "merge"])
def test_a_config_nested_too_deeply_is_bad_input_too(workload, tmp_path):
    path = tmp_path / "config.json"
    path.write_text(TOO_DEEP)
    log = tmp_path / "termination-log"
    assert runner.main([workload, "--config", str(path)], termination_log=str(log)) == EXIT_INVALID_INPUT
    assert json.loads(log.read_text())["error"].startswith(f"config {path}: maximum recursion depth exceeded")


@pytest.mark.parametrize("workload", ["train", "merge"])
def test_an_unexpected_error_in_the_checks_still_ends_with_a_termination_message(workload, tmp_path, tiny_sharded):
    """Not an input error the checks know (a JSON file nested deeper than the parser goes): the run
    fails (exit 1) with the error in the termination message, still before JAX is imported."""
    common = {"output_dir": str(tmp_path / "out"), "termination_log": str(tmp_path / "termination-log")}
    if workload == "train":
        dataset = tiny.write_dataset(tmp_path / "chat.jsonl", "chat", n=4)
        dataset.write_text(dataset.read_text() + TOO_DEEP + "\n")
        config = {"model_path": str(tiny_sharded.path), "dataset": {"path": str(dataset)}, **common}
    else:
        (tmp_path / "checkpoints").mkdir()
        (tmp_path / "checkpoints" / "lora.json").write_text(TOO_DEEP)
        config = {"base_model_path": str(tiny_sharded.path), "checkpoint_dir": str(tmp_path / "checkpoints"), **common}
    config_file = tmp_path / "config.json"
    config_file.write_text(json.dumps(config))
    command = [sys.executable, "-X", "importtime", "-m", "gemma_workloads", workload, "--config", str(config_file)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}
    assert done.returncode == EXIT_FAILED, done.stderr[-3000:]
    result = json.loads(Path(common["termination_log"]).read_text())
    assert result["status"] == "failed", result
    assert result["error"].startswith("RecursionError: maximum recursion depth"), result
    assert "jax" not in imported
    assert not Path(common["output_dir"]).exists()


def test_the_image_command_lists_both_workloads():
    """The workloads image's default command (workloads/Dockerfile)."""
    done = subprocess.run(
        [sys.executable, "-m", "gemma_workloads", "--help"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and "{train,merge}" in done.stdout, done.stderr
