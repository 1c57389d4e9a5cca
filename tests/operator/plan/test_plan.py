"""Spec -> plan: derived values, and a table of bad specs with their exact messages."""

import pytest

from gemma_operator import fit, tpu
from gemma_operator.model_shapes import PRESETS, infer_preset
from gemma_operator.plan import SpecError, default_mesh, plan_finetune, plan_serve
from gemma_operator.settings import OperatorSettings
from gemma_workloads.config import MeshConfig
from tests.support.builders import finetune, serve

SETTINGS = OperatorSettings()


def plan(b):
    return plan_finetune(b.name, "ns", b.spec, SETTINGS, b.obj()["metadata"].get("labels"))


def test_paper_recipe_on_v5p8():
    p = plan(
        finetune("paper")
        .tpu("v5p", "2x2x1")
        .lora(rank=64, alpha=64, dropout=0.05)
        .training(steps=1244, batchSize=8, microBatchSize=1)
        .set("dataset.maxSeqLen", 3072)
    )
    assert (p.placement.hosts, p.placement.chips_per_host, p.multi_host) == (1, 4, False)
    assert (p.mesh.fsdp, p.mesh.tp, p.micro_batch, p.train.grad_accumulation) == (1, 4, 1, 8)
    assert p.memory.fits and 15 * fit.GIB < p.memory.total < 30 * fit.GIB
    # The paper: 3.34 h and $56.11 for this run; the estimate is calibrated on it.
    assert 3.0 < p.estimate.hours < 3.8 and 50 < p.estimate.cost < 65
    assert p.train.model_path == "gs://models/gemma-4-31B-it"
    assert p.train.output_dir == f"gs://out/paper/runs/{p.run}"
    assert p.merge.checkpoint_dir == f"gs://out/paper/runs/{p.run}/checkpoints"
    assert p.merge.base_model_path == p.train.model_path


@pytest.mark.parametrize("devices,expected", [(1, (1, 1)), (4, (1, 4)), (8, (2, 4)), (16, (4, 4)), (64, (16, 4))])
def test_default_mesh_follows_the_paper(devices, expected):
    m = default_mesh(devices, PRESETS["gemma4-31b"])
    assert (m.fsdp, m.tp) == expected


def test_default_mesh_respects_kv_heads():
    assert default_mesh(4, PRESETS["gemma4-e2b"]).tp == 1  # a single KV head cannot be split
    assert default_mesh(8, PRESETS["gemma4-e4b"]).tp == 2


def test_run_id_follows_training_inputs_only():
    a = plan(finetune("r").tpu("v5p"))
    assert plan(finetune("r").tpu("v5p").set("suspend", True)).run == a.run
    assert plan(finetune("r").tpu("v5p").set("backoffLimit", 9)).run == a.run
    assert plan(finetune("r").tpu("v5p").training(learningRate=2e-4)).run != a.run
    assert plan(finetune("r").tpu("v5p").set("merge.dtype", "float32")).merge_id != a.merge_id
    assert plan(finetune("r").tpu("v5p").training(compilationCache=False)).run == a.run, "the cache is not an input"
    unrolled = plan(finetune("r").tpu("v5p").training(scanLayers=False))
    assert unrolled.run == a.run and a.train.scan_layers and not unrolled.train.scan_layers, "same checkpoints"


def test_every_pod_of_every_run_shares_one_compilation_cache():
    """Beside the fine-tune's runs by default, so a restarted attempt, a resumed run and the next run
    of the same shapes read what an earlier one compiled; a cluster-wide prefix from the settings
    gets a folder per namespace; spec.training.compilationCache false turns it off."""
    first, second = plan(finetune("c").tpu("v5p")), plan(finetune("c").tpu("v5p").training(learningRate=2e-4))
    assert first.run != second.run
    for p in (first, second):
        assert p.train.compilation_cache_dir == p.merge.compilation_cache_dir == "gs://out/c/compilation-cache"
    shared = OperatorSettings(compilation_cache_uri="gs://platform/xla-cache")
    b = finetune("c").tpu("v5p")
    p = plan_finetune(b.name, "team-a", b.spec, shared)
    assert p.train.compilation_cache_dir == p.merge.compilation_cache_dir == "gs://platform/xla-cache/team-a"
    off = plan(finetune("c").tpu("v5p").training(compilationCache=False))
    assert off.train.compilation_cache_dir is None and off.merge.compilation_cache_dir is None


def test_preset_inferred_from_hf_repo_and_hf_uri():
    assert infer_preset("google/gemma-4-31B-it") == "gemma4-31b"
    assert infer_preset("google/gemma-4-E4B-it") == "gemma4-e4b"
    assert infer_preset("someone/llama") is None
    p = plan(
        finetune("h").set("model", {"hfRepo": "google/gemma-4-31B-it", "hfTokenSecretRef": {"name": "hf"}}).tpu("v5p")
    )
    assert p.preset == "gemma4-31b" and p.train.model_path == "hf://google/gemma-4-31B-it"


def test_kueue_queue_from_label_or_settings():
    assert plan(finetune("q").tpu("v5p").label("kueue.x-k8s.io/queue-name", "lq")).queue == "lq"
    s = OperatorSettings(kueue_queue="default-lq")
    assert plan_finetune("q", "ns", finetune("q").tpu("v5p").spec, s).queue == "default-lq"


BAD_SPECS = [
    (finetune("b").lora(rank=0), "spec.lora.rank: Input should be greater than or equal to 1"),
    (
        finetune("b").lora(targetModules=["q_proj", "k_proj"]),
        "spec.lora.targetModules: k_proj and v_proj share one fused projection (kv_einsum) on sliding layers: list both or neither",
    ),
    (
        finetune("b").lora(targetModules=["qkv_proj"]),
        "spec.lora.targetModules.0: Input should be 'q_proj', 'k_proj', 'v_proj', 'o_proj', 'gate_proj', 'up_proj' or 'down_proj'",
    ),
    (finetune("b").tpu("v7x"), "spec.tpu.accelerator: Input should be 'v5p', 'v6e' or 'cpu'"),
    (
        finetune("b").tpu("v5p", "2x2"),
        "spec.tpu.topology: v5p has no topology '2x2'; allowed: 2x2x1, 2x2x2, 2x2x4, 2x4x4, "
        "4x4x4, 4x4x8, 4x8x8, 8x8x8, 8x8x16, 8x16x16, 16x16x16, 16x16x24",
    ),
    (finetune("b").tpu("cpu", "2x2x1"), "spec.tpu.topology: not used with accelerator cpu"),
    (
        finetune("b").training(epochs=2),
        "spec.training: Value error, set steps or epochs, not both".replace("Value error, ", ""),
    ),
    (
        finetune("b").tpu("v5p").training(mesh={"fsdp": 2, "tp": 4}),
        "spec.training.mesh: fsdp 2 x tp 4 = 8 devices, but v5p-8 (2x2x1) has 4",
    ),
    (
        finetune("b").tpu("v5p", "2x2x2").training(mesh={"fsdp": 1, "tp": 8}),
        "spec.training.mesh.tp: 8 does not divide gemma4-31b's attention heads (32), KV heads (16) and global KV heads (4)",
    ),
    (
        finetune("b").tpu("v5p", "2x2x2").training(microBatchSize=1),
        "spec.training.microBatchSize: 1 must be a multiple of the mesh's fsdp size 2 (each data-parallel shard takes whole sequences)",
    ),
    (
        finetune("b").training(batchSize=6, microBatchSize=4),
        "spec.training.microBatchSize: 4 does not divide batchSize 6",
    ),
    (
        finetune("b").set("model", {"uri": "gs://models/x", "hfRepo": "google/gemma-4-31B-it"}),
        "spec.model: set exactly one of uri or hfRepo",
    ),
    (
        finetune("b").set("model.uri", "s3://bucket/m"),
        "spec.model.uri: 's3://bucket/m' is neither a gs://bucket/path URI (bucket: 3-63 of a-z, 0-9, -, _ and .) nor an absolute path",
    ),
    (
        finetune("b").set("output.uri", "/out"),
        "spec.output.uri: /out is a local path; set spec.storage.persistentVolumeClaim so the pods can reach it, or use a gs:// URI",
    ),
    (
        finetune("b").set("output.uri", "/out").set("storage", {"persistentVolumeClaim": "pvc", "mountPath": "/data"}),
        "spec.output.uri: /out is not under spec.storage.mountPath /data",
    ),
    (finetune("b").set("merge.shardSize", "5 gigs"), "spec.merge.shardSize: '5 gigs' is not a size such as 5GB or 4Gi"),
    (
        finetune("b").set("serviceAccountName", "Bad_Name"),
        "spec.serviceAccountName: 'Bad_Name' is not a valid Kubernetes name (lowercase letters, digits, '-' and '.')",
    ),
    (finetune("b").set("trainng", {}), "spec.trainng: unknown field"),
    # Two mounts at one path: the API server refuses the pod (Kubernetes pkg/apis/core/validation,
    # volumeMounts: mountPath "must be unique").
    (
        finetune("b").cpu_tiny("/staging"),
        "spec.storage.mountPath: /staging is where the operator mounts its own "
        "volumes (/etc/gemma-tpu, /dev/shm, /staging, /gcs); choose another path",
    ),
]


@pytest.mark.parametrize("builder,message", BAD_SPECS, ids=[m.split(":")[0] for _, m in BAD_SPECS])
def test_bad_specs_name_the_field_and_the_problem(builder, message):
    with pytest.raises(SpecError) as e:
        plan(builder)
    assert message in e.value.problems, e.value.problems


def test_hbm_refusal_carries_the_numbers():
    with pytest.raises(SpecError) as e:
        plan(finetune("b").tpu("v6e", "2x2").set("dataset.maxSeqLen", 8192))
    msg, *others = e.value.problems
    assert [o.split(":")[0] for o in others] == ["spec.model"], "and no StorageClass for its staging volume"
    assert msg.startswith("spec.tpu: gemma4-31b does not fit v6e-4 (2x2) for training: ")
    assert "GiB per chip needed (weights 14.3, lora+adam" in msg and "vs 28.8 GiB available" in msg


def test_remat_is_what_makes_long_sequences_fit():
    fits = plan(finetune("r").tpu("v5p").set("dataset.maxSeqLen", 4096).training(microBatchSize=1))
    assert fits.memory.fits
    with pytest.raises(SpecError, match="enable training.gradientCheckpointing"):
        plan(
            finetune("r")
            .tpu("v5p")
            .set("dataset.maxSeqLen", 4096)
            .training(microBatchSize=1, gradientCheckpointing=False)
        )


def test_serving_plan():
    hyperdisk = OperatorSettings.model_validate({"training_host": {"staging_storage_classes": {"v6e": "hd"}}})
    p = plan_serve("s", "ns", serve("s").set("model", {"hfRepo": "google/gemma-4-31B-it"}).spec, hyperdisk)
    assert p.placement.slice.name == "v6e-8" and p.tensor_parallel == 8 and p.served_name == "s"
    assert p.memory.fits and p.model_uri == "hf://google/gemma-4-31B-it"
    assert fit.concurrent_sequences(p.memory) > 64
    with pytest.raises(SpecError, match=r"gemma4-31b does not fit v6e-1 \(1x1\) for serving"):
        plan_serve(
            "s", "ns", serve("s").set("model", {"hfRepo": "google/gemma-4-31B-it"}).tpu("v6e", "1x1").spec, SETTINGS
        )
    with pytest.raises(SpecError, match="set exactly one of fineTuneRef, uri or hfRepo"):
        plan_serve("s", "ns", {"model": {}}, SETTINGS)
    with pytest.raises(SpecError, match="--api-key must come from a Secret"):
        plan_serve("s", "ns", serve("s").set("vllm", {"extraArgs": ["--api-key=abc"]}).spec, SETTINGS)


def test_a_serving_volume_may_not_take_a_path_the_vllm_pod_mounts():
    b = serve("s").tpu("cpu").set("model", {"uri": "/tmp/m"})
    b.set("storage", {"persistentVolumeClaim": "d", "mountPath": "/tmp/"})
    with pytest.raises(
        SpecError,
        match=r"spec.storage.mountPath: /tmp/ is where the operator mounts its own volumes "
        r"\(/models/model, /xla-cache, /dev/shm, /cache, /tmp, /staging\)",
    ):
        plan_serve("s", "ns", b.spec, SETTINGS)
    assert plan_serve("s", "ns", b.set("storage.mountPath", "/tmp/data").set("model.uri", "/tmp/data/m").spec, SETTINGS)


def test_fine_tune_ref_waits_for_the_output():
    p = plan_serve("s", "ns", serve("s").fine_tune("ft").spec, SETTINGS)
    assert p.model_uri is None
    p2 = plan_serve(
        "s", "ns", serve("s").fine_tune("ft").spec, SETTINGS, model_uri="gs://o/merged", fine_tune_preset="gemma4-31b"
    )
    assert p2.model_uri == "gs://o/merged" and p2.preset == "gemma4-31b" and p2.revision != p.revision


def test_a_slice_of_several_hosts_is_a_multi_host_run():
    p = plan(finetune("m").tpu("v5p", "2x2x4"))
    assert (p.placement.hosts, p.multi_host, p.train.num_hosts) == (4, True, 4)


def test_the_cpu_profile_trains_on_one_device():
    assert plan(finetune("c").cpu_tiny()).mesh == MeshConfig(fsdp=1, tp=1)
    with pytest.raises(SpecError, match="spec.training.mesh: fsdp 2 x tp 1 = 2 devices, but cpu has 1"):
        plan(finetune("c").cpu_tiny().training(mesh={"fsdp": 2, "tp": 1}))


def test_the_trainer_reports_mfu_against_the_chips_peak_only_on_a_tpu():
    assert plan(finetune("t").tpu("v5p")).train.peak_tflops_per_device == tpu.GENERATIONS["v5p"].peak_bf16_tflops
    assert plan(finetune("c").cpu_tiny()).train.peak_tflops_per_device is None


def test_a_model_without_a_preset_is_labelled_by_the_last_part_of_its_location():
    p = plan(finetune("u").set("model", {"uri": "gs://models/team/my-gemma"}).tpu("v5p"))
    assert (p.preset, p.model_label) == (None, "my-gemma")


@pytest.mark.parametrize("rank,targets", [(8, ["q_proj", "o_proj"]), (64, None), (256, None)])
def test_the_merge_pod_holds_three_float32_copies_of_a_tensor_per_worker_and_the_lora_state(rank, targets):
    """The streaming merge holds per worker one target tensor three times in float32 (base, delta,
    sum) and the whole LoRA state in float32, plus 2 GiB of read and write buffers."""
    lora = {"rank": rank} | ({"targetModules": targets} if targets else {})
    p = plan(finetune("m").tpu("v5p").lora(**lora))
    targets = p.spec.lora.target_modules
    need = p.merge.workers * 3 * 4 * p.shape.largest_target_elements(targets) + 4 * p.shape.lora_params(rank, targets)
    assert need + 2 * fit.GIB <= p.merge_memory_gib * fit.GIB < need + 3 * fit.GIB
