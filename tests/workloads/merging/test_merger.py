"""The merge Job: merged safetensors compute what the JAX LoRA model computes, and the Job is
safe to kill, re-run and point at bad inputs."""

import hashlib
import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from safetensors import safe_open

from gemma_devcluster import tiny
from gemma_workloads import runner
from gemma_workloads.config import EXIT_FAILED, EXIT_INVALID_INPUT, EXIT_OK, MergeConfig
from gemma_workloads.merging import merge_output
from gemma_workloads.merging import merger as merge


def run_merge(tmp_path: Path, **fields) -> tuple[int, dict]:
    """The Job's entry point, in process; returns the exit code and the termination message."""
    config = MergeConfig(termination_log=str(tmp_path / "termination-log"), **fields)
    path = tmp_path / "merge-config.json"
    path.write_text(config.dumps())
    code = runner.main(["merge", "--config", str(path)])
    return code, json.loads(Path(config.termination_log).read_text())


def tensors(path: Path) -> dict[str, np.ndarray]:
    out = {}
    for f in sorted(path.glob("*.safetensors")):
        with safe_open(f, "flax") as st:
            out.update({k: np.asarray(st.get_tensor(k)) for k in st.keys()})  # noqa: SIM118 (safe_open is not iterable)
    return out


def digest(*dirs: Path) -> str:
    h = hashlib.sha256()
    for d in dirs:
        for p in sorted(d.rglob("*")):
            if p.is_file():
                h.update(str(p.relative_to(d)).encode() + p.read_bytes())
    return h.hexdigest()


@pytest.fixture(scope="module")
def merged_fp32(tiny_sharded, lora_run, tmp_path_factory):
    """The fp32 merge of step 2 (the latest) into the sharded base, and what it returned."""
    tmp = tmp_path_factory.mktemp("merged")
    before = digest(tiny_sharded.path, lora_run[0])
    code, result = run_merge(
        tmp,
        base_model_path=str(tiny_sharded.path),
        checkpoint_dir=str(lora_run[0]),
        output_dir=str(tmp / "out"),
        shard_size_bytes=300_000,
    )
    assert code == EXIT_OK, result
    assert digest(tiny_sharded.path, lora_run[0]) == before, "the merge must never write to its inputs"
    return tmp / "out", result


def test_merged_model_matches_the_jax_lora_model(merged_fp32, lora_run, token_ids):
    from tests.workloads.training.test_model_loader import hf_logits

    out, result = merged_fp32
    ours, reference = hf_logits(out, token_ids), lora_run[1]
    assert np.abs(ours - reference).max() <= 1e-5
    assert (ours.argmax(-1) == reference.argmax(-1)).all()
    # 6 Tunix modules on each of 2 layers; kv_einsum gives k_proj and v_proj: 13 tensors.
    assert result["tensors_merged"] == 13 and result["status"] == "succeeded"


def test_output_is_a_complete_hf_model_directory(merged_fp32, tiny_sharded, lora_run):
    out, result = merged_fp32
    index = json.loads((out / "model.safetensors.index.json").read_text())
    shards = sorted(p.name for p in out.glob("*.safetensors"))
    assert len(shards) > 1 and set(index["weight_map"].values()) == set(shards)
    assert all(len(name) == len("model-00001-of-00004.safetensors") for name in shards)
    assert set(index["weight_map"]) == set(tiny_sharded.config.tensor_shapes())
    for name in (
        "config.json",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "chat_template.jinja",
    ):
        assert (out / name).read_bytes() == (tiny_sharded.path / name).read_bytes(), name
    manifest = json.loads((out / merge_output.MANIFEST).read_text())
    assert manifest["step"] == 2 and manifest["lora"]["rank"] == 4 and len(manifest["merged"]) == 13
    for name in shards:
        record = manifest["files"][name]
        assert record["sha256"] == hashlib.sha256((out / name).read_bytes()).hexdigest()
        assert record["bytes"] == (out / name).stat().st_size
    assert result["bytes_written"] == sum(r["bytes"] for r in manifest["files"].values())
    assert not (out.parent / "out.partial").exists()


def test_by_default_every_tensor_keeps_the_base_dtype(merged_fp32, tiny_sharded):
    """An fp32 base merges to an fp32 model, not a mix of bf16 projections and fp32 rest."""
    base, out = tensors(tiny_sharded.path), tensors(merged_fp32[0])
    assert {v.dtype for v in base.values()} == {np.dtype(np.float32)}
    assert {k: v.dtype for k, v in out.items()} == {k: v.dtype for k, v in base.items()}


def test_an_explicit_dtype_is_given_to_the_merged_projections(tiny_sharded, lora_run):
    from gemma_workloads.merging import checkpoint_reader as lora_checkpoint
    from gemma_workloads.merging import lora_mapping
    from gemma_workloads.safetensors_io import open_checkpoint

    base = open_checkpoint(str(tiny_sharded.path))
    ckpt = lora_checkpoint.locate(str(lora_run[0]), None, None)
    targets = merge.merge_targets(base, lora_mapping.deltas(lora_checkpoint.restore_params(ckpt), ckpt.lora))
    for dtype, merged in ((None, "F32"), ("bfloat16", "BF16"), ("float16", "F16")):
        items = [i for s in merge.plan(base, targets, dtype, 1 << 30) for i in s.items]
        assert {i.dtype for i in items if i.delta} == {merged} and {i.dtype for i in items if not i.delta} == {"F32"}


def test_tensors_without_lora_are_copied_bit_for_bit(merged_fp32, tiny_sharded):
    base, out = tensors(tiny_sharded.path), tensors(merged_fp32[0])
    merged = set(json.loads((merged_fp32[0] / merge_output.MANIFEST).read_text())["merged"])
    for name, value in base.items():
        if name not in merged:
            assert out[name].tobytes() == value.tobytes(), name
        else:
            assert not np.array_equal(out[name], value), f"{name} should have changed"


def test_zero_lora_reproduces_the_base_bit_for_bit(tiny_sharded, lora_run, tmp_path):
    code, result = run_merge(
        tmp_path,
        base_model_path=str(tiny_sharded.path),
        checkpoint_dir=str(lora_run[0]),
        step=1,
        output_dir=str(tmp_path / "out"),
    )
    assert code == EXIT_OK, result
    base, out = tensors(tiny_sharded.path), tensors(tmp_path / "out")
    assert base.keys() == out.keys()
    assert all(out[k].tobytes() == v.tobytes() for k, v in base.items())


def test_the_released_layout_merges_its_decoder_and_passes_its_vision_tower_through(
    tiny_single, tiny_sharded, merged_fp32, lora_run, tmp_path, token_ids
):
    """One model.safetensors with `model.language_model.` keys and a vision tower, as released: the
    decoder gets the deltas `model.` keys get, the tower is copied byte for byte, and transformers
    loads the output as Gemma4ForConditionalGeneration, computing what the JAX LoRA model computes."""
    import torch
    from transformers import Gemma4ForConditionalGeneration

    code, result = run_merge(
        tmp_path,
        base_model_path=str(tiny_single.path),
        checkpoint_dir=str(lora_run[0]),
        output_dir=str(tmp_path / "out"),
    )
    assert code == EXIT_OK, result
    base, out = tensors(tiny_single.path), tensors(tmp_path / "out")
    ref_base, ref_out = tensors(tiny_sharded.path), tensors(merged_fp32[0])
    assert out.keys() == base.keys()
    towers = [k for k in base if k.startswith(tiny.VISION_PREFIXES)]
    assert towers and all(k.startswith("model.language_model.") for k in base.keys() - set(towers))
    for name in towers:
        assert out[name].dtype == base[name].dtype
        assert hashlib.sha256(out[name].tobytes()).digest() == hashlib.sha256(base[name].tobytes()).digest(), name
    for name in base.keys() - set(towers):
        short = name.replace("model.language_model.", "model.")
        np.testing.assert_allclose(out[name] - base[name], ref_out[short] - ref_base[short], atol=1e-6)
    assert result["tensors_merged"] == 13
    model, info = Gemma4ForConditionalGeneration.from_pretrained(
        tmp_path / "out", dtype=torch.float32, attn_implementation="eager", output_loading_info=True
    )
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert model.model.vision_tower is not None
    with torch.no_grad():
        logits = model(torch.tensor(token_ids)).logits.numpy()
    # The same text weights as tiny_sharded, so the same logits as the JAX LoRA model on them.
    assert np.abs(logits - lora_run[1]).max() <= 1e-5


def test_bf16_merge_is_the_fp32_merge_rounded(tmp_path, lora_run, merged_fp32, tiny_sharded):
    """A bf16 base stays bf16 (the default keeps each tensor's dtype)."""
    base_path = tiny.write_checkpoint(tmp_path / "base-bf16", shards=2, dtype="bfloat16").path
    code, result = run_merge(
        tmp_path, base_model_path=str(base_path), checkpoint_dir=str(lora_run[0]), output_dir=str(tmp_path / "out")
    )
    assert code == EXIT_OK, result
    base, out = tensors(base_path), tensors(tmp_path / "out")
    ref_base, ref_out = tensors(tiny_sharded.path), tensors(merged_fp32[0])
    for name in base:
        assert out[name].dtype == ml_dtypes.bfloat16, name
        exact = base[name].astype(np.float32) + (ref_out[name] - ref_base[name])
        got = out[name].astype(np.float32)
        # Round to nearest: within half a bf16 ulp (8 significant bits) of the exact sum.
        assert (np.abs(got - exact) <= np.abs(exact) * 2.0**-8 + 1e-30).all(), name
        assert (out[name] == exact.astype(ml_dtypes.bfloat16)).mean() > 0.999, name


def test_rerun_on_a_finished_merge_changes_nothing(merged_fp32, tiny_sharded, lora_run):
    out, _ = merged_fp32
    before = {p.name: (p.stat().st_mtime_ns, p.stat().st_size) for p in out.iterdir()}
    code, result = run_merge(
        out.parent,
        base_model_path=str(tiny_sharded.path),
        checkpoint_dir=str(lora_run[0]),
        output_dir=str(out),
        shard_size_bytes=300_000,
    )
    assert code == EXIT_OK and result["bytes_written"] == 0 and result["tensors_merged"] == 13
    assert {p.name: (p.stat().st_mtime_ns, p.stat().st_size) for p in out.iterdir()} == before


def test_an_output_holding_something_else_is_refused_and_left_alone(tiny_sharded, lora_run, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    code, result = run_merge(
        tmp_path, base_model_path=str(tiny_sharded.path), checkpoint_dir=str(lora_run[0]), output_dir=str(out)
    )
    assert code == EXIT_INVALID_INPUT and "refusing to overwrite" in result["error"]
    assert [p.name for p in out.iterdir()] == ["notes.txt"]


def test_a_failure_mid_merge_stops_every_shard_and_publishes_nothing(tiny_sharded, lora_run, tmp_path, monkeypatch):
    from gemma_workloads.merging import lora_mapping

    def broken(self, start, stop, out):
        raise MemoryError("no room for the delta")

    monkeypatch.setattr(lora_mapping.LoadedDelta, "rows", broken)
    code, result = run_merge(
        tmp_path,
        base_model_path=str(tiny_sharded.path),
        checkpoint_dir=str(lora_run[0]),
        output_dir=str(tmp_path / "out"),
        shard_size_bytes=100_000,
        workers=2,
    )
    assert code == EXIT_FAILED and result == {"status": "failed", "error": "MemoryError: no room for the delta"}
    assert not (tmp_path / "out").exists()
    finished = [p.name for p in (tmp_path / "out.partial" / ".done").iterdir()]
    assert finished in ([], ["model-00001-of-00010.safetensors.json"]), "only the embedding's shard has no LoRA"


def test_output_inside_an_input_is_refused(tiny_sharded, lora_run, tmp_path):
    code, result = run_merge(
        tmp_path,
        base_model_path=str(tiny_sharded.path),
        checkpoint_dir=str(lora_run[0]),
        output_dir=str(tiny_sharded.path / "merged"),
    )
    assert code == EXIT_INVALID_INPUT and "never writes into its inputs" in result["error"]


@pytest.fixture
def base_copy(tiny_sharded, tmp_path) -> Path:
    return Path(shutil.copytree(tiny_sharded.path, tmp_path / "base"))


def test_lora_target_missing_from_the_base_is_named(base_copy, lora_run, tmp_path):
    """A base without the global layer's k_proj: the LoRA on k_einsum has nowhere to go."""
    rewrite_tensor(base_copy, "model.layers.1.self_attn.k_proj.weight", None)
    code, result = run_merge(
        tmp_path, base_model_path=str(base_copy), checkpoint_dir=str(lora_run[0]), output_dir=str(tmp_path / "out")
    )
    assert code == EXIT_INVALID_INPUT
    assert result["error"].startswith("LoRA layers/1/k_einsum adapts layers.1.self_attn.k_proj.weight, which the base")


def rewrite_tensor(base: Path, name: str, value) -> None:
    """Replace (value) or drop (None) one tensor of a sharded base, keeping the index right."""
    from safetensors.numpy import load_file, save_file

    index_path = base / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    shard = base / index["weight_map"][name]
    tensors = load_file(shard)
    if value is None:
        del tensors[name], index["weight_map"][name]
    else:
        tensors[name] = value
    save_file(tensors, shard, metadata={"format": "pt"})
    index_path.write_text(json.dumps(index))


def test_unsupported_dtype_at_a_lora_target_is_named(base_copy, lora_run, tmp_path):
    name = "model.layers.0.mlp.up_proj.weight"
    rewrite_tensor(base_copy, name, np.zeros((192, 96), np.float64))
    code, result = run_merge(
        tmp_path, base_model_path=str(base_copy), checkpoint_dir=str(lora_run[0]), output_dir=str(tmp_path / "out")
    )
    assert code == EXIT_INVALID_INPUT
    assert result["error"] == f"{name}: dtype F64 cannot take a LoRA delta (supported: ['BF16', 'F16', 'F32'])"


def test_lora_settings_come_from_the_config_without_lora_json(tiny_sharded, lora_run, merged_fp32, tmp_path):
    ckpt = Path(shutil.copytree(lora_run[0], tmp_path / "ckpt"))
    (ckpt / "lora.json").unlink()
    common = dict(base_model_path=str(tiny_sharded.path), checkpoint_dir=str(ckpt), shard_size_bytes=300_000)
    code, result = run_merge(tmp_path, output_dir=str(tmp_path / "a"), **common)
    assert (
        code == EXIT_INVALID_INPUT and "lora.json not found: set lora (rank, alpha, target_modules)" in result["error"]
    )
    code, result = run_merge(tmp_path, output_dir=str(tmp_path / "b"), lora={"rank": 4, "alpha": 8.0}, **common)
    assert code == EXIT_OK, result
    ours = json.loads((tmp_path / "b" / merge_output.MANIFEST).read_text())["files"]
    assert ours == json.loads((merged_fp32[0] / merge_output.MANIFEST).read_text())["files"]


def test_lora_of_another_model_size_is_named(tiny_sharded, tmp_path):
    other = tiny.TinyConfig(intermediate_size=128)
    tiny.write_lora_checkpoint(tmp_path / "ckpt", other, rank=2, alpha=2.0)
    code, result = run_merge(
        tmp_path,
        base_model_path=str(tiny_sharded.path),
        checkpoint_dir=str(tmp_path / "ckpt"),
        output_dir=str(tmp_path / "out"),
    )
    assert code == EXIT_INVALID_INPUT
    assert (
        result["error"]
        == "model.layers.0.mlp.down_proj.weight: base shape [96, 192] but LoRA layers/0/down_proj gives [96, 128]"
    )


def test_a_checkpoint_holding_nan_is_never_merged(tiny_sharded, tmp_path):
    """A diverged adapter would make every output of the merged model NaN: exit 2, naming the tensor."""
    ckpt = tmp_path / "ckpt"
    tiny.write_lora_checkpoint(
        ckpt, tiny.TinyConfig(), rank=4, alpha=8.0, step=7, nan_in="layers/1/mlp/up_proj/kernel_lora_b"
    )
    code, result = run_merge(
        tmp_path, base_model_path=str(tiny_sharded.path), checkpoint_dir=str(ckpt), output_dir=str(tmp_path / "out")
    )
    assert code == EXIT_INVALID_INPUT
    assert result["error"] == (
        f"{ckpt}/7: LoRA tensor layers/1/mlp/up_proj/kernel_lora_b holds 1 non-finite value(s) (NaN or inf) of 768; "
        "a diverged adapter is never merged: merge an earlier step (complete: [7])"
    )
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.partial").exists()


def test_step_selection(tiny_sharded, lora_run, tmp_path):
    """The latest complete step is used; Orbax's temporary folders and uncommitted steps are not."""
    ckpt = Path(shutil.copytree(lora_run[0], tmp_path / "ckpt"))
    shutil.copytree(ckpt / "2", ckpt / "3.orbax-checkpoint-tmp-17")  # a save in progress
    shutil.copytree(ckpt / "2", ckpt / "4")
    (ckpt / "4" / "_CHECKPOINT_METADATA").unlink()  # a step copied in part
    from gemma_workloads.merging import checkpoint_reader as lora_checkpoint

    assert list(lora_checkpoint.complete_steps(str(ckpt))) == [1, 2]
    assert lora_checkpoint.locate(str(ckpt), None, None).step == 2
    code, result = run_merge(
        tmp_path,
        base_model_path=str(tiny_sharded.path),
        checkpoint_dir=str(ckpt),
        step=4,
        output_dir=str(tmp_path / "out"),
    )
    assert code == EXIT_INVALID_INPUT and result["error"] == (
        f"{ckpt}: step 4 is not a complete checkpoint: it lacks the record of a committed save, "
        f"{ckpt}/4/_CHECKPOINT_METADATA (an aborted save, or a copy in part); copy the whole step folder again, "
        "or merge a complete step (complete: [1, 2])"
    )


def test_a_merge_in_process_names_the_steps_missing_parameters_and_a_run_folder(tiny_sharded, lora_run, tmp_path):
    """merge() called in process checks its checkpoint itself (only the program runs the pre-flight
    check): each step folder named with what it lacks and where, and a run's folder given for its
    checkpoints named as such, with the folder to give."""
    from gemma_workloads.merging.checkpoint_reader import LoraCheckpointError

    run = tmp_path / "run"
    ckpt = Path(shutil.copytree(lora_run[0], run / "checkpoints"))
    for step in ("1", "2"):
        shutil.rmtree(ckpt / step / "model_params")

    def error(checkpoint_dir: Path) -> str:
        paths = {"base_model_path": str(tiny_sharded.path), "output_dir": str(tmp_path / "out")}
        with pytest.raises(LoraCheckpointError) as e:
            merge.merge(MergeConfig(checkpoint_dir=str(checkpoint_dir), **paths))
        return str(e.value)

    assert error(ckpt) == (
        f"{ckpt}: no complete checkpoint step: step 1 lacks its LoRA parameters, the folder {ckpt}/1/model_params; "
        f"step 2 lacks its LoRA parameters, the folder {ckpt}/2/model_params: copy the whole step folder again"
    )
    assert error(run) == (
        f"checkpoint_dir {run} looks like a run folder: it holds checkpoints/ and neither lora.json nor a step "
        f"folder; set checkpoint_dir to its checkpoints/ folder, {ckpt}"
    )
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.partial").exists()


# ---------------------------------------------------------------------------- crash and memory

MID = tiny.TinyConfig(
    hidden_size=512,
    intermediate_size=2048,
    num_attention_heads=8,
    head_dim=64,
    num_key_value_heads=4,
    global_head_dim=128,
    num_global_key_value_heads=2,
)


def mid_model(root: Path, layers: int, shards: int) -> tuple[Path, Path]:
    """A wider model (15.6 MB of fp32 weights a layer) and a rank-4 LoRA for it."""
    config = tiny.TinyConfig(**{**MID.__dict__, "layer_types": ("sliding_attention", "full_attention") * (layers // 2)})
    base = tiny.write_checkpoint(root / f"base-{layers}", config, shards=shards).path
    tiny.write_lora_checkpoint(root / f"ckpt-{layers}", config, rank=4, alpha=8.0)
    return base, root / f"ckpt-{layers}"


def merge_process(config: MergeConfig, path: Path) -> subprocess.Popen:
    path.write_text(config.dumps())
    # VmHWM, not ru_maxrss: Linux carries ru_maxrss across exec, so a child of this (large)
    # test process would report the parent's peak.
    code = (
        "import re, sys\nfrom gemma_workloads.runner import main\ncode = main(['merge', *sys.argv[1:]])\n"
        "hwm = re.search(r'VmHWM:\\s+(\\d+) kB', open('/proc/self/status').read()).group(1)\n"
        "print('peak_rss_kib', hwm, flush=True)\nsys.exit(code)"
    )
    return subprocess.Popen([sys.executable, "-c", code, "--config", str(path)], stdout=subprocess.PIPE, text=True)


@pytest.mark.slow
def test_peak_memory_does_not_grow_with_the_model(tmp_path):
    peaks = {}
    for layers, shards in ((4, 2), (20, 8)):
        base, ckpt = mid_model(tmp_path, layers, shards)
        config = MergeConfig(
            base_model_path=str(base),
            checkpoint_dir=str(ckpt),
            output_dir=str(tmp_path / f"out-{layers}"),
            dtype="float32",
            shard_size_bytes=40 << 20,
            termination_log=str(tmp_path / "log"),
        )
        proc = merge_process(config, tmp_path / f"config-{layers}.json")
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == EXIT_OK, out
        peaks[layers] = int(out.split("peak_rss_kib")[1].split()[0]) * 1024
        shutil.rmtree(base)
    # A merge holding the model grows by more than the model; blocks in flight vary by ~20 MB.
    grown = 16 * 15.6e6
    assert peaks[20] - peaks[4] < 0.25 * grown, f"peak RSS {peaks} grew with a model {grown / 1e6:.0f} MB larger"


@pytest.mark.slow
def test_killed_merge_resumes_with_only_the_missing_shards(tmp_path):
    base, ckpt = mid_model(tmp_path, 8, 3)
    common = dict(
        base_model_path=str(base),
        checkpoint_dir=str(ckpt),
        dtype="float32",
        shard_size_bytes=1 << 20,
        workers=1,
        termination_log=str(tmp_path / "log"),
    )
    out = tmp_path / "out"
    proc = merge_process(MergeConfig(output_dir=str(out), **common), tmp_path / "config.json")
    for line in proc.stdout:
        if " done (" in line:
            proc.send_signal(signal.SIGKILL)
            break
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    staging = tmp_path / "out.partial"
    assert not out.exists() and staging.exists(), "a killed merge must not publish anything"
    finished = {p.name.removesuffix(".json") for p in (staging / ".done").glob("*.json")}
    assert finished, "the kill came after a shard was recorded"

    code, result = run_merge(
        tmp_path, output_dir=str(out), **{k: v for k, v in common.items() if k != "termination_log"}
    )
    assert code == EXIT_OK, result
    manifest = json.loads((out / merge_output.MANIFEST).read_text())
    total = sum(r["bytes"] for r in manifest["files"].values())
    redone = total - sum(manifest["files"][n]["bytes"] for n in finished)
    assert result["bytes_written"] == redone < total
    code, _ = run_merge(
        tmp_path, output_dir=str(tmp_path / "fresh"), **{k: v for k, v in common.items() if k != "termination_log"}
    )
    assert code == EXIT_OK
    fresh = json.loads((tmp_path / "fresh" / merge_output.MANIFEST).read_text())
    assert fresh["files"] == manifest["files"], "a resumed merge must equal an uninterrupted one, byte for byte"
