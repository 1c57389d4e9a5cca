"""The PEFT adapter a merge writes: transformers + PEFT load it onto the base model and compute what
the merged model and the JAX LoRA model compute, for every target-module set, vision tower untouched."""

import itertools
import json
import logging
import warnings
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from gemma_devcluster import tiny
from gemma_workloads.config import EXIT_INVALID_INPUT, EXIT_OK, LORA_MODULES, LoraConfig
from gemma_workloads.merging import lora_mapping, peft_export
from gemma_workloads.merging import merger as merge
from gemma_workloads.safetensors_io import open_checkpoint
from tests.workloads.merging.test_merger import run_merge, tensors

LORA = LoraConfig(rank=4, alpha=8.0)  # the lora_run fixture's settings
# Every target-module set the API admits (any non-empty subset of LORA_MODULES).
TARGET_SETS = [list(c) for n in range(1, len(LORA_MODULES) + 1) for c in itertools.combinations(LORA_MODULES, n)]
# Each module alone (k_proj alone adapts the sliding layers' fused K/V and the global layers' K = V;
# v_proj alone only the fused K/V), one set mixing both kinds, and all of them.
LOGIT_SETS = [[m] for m in LORA_MODULES] + [["q_proj", "v_proj", "down_proj"], list(LORA_MODULES)]


def subset(tree, targets: list[str], *, zero_others: bool = False):
    """The LoRA tree of a run that adapted only `targets`: the other modules dropped or, for the JAX
    model (which has them all), their B set to zero, which makes their delta zero."""
    from gemma_workloads.training.lora import tunix_modules

    keep = set(tunix_modules(targets)) if targets else set()

    def walk(node):
        out = {}
        for key, value in node.items():
            if str(key) in lora_mapping.HF_TENSORS and str(key) not in keep:
                if zero_others:
                    out[key] = {k: np.zeros_like(v) if k.endswith("_b") else v for k, v in value.items()}
            else:
                out[key] = walk(value) if isinstance(value, dict) else value
        return out

    return walk(tree)


def merge_into(tmp_path: Path, base: Path, lora_run, **fields) -> tuple[int, dict]:
    """The merge Job on `base` and the run's checkpoint, the merged model written to tmp_path/merged."""
    return run_merge(
        tmp_path,
        base_model_path=str(base),
        checkpoint_dir=str(lora_run[0]),
        output_dir=str(tmp_path / "merged"),
        **fields,
    )


def export(tree, base_path: Path, folder: Path, dtype: str = "float32") -> dict[str, lora_mapping.Delta]:
    targets = merge.merge_targets(open_checkpoint(str(base_path)), lora_mapping.deltas(tree, LORA))
    peft_export.export(folder, targets, LORA, "tiny-gemma-4", dtype, "test")
    return targets


def jax_lora_model(path: Path, token_ids):
    """The JAX LoRA model of a base checkpoint, in float32: its logits for a given LoRA tree."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from gemma_workloads.training import lora
    from gemma_workloads.training import model_loader as model

    m = lora.apply_lora(model.load_model(str(path), dtype="float32")[0], LORA)
    b, t = token_ids.shape
    positions = jnp.tile(jnp.arange(t)[None], (b, 1))

    def logits(tree) -> np.ndarray:
        state = lora.lora_state(m)
        state.replace_by_pure_dict(jax.tree.map(jnp.asarray, tree))
        nnx.update(m, state)
        out, _ = m(jnp.asarray(token_ids), positions, None, jnp.tril(jnp.ones((b, t, t), dtype=bool)))
        return np.asarray(out)

    return logits


@pytest.fixture(scope="module")
def jax_logits(tiny_sharded, token_ids, lora_run):
    """tiny_sharded's text weights are tiny_single's."""
    logits = jax_lora_model(tiny_sharded.path, token_ids)
    assert np.array_equal(logits(lora_run[2]), lora_run[1])  # the same model the fixture ran
    return logits


def load_base(path: Path, dtype: str = "float32"):
    """The class config.json names: Gemma4ForConditionalGeneration (release) or Gemma4ForCausalLM."""
    import torch
    import transformers

    (architecture,) = json.loads((Path(path) / "config.json").read_text())["architectures"]
    model = getattr(transformers, architecture).from_pretrained(
        path, dtype=getattr(torch, dtype), attn_implementation="eager"
    )
    return model.eval()


def peft_logits(base_path: Path, adapter: Path, token_ids, caplog, dtype: str = "float32"):
    """Base + adapter through PeftModel.from_pretrained, which must load without a warning."""
    import torch
    from peft import PeftModel

    base = load_base(base_path, dtype)
    caplog.clear()
    with warnings.catch_warnings(record=True) as caught, caplog.at_level(logging.WARNING):
        warnings.simplefilter("always")
        model = PeftModel.from_pretrained(base, str(adapter))
    said = [str(w.message) for w in caught] + [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    # PEFT warns "Found missing adapter keys" (peft_model.py) and reports unexpected keys the same way.
    assert not said, said
    with torch.no_grad():
        return model(torch.tensor(token_ids)).logits.float().numpy(), model


def lora_module_names(model) -> set[str]:
    from peft.tuners.lora import LoraLayer

    return {name.removeprefix("base_model.model.") for name, mod in model.named_modules() if isinstance(mod, LoraLayer)}


def test_a_merge_writes_an_adapter_peft_loads_onto_the_release_layout(
    tiny_single, lora_run, token_ids, tmp_path, caplog
):
    import torch

    code, result = merge_into(tmp_path, tiny_single.path, lora_run, adapter_dir=str(tmp_path / "adapter"))
    assert code == EXIT_OK, result
    adapter = tmp_path / "adapter"
    assert result["adapter"] == str(adapter) and result["adapter_bytes"] > 0 and "adapter_error" not in result
    assert sorted(p.name for p in adapter.iterdir()) == [peft_export.CONFIG, peft_export.WEIGHTS]
    config = json.loads((adapter / peft_export.CONFIG).read_text())
    assert config["peft_type"] == "LORA" and config["r"] == 4 and config["lora_alpha"] == 8
    assert config["use_dora"] is False and config["modules_to_save"] is None
    assert config["base_model_name_or_path"] == str(tiny_single.path)
    names = set(tensors(adapter))
    # The name the release's layout gives (as in SGLang's and vLLM's Gemma 4 LoRA loaders).
    assert "base_model.model.model.language_model.layers.0.self_attn.q_proj.lora_A.weight" in names
    assert "base_model.model.model.language_model.layers.1.self_attn.v_proj.lora_A.weight" not in names  # K = V

    ours, model = peft_logits(tiny_single.path, adapter, token_ids, caplog)
    merged = load_base(tmp_path / "merged")
    with torch.no_grad():
        merged_logits = merged(torch.tensor(token_ids)).logits.numpy()
    assert np.abs(ours - merged_logits).max() <= 1e-5
    assert np.abs(ours - lora_run[1]).max() <= 1e-5
    # The vision tower: no adapter in it, and its weights are the base's.
    assert lora_module_names(model) and all(n.startswith("model.language_model.") for n in lora_module_names(model))
    base = tensors(tiny_single.path)
    state = {k.removeprefix("base_model.model."): v for k, v in model.state_dict().items()}
    towers = [k for k in base if k.startswith(tiny.VISION_PREFIXES)]
    assert towers
    for name in towers:
        assert np.array_equal(state[name].numpy(), base[name]), name


@pytest.mark.parametrize("targets", LOGIT_SETS, ids=lambda t: "+".join(t))
def test_peft_computes_what_the_jax_lora_model_computes(
    targets, tiny_single, lora_run, jax_logits, token_ids, tmp_path, caplog
):
    """Each mapping rule checked on logits, global and sliding layers both (tiny has one of each)."""
    export(subset(lora_run[2], targets), tiny_single.path, tmp_path / "adapter")
    ours, _ = peft_logits(tiny_single.path, tmp_path / "adapter", token_ids, caplog)
    reference = jax_logits(subset(lora_run[2], targets, zero_others=True))
    assert np.abs(ours - reference).max() <= 1e-5
    # The adapter does change the logits: the comparison above is not of two base models.
    assert np.abs(reference - jax_logits(subset(lora_run[2], [], zero_others=True))).max() > 1e-3


def test_every_target_set_names_exactly_its_decoder_modules(tiny_single, tiny_sharded, lora_run, tmp_path):
    """PEFT's own matching (`check_target_module_exists`) of target_modules against every module of
    both layouts picks the modules the file holds, none in the vision tower, for all 127 sets."""
    from peft import LoraConfig as PeftLoraConfig
    from peft.tuners.tuners_utils import check_target_module_exists

    for layout in (tiny_single, tiny_sharded):
        modules = [n for n, _ in load_base(layout.path).named_modules()]
        base = open_checkpoint(str(layout.path))
        for targets in TARGET_SETS:
            found = merge.merge_targets(base, lora_mapping.deltas(subset(lora_run[2], targets), LORA))
            held = {k.removesuffix(".weight") for k in found}
            config = peft_export.adapter_config(LORA, "tiny", sorted(held))
            peft = PeftLoraConfig(**{k: v for k, v in config.items() if k != "peft_type"})
            matched = {n for n in modules if check_target_module_exists(peft, n)}
            assert matched == held, (layout.path, targets)
            names = peft_export.adapter_tensors(found, "float32")
            assert {n.split(".lora_")[0].removeprefix("base_model.model.") for n in names} == held
            prefix = "model.language_model." if layout is tiny_single else "model."
            assert all(n.startswith(f"base_model.model.{prefix}layers.") for n in names)


def test_the_sliding_layers_share_a_between_k_and_v_and_the_global_layer_has_no_v(tiny_sharded, lora_run, tmp_path):
    export(lora_run[2], tiny_sharded.path, tmp_path / "adapter")
    t = tensors(tmp_path / "adapter")
    pre = "base_model.model.model.layers"  # the text-only layout's prefix
    assert np.array_equal(t[f"{pre}.0.self_attn.k_proj.lora_A.weight"], t[f"{pre}.0.self_attn.v_proj.lora_A.weight"])
    assert not np.array_equal(
        t[f"{pre}.0.self_attn.k_proj.lora_B.weight"], t[f"{pre}.0.self_attn.v_proj.lora_B.weight"]
    )
    assert f"{pre}.1.self_attn.k_proj.lora_B.weight" in t and f"{pre}.1.self_attn.v_proj.lora_A.weight" not in t
    k = lora_run[2]["layers"][1]["attn"]["k_einsum"]
    b = k.get("w_lora_b", k.get("kernel_lora_b"))
    assert np.array_equal(t[f"{pre}.1.self_attn.k_proj.lora_B.weight"], b.reshape(4, -1).T)


def test_a_bf16_adapter_is_the_fp32_one_rounded_and_loads_exactly(
    tiny_single, lora_run, jax_logits, token_ids, tmp_path, caplog
):
    export(lora_run[2], tiny_single.path, tmp_path / "fp32")
    export(lora_run[2], tiny_single.path, tmp_path / "bf16", dtype="bfloat16")
    fp32, bf16 = tensors(tmp_path / "fp32"), tensors(tmp_path / "bf16")
    assert fp32.keys() == bf16.keys()
    for name, value in fp32.items():
        assert bf16[name].dtype == ml_dtypes.bfloat16 and np.array_equal(bf16[name], value.astype(ml_dtypes.bfloat16))
    import jax

    rounded = jax.tree.map(lambda x: np.asarray(x).astype(ml_dtypes.bfloat16).astype(np.float32), lora_run[2])
    ours, _ = peft_logits(tiny_single.path, tmp_path / "bf16", token_ids, caplog)
    assert np.abs(ours - jax_logits(rounded)).max() <= 1e-5


def test_a_bf16_base_gets_a_bf16_adapter_that_peft_loads_exactly(lora_run, token_ids, tmp_path, caplog):
    """Computed in float32 (bf16 widens exactly), base + bf16 adapter is the JAX LoRA model on the same
    bf16 values; in bf16 it loads without a warning too."""
    import jax

    base = tiny.write_checkpoint(tmp_path / "base", shards=1, dtype="bfloat16", vision=tiny.TinyVisionConfig()).path
    code, result = merge_into(tmp_path, base, lora_run)
    assert code == EXIT_OK, result
    adapter = Path(result["adapter"])
    assert adapter == tmp_path / "merged-adapter"
    assert {v.dtype for v in tensors(adapter).values()} == {np.dtype(ml_dtypes.bfloat16)}
    ours, _ = peft_logits(base, adapter, token_ids, caplog)
    rounded = jax.tree.map(lambda x: np.asarray(x).astype(ml_dtypes.bfloat16).astype(np.float32), lora_run[2])
    assert np.abs(ours - jax_lora_model(base, token_ids)(rounded)).max() <= 1e-5
    in_bf16, model = peft_logits(base, adapter, token_ids, caplog, dtype="bfloat16")
    assert np.isfinite(in_bf16).all() and lora_module_names(model)


def test_adapter_only_output_writes_no_merged_model_and_reruns_are_no_ops(tiny_single, lora_run, tmp_path):
    code, result = merge_into(tmp_path, tiny_single.path, lora_run, output="adapter")
    assert code == EXIT_OK, result
    assert not (tmp_path / "merged").exists() and "output" not in result and "tensors_merged" not in result
    assert result["adapter"] == str(tmp_path / "merged-adapter") and result["adapter_bytes"] > 0
    before = (tmp_path / "merged-adapter" / peft_export.WEIGHTS).read_bytes()
    code, again = merge_into(tmp_path, tiny_single.path, lora_run, output="adapter")
    assert code == EXIT_OK and again["adapter_bytes"] == 0, again
    assert (tmp_path / "merged-adapter" / peft_export.WEIGHTS).read_bytes() == before


def test_a_foreign_folder_at_the_adapter_path_is_refused(tiny_single, lora_run, tmp_path):
    (tmp_path / "adapter").mkdir()
    (tmp_path / "adapter" / "notes.txt").write_text("mine")
    code, result = merge_into(
        tmp_path, tiny_single.path, lora_run, adapter_dir=str(tmp_path / "adapter"), output="adapter"
    )
    assert code == EXIT_INVALID_INPUT and "refusing to overwrite" in result["error"], result
    assert (tmp_path / "adapter" / "notes.txt").read_text() == "mine"


def test_a_module_peft_cannot_hold_is_refused_by_name(tiny_sharded, lora_run):
    targets = merge.merge_targets(open_checkpoint(str(tiny_sharded.path)), lora_mapping.deltas(lora_run[2], LORA))
    key, delta = next((k, d) for k, d in targets.items() if "mlp.down_proj" in k)
    with pytest.raises(peft_export.PeftExportError, match=r"model\.layers\.0\.post_attention_norm\.weight"):
        peft_export.adapter_tensors({"model.layers.0.post_attention_norm.weight": delta}, "float32")
    assert peft_export.adapter_tensors({key: delta}, "float32")


def test_the_merged_model_is_still_written_when_the_adapter_is_refused(tiny_sharded, lora_run, tmp_path, monkeypatch):
    """A module outside what PEFT can hold (here: down_proj, as if transformers fused it) stops the
    adapter, named in the result, not the merge."""
    monkeypatch.setattr(peft_export, "PEFT_MODULES", tuple(m for m in peft_export.PEFT_MODULES if m != "mlp.down_proj"))
    code, result = merge_into(tmp_path, tiny_sharded.path, lora_run)
    assert code == EXIT_OK, result
    assert "mlp.down_proj" in result["adapter_error"] and "adapter" not in result
    assert result["tensors_merged"] == 13 and (tmp_path / "merged" / "config.json").exists()
    assert not (tmp_path / "merged-adapter").exists()
    code, result = merge_into(tmp_path, tiny_sharded.path, lora_run, output="adapter")
    assert code == EXIT_INVALID_INPUT and "mlp.down_proj" in result["error"], result
