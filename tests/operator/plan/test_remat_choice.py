"""The plan picks the fastest rematerialisation whose activations fit the chip's HBM estimate, in which a
preference pair is two sequences and DPO's reference forward pass has its share."""

import pytest

from gemma_operator import fit
from gemma_operator.model_shapes import PRESETS
from gemma_operator.plan import SpecError, plan_finetune
from gemma_operator.settings import OperatorSettings
from tests.support.builders import finetune

SETTINGS = OperatorSettings()
G31 = PRESETS["gemma4-31b"]
V5P_HBM_GIB = 95.0


def estimate(seq_len: int, micro_batch: int = 1, hbm_gib: float = 32.0, method: str = "sft") -> fit.MemoryEstimate:
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
        method=method,
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


def test_a_pair_holds_two_sequences_and_dpo_adds_its_reference_forward():
    sft, orpo, dpo = (estimate(3072, hbm_gib=V5P_HBM_GIB, method=m) for m in ("sft", "orpo", "dpo"))
    for part in ("activations", "logits"):  # linear in tokens: a pair is twice a row
        assert orpo.parts[part] == pytest.approx(2 * sft.parts[part]) and dpo.parts[part] == orpo.parts[part]
    assert orpo.activations_by_remat == pytest.approx({k: 2 * v for k, v in sft.activations_by_remat.items()})
    for part in ("weights", "lora+adam", "xla"):
        assert sft.parts[part] == orpo.parts[part] == dpo.parts[part]
    # The reference: one layer's working set of both sequences (Korthikanti's 34 d + 5 heads seq bytes a
    # token, in bf16, over tp) and its float32 logits without their gradient.
    tokens, tp = 2 * 3072, 4
    layer = tokens * (34 * G31.embed_dim + 5 * G31.heads * 3072) * 2 / tp
    assert dpo.parts["reference"] == pytest.approx(layer + tokens * G31.vocab * 4 / tp)
    assert "reference" not in sft.parts and "reference" not in orpo.parts
    assert sft.total < orpo.total < dpo.total


def test_the_remat_policy_and_the_fit_account_for_the_pairs():
    # Where an sft row fits without recompute, a pair does not; a DPO pair is refused where an sft row fits.
    seq = next(
        s for s in range(1024, 32768, 512) if fit.remat_policy(estimate(s, hbm_gib=V5P_HBM_GIB, method="dpo")) != "none"
    )
    assert fit.remat_policy(estimate(seq, hbm_gib=V5P_HBM_GIB)) == "none"
    big = next(s for s in range(seq, 262144, 1024) if not estimate(s, hbm_gib=V5P_HBM_GIB, method="dpo").fits)
    assert estimate(big, hbm_gib=V5P_HBM_GIB).fits

    b = finetune("pt").tpu("v5p", "2x2x1").set("dataset.maxSeqLen", big).training(microBatchSize=1)
    assert plan_finetune(b.name, "ns", b.spec, SETTINGS).memory.fits
    dpo = b.set("method", "dpo").set("dataset.format", "preference")
    with pytest.raises(SpecError) as e:
        plan_finetune(dpo.name, "ns", dpo.spec, SETTINGS)
    [problem] = e.value.problems
    assert problem.startswith("spec.tpu: gemma4-31b does not fit v5p-8 (2x2x1) for dpo training: ")
    assert f"(seq {big}, micro-batch 1 pair (2 sequences), LoRA rank 16)" in problem
