"""`gemma-tpu dev` end to end: the same code path as `make demo`, asserted on the final state."""

import argparse
import asyncio
import json
import os
from pathlib import Path

import numpy as np
import pytest

from gemma_operator.devcluster import dev

ROOT = Path(__file__).resolve().parents[2]
VLLM_PYTHON = os.environ.get("GEMMA_VLLM_PYTHON")
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not VLLM_PYTHON, reason="set GEMMA_VLLM_PYTHON to vLLM's environment (make test does)"),
]


def tensors(folder: Path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    out = {}
    for f in sorted(folder.glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


def test_dev_trains_merges_serves_and_answers(tmp_path):
    args = argparse.Namespace(workdir=str(tmp_path / "demo"), examples=str(ROOT / "examples" / "quickstart"),
                              vllm_python=VLLM_PYTHON, port=0, timeout=600, keep_running=False)  # fmt: skip
    out = asyncio.run(dev.run(args, asyncio.Event()))

    ft = out.fine_tune["status"]
    assert ft["phase"] == "Succeeded" and ft["progress"]["step"] == 60
    assert out.serve["status"]["phase"] == "Ready" and out.serve["status"]["readyReplicas"] == 1
    assert out.answer and out.answer.strip(), "the served model answered"
    assert out.total_seconds < 600

    merged = Path(ft["outputs"]["merged"].replace("/data", str(out.data_dir), 1))
    base = out.data_dir / "tiny-gemma4"
    assert json.loads((merged / "config.json").read_text()) == json.loads((base / "config.json").read_text())
    before, after = tensors(base), tensors(merged)
    assert before.keys() == after.keys()
    changed = {k for k in before if not np.array_equal(before[k], after[k])}
    adapted = {k for k in before if any(f"{t}.weight" in k for t in TARGETS)}
    assert changed == adapted, f"only LoRA targets change: extra {changed - adapted}, missing {adapted - changed}"
