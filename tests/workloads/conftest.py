"""Shared fixtures: tiny Gemma 4 checkpoints made once per session."""

import os

import numpy as np
import pytest

from gemma_devcluster import tiny


@pytest.fixture(scope="session")
def tiny_sharded(tmp_path_factory) -> tiny.TinyCheckpoint:
    """Text-only layout (`model.` keys), tensors interleaved over 3 shards."""
    return tiny.write_checkpoint(tmp_path_factory.mktemp("tiny-sharded"), shards=3)


@pytest.fixture(scope="session")
def tiny_single(tmp_path_factory) -> tiny.TinyCheckpoint:
    """The release's shape in one model.safetensors: a Gemma4ForConditionalGeneration with a tiny
    vision tower beside `model.language_model.`, whose text weights are tiny_sharded's."""
    return tiny.write_checkpoint(tmp_path_factory.mktemp("tiny-single"), shards=1, vision=tiny.TinyVisionConfig())


@pytest.fixture(scope="session")
def tiny_release(tmp_path_factory) -> tiny.TinyCheckpoint:
    """Shaped like the released 31B text decoder and saved by transformers, as a downloaded model
    is: float32 safetensors, 4 layers (3 sliding, then 1 global with K=V), final logit softcap 30."""
    import torch
    import transformers

    config = tiny.TinyConfig(layer_types=("sliding_attention",) * 3 + ("full_attention",))
    fields = {k: v for k, v in config.hf_config().items() if k not in ("architectures", "model_type", "dtype")}
    out = tmp_path_factory.mktemp("tiny-release")
    torch.manual_seed(0)
    transformers.Gemma4ForCausalLM(transformers.Gemma4TextConfig(**fields)).save_pretrained(out)
    tiny.write_tokenizer(out, config.vocab_size)
    return tiny.TinyCheckpoint(out, config, shards=1, files=sorted(p.name for p in out.iterdir()))


@pytest.fixture(scope="session")
def token_ids() -> np.ndarray:
    """A batch twice the sliding window (16), so both attention kinds are exercised."""
    rng = np.random.default_rng(0)
    return rng.integers(6, 370, size=(2, 32)).astype(np.int32)


@pytest.fixture(scope="session")
def lora_run(tiny_sharded, token_ids, tmp_path_factory):
    """A LoRA checkpoint saved the way training saves it (Tunix's checkpoint manager, with the
    optimizer state, plus `lora.json`): step 1 as initialised (B = 0), step 2 with random non-zero
    A and B. Returns the checkpoint dir, the JAX LoRA model's logits and its LoRA state at step 2."""
    import jax
    import jax.numpy as jnp
    import optax
    import orbax.checkpoint as ocp
    from flax import nnx
    from tunix.sft.checkpoint_manager import CheckpointManager

    from gemma_workloads.config import LORA_METADATA, LoraConfig, LoraMetadata
    from gemma_workloads.training import lora
    from gemma_workloads.training import model_loader as model

    config = LoraConfig(rank=4, alpha=8.0)
    m, _ = model.load_model(str(tiny_sharded.path))
    m = lora.apply_lora(m, config)
    optimizer = nnx.Optimizer(m, optax.adam(1e-3), wrt=nnx.LoRAParam)
    out = tmp_path_factory.mktemp("lora") / "checkpoints"
    manager = CheckpointManager(str(out), options=ocp.CheckpointManagerOptions(save_interval_steps=1))
    meta = LoraMetadata(
        **config.model_dump(exclude={"dropout"}), base_model_path=str(tiny_sharded.path), model_dtype="float32"
    )
    (out / LORA_METADATA).write_text(meta.model_dump_json())
    manager.save(1, m, optimizer, save_only_lora_params=True, force=True)
    leaves, treedef = jax.tree.flatten(lora.lora_state(m))
    rng = np.random.default_rng(0)
    nnx.update(m, jax.tree.unflatten(treedef, [jnp.asarray(rng.normal(0, 0.1, x.shape), jnp.float32) for x in leaves]))
    manager.save(2, m, optimizer, save_only_lora_params=True, force=True)
    manager.close()
    t = token_ids.shape[1]
    positions = jnp.tile(jnp.arange(t)[None], (token_ids.shape[0], 1))
    logits, _ = m(jnp.asarray(token_ids), positions, None, jnp.tril(jnp.ones((token_ids.shape[0], t, t), dtype=bool)))
    return out, np.asarray(logits), jax.tree.map(np.asarray, lora.lora_state(m).to_pure_dict())


@pytest.fixture(scope="session", autouse=True)
def compilation_cache(tmp_path_factory):
    """One persistent JAX compilation cache for the whole run, shared by every pytest-xdist worker
    and the training subprocesses: each distinct program compiles once (seconds each on two cores).
    It lives beside the workers' own folders, in the run's temporary root."""
    import jax

    root = tmp_path_factory.getbasetemp()
    run_root = root.parent if os.environ.get("PYTEST_XDIST_WORKER") else root
    (run_root / "jax-cache").mkdir(exist_ok=True)
    settings = {
        "jax_compilation_cache_dir": str(run_root / "jax-cache"),
        "jax_persistent_cache_min_compile_time_secs": 0,
        "jax_persistent_cache_min_entry_size_bytes": 0,
    }
    with pytest.MonkeyPatch.context() as env:
        for name, value in settings.items():
            jax.config.update(name, value)
            env.setenv(name.upper(), str(value))
        yield settings
