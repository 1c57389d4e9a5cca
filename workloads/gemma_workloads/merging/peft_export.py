"""The LoRA adapter as a Hugging Face PEFT folder: `adapter_config.json` + `adapter_model.safetensors`.

PEFT's LoRA computes `x @ lora_A.T @ lora_B.T * lora_alpha / r`, with lora_A (r, in) and lora_B
(out, r); `lora_mapping` already flattens each Qwix factor pair to A (in, r) and B (r, out) under
the same `alpha / rank` scale, so an export is a transpose per module, nothing fitted or merged:
q_einsum, attn_vec_einsum and the MLP kernels map to one module each; the sliding layers' fused
kv_einsum gives k_proj and v_proj the same A (PEFT stores it twice) and their halves of B; a
global layer's k_einsum is k_proj alone, which transformers also uses as the value (K = V).

`target_modules` is a regex (PEFT full-matches it against module names) naming exactly the
decoder modules the file holds: a bare list such as ["q_proj"] also matches the vision tower's
projections, and a module matched but absent from the file would load as an untrained adapter.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import numpy as np

from gemma_workloads.config import LoraConfig
from gemma_workloads.merging.lora_mapping import Delta
from gemma_workloads.safetensors_io import DTYPE_NAMES, FLOAT_DTYPES, header_bytes

CONFIG = "adapter_config.json"
WEIGHTS = "adapter_model.safetensors"
# The decoder modules transformers' Gemma 4 builds as nn.Linear, which PEFT's LoRA can wrap.
PEFT_MODULES = (
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
)
_MODULE = re.compile(r"(.+\.layers\.(\d+)\.(.+))\.weight")


class PeftExportError(ValueError):
    """A LoRA target a PEFT adapter cannot hold; the message names it."""


def adapter_tensors(targets: dict[str, Delta], dtype: str) -> dict[str, np.ndarray]:
    """PEFT tensor name -> lora_A (r, in) or lora_B (out, r), from base key -> delta."""
    out: dict[str, np.ndarray] = {}
    np_dtype = FLOAT_DTYPES[DTYPE_NAMES[dtype]]
    for key, delta in sorted(targets.items()):
        m = _MODULE.fullmatch(key)
        if not m or m.group(3) not in PEFT_MODULES:
            raise PeftExportError(
                f"LoRA {delta.source} adapts {key}, which is not a module a PEFT LoRA adapter can hold "
                f"(allowed: {', '.join(PEFT_MODULES)})"
            )
        prefix = f"base_model.model.{m.group(1)}"
        out[f"{prefix}.lora_A.weight"] = np.ascontiguousarray(delta.a.T.astype(np_dtype))
        out[f"{prefix}.lora_B.weight"] = np.ascontiguousarray(delta.b.T.astype(np_dtype))
    return out


def target_regex(module_names: list[str]) -> str:
    """A regex full-matching these module paths and no other: layers sharing a set of modules are
    grouped, so a 60-layer model gives a line, not 420 names."""
    by_layer: dict[tuple[str, int], set[str]] = {}
    for name in module_names:
        m = re.fullmatch(r"(.+)\.layers\.(\d+)\.(.+)", name)
        if not m:
            raise PeftExportError(f"module {name}: not a decoder layer's module")
        by_layer.setdefault((m.group(1), int(m.group(2))), set()).add(m.group(3))
    groups: dict[tuple[str, tuple[str, ...]], list[int]] = {}
    for (prefix, layer), modules in sorted(by_layer.items()):
        groups.setdefault((prefix, tuple(sorted(modules))), []).append(layer)
    alternatives = [
        rf"{re.escape(prefix)}\.layers\.(?:{'|'.join(map(str, layers))})\.(?:{'|'.join(map(re.escape, modules))})"
        for (prefix, modules), layers in groups.items()
    ]
    return alternatives[0] if len(alternatives) == 1 else "(?:" + "|".join(alternatives) + ")"


def adapter_config(lora: LoraConfig, base_model: str, module_names: list[str]) -> dict:
    """The fields PEFT and vLLM read; DoRA, rsLoRA and modules_to_save off, as vLLM requires."""
    alpha = int(lora.alpha) if float(lora.alpha).is_integer() else lora.alpha
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model,
        "r": lora.rank,
        "lora_alpha": alpha,
        "lora_dropout": lora.dropout,
        "target_modules": target_regex(module_names),
        "bias": "none",
        "fan_in_fan_out": False,
        "use_rslora": False,
        "use_dora": False,
        "modules_to_save": None,
        "inference_mode": True,
    }


def complete(folder: Path, inputs: str) -> bool:
    """Whether `folder` holds the adapter of these inputs; anything else there is refused."""
    if not folder.exists() or not any(folder.iterdir()):
        return False
    weights = folder / WEIGHTS
    if (folder / CONFIG).exists() and weights.exists() and _metadata(weights).get("merge_inputs") == inputs:
        return True
    raise PeftExportError(f"{folder} already holds something other than this run's adapter: refusing to overwrite it")


def _metadata(path: Path) -> dict:
    with path.open("rb") as f:
        size = int.from_bytes(f.read(8), "little")
        return json.loads(f.read(size)).get("__metadata__", {})


def write(folder: Path, tensors: dict[str, np.ndarray], config: dict, inputs: str) -> int:
    """Both files built in `<folder>.partial` and renamed into place; returns the bytes written."""
    staging = folder.with_name(folder.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    names = sorted(tensors)
    entries = [(n, _dtype_name(tensors[n].dtype), tensors[n].shape) for n in names]
    with (staging / WEIGHTS).open("wb") as f:
        f.write(header_bytes(entries, {"format": "pt", "merge_inputs": inputs}))
        for n in names:
            f.write(tensors[n].tobytes())
        f.flush()
        os.fsync(f.fileno())
    (staging / CONFIG).write_text(json.dumps(config, indent=2) + "\n")
    if folder.exists():
        folder.rmdir()  # only an empty folder (one made in advance) is replaced
    os.rename(staging, folder)
    return sum(p.stat().st_size for p in folder.iterdir())


def export(folder: Path, targets: dict[str, Delta], lora: LoraConfig, base_model: str, dtype: str, inputs: str) -> int:
    """The adapter of these deltas (base key -> delta) in `folder`, unless already there; returns
    the bytes written (0 when it was)."""
    tensors = adapter_tensors(targets, dtype)
    if complete(folder, inputs):
        return 0
    modules = [key.removesuffix(".weight") for key in targets]
    return write(folder, tensors, adapter_config(lora, base_model, modules), inputs)


def _dtype_name(dtype: np.dtype) -> str:
    return next(name for name, d in FLOAT_DTYPES.items() if d == dtype)
