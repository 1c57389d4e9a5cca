"""hf:// models resolve through the Hugging Face cache; failures are clear bad-input errors."""

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from gemma_devcluster import tiny
from gemma_workloads import sources
from gemma_workloads.config import EXIT_INVALID_INPUT


def test_paths_and_gs_uris_pass_through():
    assert sources.resolve_model("/models/x") == "/models/x"
    assert sources.resolve_model("gs://b/m") == "gs://b/m"


@pytest.fixture
def cached_repo(tmp_path, monkeypatch) -> Path:
    """`google/gemma-4-tiny` in the cache layout huggingface_hub itself reads:
    models--org--name/{refs/main,snapshots/<rev>/}; offline, so nothing else resolves."""
    repo = tmp_path / "hub" / "models--google--gemma-4-tiny"
    snapshot = tiny.write_checkpoint(repo / "snapshots" / "abc123", shards=1).path
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import huggingface_hub.constants

    importlib.reload(huggingface_hub.constants)
    yield snapshot
    monkeypatch.undo()
    importlib.reload(huggingface_hub.constants)


def test_a_cached_repository_resolves_offline(cached_repo):
    path = sources.resolve_model("hf://google/gemma-4-tiny")
    assert path.endswith("snapshots/abc123") and Path(path, "config.json").exists()
    with pytest.raises(sources.ModelSourceError, match="google/other is not in the Hugging Face cache and cannot be"):
        sources.resolve_model("hf://google/other")


def test_a_downloaded_model_is_checked_before_it_is_loaded(cached_repo, tmp_path, capsys):
    """hf:// is checked once it is here, with the local checks (Git LFS pointers instead of weights)."""
    from gemma_workloads import runner

    (cached_repo / "model.safetensors").write_text("version https://git-lfs.github.com/spec/v1\noid sha256:0\nsize 9\n")
    config = {
        "model_path": "hf://google/gemma-4-tiny",
        "output_dir": str(tmp_path / "out"),
        "dataset": {"path": str(tiny.write_dataset(tmp_path / "d.jsonl", "chat", n=4))},
        "termination_log": str(tmp_path / "termination-log"),
    }
    (tmp_path / "train.json").write_text(json.dumps(config))
    assert runner.main(["train", "--config", str(tmp_path / "train.json")]) == EXIT_INVALID_INPUT
    error = json.loads((tmp_path / "termination-log").read_text())["error"]
    assert error.startswith(f"{cached_repo}/model.safetensors: a Git LFS pointer file")
    assert error in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_repository_of_another_model_is_refused_before_its_weights_are_downloaded(cached_repo, tmp_path):
    """Only the small files are fetched for the check: here the cache has no weights at all."""
    for shard in cached_repo.glob("*.safetensors"):
        shard.unlink()
    (cached_repo / "config.json").write_text(json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"]}))
    config = {
        "base_model_path": "hf://google/gemma-4-tiny",
        "checkpoint_dir": str(tmp_path / "ckpt"),
        "output_dir": str(tmp_path / "out"),
        "termination_log": str(tmp_path / "termination-log"),
    }
    (tmp_path / "merge.json").write_text(json.dumps(config))
    done = subprocess.run(
        [sys.executable, "-m", "gemma_workloads", "merge", "--config", str(tmp_path / "merge.json")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == EXIT_INVALID_INPUT, done.stderr
    error = json.loads((tmp_path / "termination-log").read_text())["error"]
    assert error.startswith(f"{cached_repo}/config.json: model_type 'llama' (architectures ['LlamaForCausalLM'])")
