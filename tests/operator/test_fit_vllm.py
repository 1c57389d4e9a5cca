"""The serving estimate's KV cache against vLLM's own sizing of it: the `max_memory_usage_bytes` of
the KV cache specs vLLM builds for Gemma 4's layers (vllm/v1/kv_cache_interface.py:
FullAttentionSpec for global layers, SlidingWindowSpec for sliding ones), which is what vLLM's start-up
check ("To serve at least one request with the model's max seq len ...") adds up, per TP rank.

vLLM rounds each layer up to whole blocks (plus one block for a window that starts mid-block);
the estimate does not, so vLLM may need up to two blocks per layer more, never less.
The layer counts are the planning shape's: vLLM's KV-sharing layers of e2b and e4b (no cache of
their own) make its total smaller still, which the estimate leaves out on the safe side.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from gemma_operator import fit
from gemma_operator.model_shapes import PRESETS

VLLM_PYTHON = os.environ.get("GEMMA_VLLM_PYTHON")
BLOCK = 16

_SIZE = """
import json, sys
from types import SimpleNamespace
import torch
from vllm.v1.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec
for q in json.loads(sys.argv[1]):
    config = SimpleNamespace(
        model_config=SimpleNamespace(max_model_len=q["max_model_len"]),
        parallel_config=SimpleNamespace(decode_context_parallel_size=1),
        max_in_flight_tokens=q["batched"],
    )
    bf16, tp = torch.bfloat16, q["tp"]
    full = FullAttentionSpec(block_size=q["block"], num_kv_heads=max(1, q["global_kv_heads"] // tp),
                             head_size=q["global_head_dim"], dtype=bf16)
    sliding = SlidingWindowSpec(block_size=q["block"], num_kv_heads=max(1, q["kv_heads"] // tp), head_size=q["head_dim"],
                                dtype=bf16, sliding_window=q["window"])
    print(json.dumps({"full": full.max_memory_usage_bytes(config), "full_page": full.page_size_bytes,
                      "sliding": sliding.max_memory_usage_bytes(config), "sliding_page": sliding.page_size_bytes}))
"""

# (preset, TP, maxModelLen, --max-num-batched-tokens: None is the TPU default the estimate assumes)
CASES = [
    ("gemma4-31b", 2, 8192, None),
    ("gemma4-31b", 4, 32768, None),
    ("gemma4-31b", 8, 131072, 8192),
    ("gemma4-31b", 1, 1000, None),
    ("gemma4-26b-a4b", 2, 16384, 512),
    ("gemma4-e4b", 2, 4096, None),
    ("gemma4-e2b", 1, 32768, 2048),
]


@pytest.mark.usefixtures("vllm_python")
def test_kv_cache_matches_vllms_own_sizing():
    queries = []
    for preset, tp, max_len, batched in CASES:
        s = PRESETS[preset]
        queries.append(
            {
                "max_model_len": max_len,
                "batched": batched or fit.TPU_MAX_NUM_BATCHED_TOKENS,
                "block": BLOCK,
                "tp": tp,
                "global_kv_heads": s.global_kv_heads,
                "global_head_dim": s.global_head_dim,
                "kv_heads": s.kv_heads,
                "head_dim": s.head_dim,
                "window": s.sliding_window,
            }
        )
    run = subprocess.run(
        [VLLM_PYTHON, "-c", _SIZE, json.dumps(queries)], capture_output=True, text=True, timeout=600, check=False
    )
    assert run.returncode == 0, run.stderr[-3000:]
    sized = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    assert len(sized) == len(CASES)
    for (preset, tp, max_len, batched), v in zip(CASES, sized, strict=True):
        s = PRESETS[preset]
        vllm = v["full"] * s.global_layers + v["sliding"] * s.sliding_layers
        ours = fit.kv_cache_bytes(s, max_len, batched, tp)
        slack = 2 * (v["full_page"] * s.global_layers + v["sliding_page"] * s.sliding_layers)
        assert 0 <= vllm - ours <= slack, f"{preset} TP {tp} maxModelLen {max_len}: vLLM {vllm} vs {ours:.0f}"
        estimate = fit.serving_memory(
            s, tp=tp, max_model_len=max_len, hbm_gib=32.0, gpu_memory_utilization=0.9, max_num_batched_tokens=batched
        )
        assert estimate.parts["kv(1 seq)"] == ours
