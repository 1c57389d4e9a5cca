"""The plan picks the fastest rematerialisation whose activations fit the chip's HBM estimate."""

import pytest

from gemma_operator import fit
from gemma_operator.model_shapes import PRESETS
from gemma_operator.plan import plan_finetune
from gemma_operator.settings import OperatorSettings
from tests.support.builders import finetune

SETTINGS = OperatorSettings()


def estimate(seq_len: int, micro_batch: int = 1, hbm_gib: float = 32.0) -> fit.MemoryEstimate:
    return fit.training_memory(
        PRESETS["gemma4-31b"],
        dtype="bfloat16",
        fsdp=1,
        tp=4,
        micro_batch=micro_batch,
        seq_len=seq_len,
        lora_rank=64,
        lora_targets=["q_proj", "v_proj"],
        remat=True,
        hbm_gib=hbm_gib,
        usable_fraction=0.9,
    )


@pytest.mark.parametrize("seq_len,expected", [(256, "none"), (2048, "dots"), (8192, "full")])
def test_the_fastest_policy_that_fits(seq_len, expected):
    memory = estimate(seq_len)
    chosen = fit.remat_policy(memory)
    assert chosen == expected
    rest = memory.total - memory.parts["activations"]
    assert rest + memory.activations_by_remat[chosen] <= memory.available or chosen == "full"
    faster = {"none": [], "dots": ["none"], "full": ["none", "dots"]}[chosen]
    assert all(rest + memory.activations_by_remat[p] > memory.available for p in faster)


def test_policies_keep_less_as_they_recompute_more():
    by = estimate(2048).activations_by_remat
    assert by["none"] > by["dots"] > by["full"]


def test_the_plan_sets_the_policy_only_with_gradient_checkpointing():
    def train(**training):
        b = finetune("r").tpu("v5p", "2x2x1").set("dataset.maxSeqLen", 3072).training(microBatchSize=1, **training)
        return plan_finetune(b.name, "ns", b.spec, SETTINGS, b.obj()["metadata"].get("labels")).train

    chosen = train()
    assert chosen.remat_policy in ("none", "dots", "full") and chosen.remat == chosen.remat_policy
    off = train(gradientCheckpointing=False)
    assert off.remat_policy is None and off.remat == "none"
