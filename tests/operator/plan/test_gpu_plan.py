"""Spec -> plan on GPUs: the spec's gpu block beside tpu (one or the other), the mesh over the pod's
GPUs, the HBM and host memory fit per GPU, the duration at the GPU's assumed MFU and the price per
GPU-hour; serving with tensor parallelism over the GPUs."""

import pytest

from gemma_operator import api, fit, gpu
from gemma_operator.model_shapes import PRESETS
from gemma_operator.plan import SpecError, plan_finetune, plan_serve
from gemma_operator.settings import OperatorSettings
from gemma_operator.training_method import METHOD_COST
from tests.support.builders import finetune, serve

SETTINGS = OperatorSettings()


def plan(b, settings=SETTINGS):
    return plan_finetune(b.name, "ns", b.spec, settings)


def paper_h100(b=None):
    """The seed paper's GPU baseline: 2x H100 80GB, its recipe (rank 64, seq 3072, effective batch 8)."""
    b = b or finetune("h100")
    return (
        b.gpu("nvidia-h100-80gb", 2)
        .lora(rank=64, alpha=64, dropout=0.05)
        .training(steps=1244, batchSize=8, microBatchSize=1, gradientCheckpointing=True)
        .set("dataset.maxSeqLen", 3072)
    )


def test_the_paper_s_gpu_baseline_plans_on_two_h100s():
    p = plan(paper_h100())
    assert p.placement.gpus is not None and p.placement.slice is None
    assert (p.placement.chips, p.placement.hosts, p.multi_host) == (2, 1, False)
    assert p.placement.node.machine_type == "a3-highgpu-2g"
    # fsdp x tp over the pod's GPUs, as on TPU: tp as large as divides the heads, up to 4.
    assert (p.mesh.fsdp, p.mesh.tp, p.micro_batch, p.train.grad_accumulation) == (1, 2, 1, 8)
    assert p.memory.fits and p.memory.unit == "per GPU"
    assert p.memory.available == pytest.approx(80 * fit.GIB * SETTINGS.hbm_usable_fraction)
    # The weights are sharded over both GPUs: half of 31B's bf16 bytes on each.
    assert p.memory.parts["weights"] == pytest.approx(PRESETS["gemma4-31b"].params * 2 / 2)
    assert p.train.peak_tflops_per_device == 989.0
    assert p.image == SETTINGS.images.workloads_cuda and p.merge_image == SETTINGS.images.workloads


def test_hours_at_the_gpu_s_mfu_and_dollars_at_its_price_per_gpu_hour():
    p = plan(paper_h100())
    shape, est = PRESETS["gemma4-31b"], p.estimate
    assert est.tokens == 1244 * 8 * 3072
    flops = est.tokens * METHOD_COST["sft"].flops_per_token(shape)
    assert est.hours == pytest.approx(flops / (2 * 989e12 * SETTINGS.assumed_gpu_mfu) / 3600)
    assert est.chip_hours == pytest.approx(2 * est.hours)
    # The paper's a3-highgpu-2g rate: $22.12/h for two GPUs.
    assert p.price.per_chip_hour == SETTINGS.prices_per_gpu_hour["nvidia-h100-80gb"] == 11.06
    assert est.cost == pytest.approx(est.chip_hours * 11.06)
    assert p.price.device == "GPU" and "built-in list price, unverified" in p.price.source
    slower = plan(paper_h100(), OperatorSettings(assumed_gpu_mfu=SETTINGS.assumed_gpu_mfu / 2))
    assert slower.estimate.hours == pytest.approx(2 * est.hours)


def test_a_gpu_without_a_price_is_priced_at_nothing_and_says_so():
    p = plan(finetune("l4").gpu("nvidia-a100-80gb", 4))
    assert p.price.per_chip_hour == 0.0 and p.estimate.cost == 0.0
    assert p.price.source == "no nvidia-a100-80gb rate in settings.prices_per_gpu_hour: priced at nothing"
    priced = plan(
        finetune("l4").gpu("nvidia-a100-80gb", 4), OperatorSettings(prices_per_gpu_hour={"nvidia-a100-80gb": 5.0})
    )
    assert priced.estimate.cost == pytest.approx(priced.estimate.chip_hours * 5.0)
    spot = plan(
        finetune("s").gpu("nvidia-h100-80gb", 8, spot=True),
        OperatorSettings(spot_prices_per_gpu_hour={"nvidia-h100-80gb": 4.0}),
    )
    assert (spot.price.per_chip_hour, spot.price.basis) == (4.0, "spot")
    assert spot.train.termination_grace_seconds == SETTINGS.spot_termination_grace_seconds


def test_a_model_too_large_for_its_gpus_is_refused_naming_spec_gpu():
    with pytest.raises(SpecError) as e:
        plan(finetune("l4").gpu("nvidia-l4", 1))
    [hbm] = [m for m in e.value.problems if "HBM" in m or "per GPU" in m]
    assert hbm.startswith("spec.gpu: gemma4-31b does not fit 1x L4 (g2-standard-32) for training: ")
    assert "GiB per GPU needed" in hbm and "use more GPUs (gpu.count) or a GPU with more memory" in hbm
    small = OperatorSettings(training_host={"memory": {"a3-highgpu-2g": "64Gi"}})
    with pytest.raises(SpecError) as e:
        plan(paper_h100(), small)
    assert e.value.problems[0].startswith(
        "spec.gpu: gemma4-31b does not fit the host memory of the node of 2x H100 80GB (a3-highgpu-2g) for training: "
    )


def test_a_pod_of_fewer_gpus_than_its_node_plans_for_its_share_of_the_node_s_memory():
    p = plan(finetune("h200").gpu("nvidia-h200-141gb", 2))
    machine = gpu.TYPES["nvidia-h200-141gb"].machine(2)
    assert machine.gpus == 8
    expected = machine.memory_gib * fit.GIB * 2 / 8 * SETTINGS.training_host.memory_usable_fraction
    assert p.host.memory.available == pytest.approx(expected)
    told = plan(
        finetune("h200").gpu("nvidia-h200-141gb", 2),
        OperatorSettings(training_host={"memory": {"a3-ultragpu-8g": "2000Gi"}}),
    )
    assert told.host.memory.available == pytest.approx(
        2000 * fit.GIB / 4 * SETTINGS.training_host.memory_usable_fraction
    )


@pytest.mark.parametrize("kind", ["finetune", "serve"])
def test_tpu_and_gpu_together_are_refused_with_one_message(kind):
    b = (finetune("b") if kind == "finetune" else serve("s")).tpu("v5p").gpu("nvidia-h100-80gb", 2)
    with pytest.raises(SpecError) as e:
        (plan_finetune if kind == "finetune" else plan_serve)(b.name, "ns", b.spec, SETTINGS)
    assert e.value.problems == [f"spec: {api.ONE_ACCELERATOR}"]


def test_neither_tpu_nor_gpu_is_the_kind_s_default_slice_as_before():
    ft = plan(finetune("d"))
    sv = plan_serve("s", "ns", serve("s").spec, SETTINGS)
    assert (ft.placement.accelerator, ft.placement.slice.topology) == ("v5p", "2x2x1")
    assert (sv.placement.accelerator, sv.placement.slice.topology) == ("v6e", "2x4")
    assert ft.spec.gpu is None and sv.spec.gpu is None


def test_serving_on_gpus_is_tensor_parallel_over_them():
    p = plan_serve("s", "ns", serve("s").gpu("nvidia-h100-80gb", 2).spec, SETTINGS, fine_tune_preset="gemma4-31b")
    assert (p.tensor_parallel, p.multi_host, p.image) == (2, False, SETTINGS.images.serving_gpu)
    shape = PRESETS["gemma4-31b"]
    # vLLM's own default batch on an H100 sizes the sliding layers' KV (fit.kv_cache_bytes).
    assert p.memory.parts["kv(1 seq)"] == fit.kv_cache_bytes(shape, 4096, 8192, 2)
    assert p.memory.fits and p.memory.unit == "per GPU"
    assert p.cost.per_replica_hour == pytest.approx(2 * 11.06) and p.cost.price.device == "GPU"
    with pytest.raises(SpecError) as e:
        plan_serve("s", "ns", serve("s").gpu("nvidia-l4", 1).spec, SETTINGS, fine_tune_preset="gemma4-31b")
    assert e.value.problems[0].startswith("spec.gpu: gemma4-31b does not fit 1x L4 (g2-standard-32) for serving: ")


def test_a_gpu_count_outside_the_catalogue_is_refused_by_the_schema():
    with pytest.raises(SpecError) as e:
        plan(finetune("x").gpu("nvidia-h100-80gb", 3))
    assert e.value.problems == ["spec.gpu.count: Input should be 1, 2, 4 or 8"]


def test_a_service_stored_with_the_old_tpu_default_keeps_its_revision():
    """Before spec.gpu the CRD defaulted the whole tpu block, so stored services carry the block the
    API server wrote; one created now carries none. Both are the same service: same pods, same revision."""
    stored = serve("s").tpu("v6e", spot=False).spec
    created = serve("s").spec
    assert "tpu" not in created
    revision = [plan_serve("s", "ns", spec, SETTINGS, model_uri="gs://m/merged").revision for spec in (stored, created)]
    assert revision[0] == revision[1]
    gpu_revision = plan_serve(
        "s", "ns", serve("s").gpu("nvidia-h100-80gb", 2).spec, SETTINGS, model_uri="gs://m/merged"
    )
    assert gpu_revision.revision != revision[0]
