"""hf:// models resolve through the Hugging Face cache; failures are clear bad-input errors."""

from pathlib import Path

import pytest

from gemma_workloads import sources, tiny


def test_paths_and_gs_uris_pass_through():
    assert sources.resolve_model("/models/x") == "/models/x"
    assert sources.resolve_model("gs://b/m") == "gs://b/m"


def test_a_cached_repository_resolves_offline(tmp_path, monkeypatch):
    # The cache layout huggingface_hub itself reads: models--org--name/{refs/main,snapshots/<rev>/}.
    repo = tmp_path / "hub" / "models--google--gemma-4-tiny"
    tiny.write_checkpoint(repo / "snapshots" / "abc123", shards=1)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import importlib

    import huggingface_hub.constants

    importlib.reload(huggingface_hub.constants)
    try:
        path = sources.resolve_model("hf://google/gemma-4-tiny")
        assert path.endswith("snapshots/abc123") and Path(path, "config.json").exists()
        with pytest.raises(sources.ModelSourceError, match="google/other is not in the Hugging Face cache and cannot be downloaded"):
            sources.resolve_model("hf://google/other")
    finally:
        monkeypatch.undo()
        importlib.reload(huggingface_hub.constants)
