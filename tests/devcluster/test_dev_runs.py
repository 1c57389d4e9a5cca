"""What a second `gemma-tpu dev` keeps of the first: the compiled programs, nothing of the runs."""

from gemma_devcluster import dev
from gemma_operator.plan.finetune import COMPILATION_CACHE_FOLDER


def test_a_new_demo_clears_the_runs_and_keeps_the_compilation_caches(tmp_path):
    # examples/quickstart/finetune.yaml's output.uri; the plan puts its JAX cache in COMPILATION_CACHE_FOLDER
    output = tmp_path / "runs" / "tiny-capitals"
    entry = output / COMPILATION_CACHE_FOLDER / "jit_train_step-abc-cache"
    entry.parent.mkdir(parents=True)
    entry.write_bytes(b"program")
    (output / "runs" / "ac7a70e5" / "checkpoints").mkdir(parents=True)
    (output / "stray.txt").write_text("a file beside the runs")
    server_cache = tmp_path / "5ea4aa6dc437" / "modelinfos"  # the GemmaServe's spec.compilationCache
    server_cache.mkdir(parents=True)

    dev._clear_runs(tmp_path)

    assert sorted(p.name for p in output.iterdir()) == [COMPILATION_CACHE_FOLDER]
    assert entry.read_bytes() == b"program" and server_cache.is_dir()


def test_a_first_demo_has_no_runs_to_clear(tmp_path):
    dev._clear_runs(tmp_path)
    assert list(tmp_path.iterdir()) == []
