"""Host memory and local disk of the training pod, planned like HBM: sized from the model, the
model staged on disk, and a host too small for it refused before anything is scheduled."""

import json
import math

import pytest
import yaml

from gemma_operator import cli, plan_text
from gemma_operator.children import merge, training
from gemma_operator.plan import SpecError, plan_finetune
from gemma_operator.settings import OperatorSettings
from tests.support.builders import finetune
from tests.support.validation import validate_object

GIB = 2**30
# The release's safetensors: 62.5 GB of bf16 (seed paper), the largest tensor the 262144 x 5376
# embedding; the runtime allowance and /dev/shm are the defaults of settings.TrainingHost and host.py.
RELEASE_BYTES = 62.5e9
EMBEDDING_BF16 = 262144 * 5376 * 2
RUNTIME, SHM = 16 * GIB, 1 * GIB


def paper_run(b=None):
    b = b or finetune("paper").set("model", {"hfRepo": "google/gemma-4-31B-it", "hfTokenSecretRef": {"name": "hf"}})
    return b.tpu("v5p", "2x2x1").lora(rank=64, alpha=64).training(batchSize=8, microBatchSize=1)


def plan(b, settings=None):
    return plan_finetune(b.name, "ns", b.spec, OperatorSettings() if settings is None else settings)


def pods(workload):
    if workload["kind"] == "JobSet":
        return [rj["template"]["spec"]["template"]["spec"] for rj in workload["spec"]["replicatedJobs"]]
    return [workload["spec"]["template"]["spec"]]


def gib(quantity: str) -> float:
    assert quantity.endswith("Gi"), quantity
    return float(quantity[:-2])


def memory_backed_paths(pod) -> list[str]:
    memory = {v["name"] for v in pod["volumes"] if (v.get("emptyDir") or {}).get("medium") == "Memory"}
    return [m["mountPath"] for c in pod["containers"] for m in c["volumeMounts"] if m["name"] in memory]


@pytest.mark.parametrize("topology", ["2x2x1", "2x2x2"])  # a Job on v5p-8, a JobSet pod per host on v5p-16
def test_31b_training_pod_gets_the_memory_its_load_needs_and_stages_on_disk(topology):
    p = plan(paper_run().tpu("v5p", topology).training(microBatchSize=1 if topology == "2x2x1" else 2))
    workload = training.workload(p, OperatorSettings(), None)
    validate_object(workload)
    for pod in pods(workload):
        [c] = pod["containers"]
        needed = math.ceil((RELEASE_BYTES + EMBEDDING_BF16 + RUNTIME + SHM) / GIB)
        assert c["resources"]["requests"]["memory"] == c["resources"]["limits"]["memory"] == f"{needed}Gi"
        assert needed > 64  # more than the old fixed 64Gi, which the model alone nearly filled
        env = {e["name"]: e.get("value") for e in c["env"]}
        staging = next(m for m in c["volumeMounts"] if env["TMPDIR"] == m["mountPath"])
        assert env["HF_HOME"].startswith(staging["mountPath"] + "/")
        # A memory-backed emptyDir's files count against the container's memory limit
        # (Kubernetes docs, Volumes: emptyDir medium Memory): only a bounded /dev/shm may be one.
        assert memory_backed_paths(pod) == ["/dev/shm"]
        shm = next(v for v in pod["volumes"] if v["name"] == "dshm")
        assert gib(shm["emptyDir"]["sizeLimit"]) * GIB == SHM
        volume = next(v for v in pod["volumes"] if v["name"] == staging["name"])
        claim = volume["ephemeral"]["volumeClaimTemplate"]["spec"]
        assert RELEASE_BYTES < gib(claim["resources"]["requests"]["storage"]) * GIB < 1.1 * RELEASE_BYTES
        assert "ephemeral-storage" not in c["resources"]["requests"]  # the claim holds the model, not the node


def test_staging_on_the_nodes_disk_requests_ephemeral_storage():
    settings = OperatorSettings.model_validate(
        {"training_host": {"staging_volume": "emptyDir", "node_ephemeral_storage": "180Gi"}}
    )
    [pod] = pods(training.workload(plan(paper_run(), settings), settings, None))
    [c] = pod["containers"]
    volume = next(v for v in pod["volumes"] if v["name"] == "staging")
    assert volume["emptyDir"] == {"sizeLimit": c["resources"]["limits"]["ephemeral-storage"]}
    assert c["resources"]["requests"]["ephemeral-storage"] == c["resources"]["limits"]["ephemeral-storage"]
    assert RELEASE_BYTES < gib(volume["emptyDir"]["sizeLimit"]) * GIB < 1.1 * RELEASE_BYTES
    validate_object(training.workload(plan(paper_run(), settings), settings, None))


def claim_class(pod) -> str | None:
    volume = next(v for v in pod["volumes"] if v["name"] == "staging")
    return volume["ephemeral"]["volumeClaimTemplate"]["spec"].get("storageClassName")


def test_the_staging_volume_has_the_storage_class_of_its_tpu_generation():
    """A TPU VM attaches only some disk types (Cloud TPU docs, "Storage options for Cloud TPU
    data": v5p Balanced Persistent Disk and Hyperdisk ML, v6e Hyperdisk Balanced and Hyperdisk
    ML), so no single class fits both; the merge runs on CPU nodes and takes the general one."""
    settings = OperatorSettings.model_validate(
        {
            "training_host": {
                "staging_storage_class": "standard-rwo",
                "staging_storage_classes": {"v6e": "hyperdisk-balanced"},
            }
        }
    )
    v6e = paper_run().tpu("v6e", "4x4").training(microBatchSize=4)
    assert {claim_class(pod) for pod in pods(training.workload(plan(v6e, settings), settings, None))} == {
        "hyperdisk-balanced"
    }
    [pod] = pods(training.workload(plan(paper_run(), settings), settings, None))
    assert claim_class(pod) == "standard-rwo"
    [pod] = pods(merge.job(plan(v6e, settings), settings, None))
    assert claim_class(pod) == "standard-rwo"


def test_a_v6e_staging_volume_without_a_hyperdisk_class_is_refused():
    """GKE's default StorageClasses provision Persistent Disk, which a v6e VM cannot attach: the
    pod would wait forever for its volume. The node's disk needs no class."""
    v6e = paper_run().tpu("v6e", "4x4").training(microBatchSize=4)
    with pytest.raises(SpecError) as e:
        plan(v6e)
    [msg] = e.value.problems
    assert msg.startswith("spec.model: staging gemma4-31b on a volume attached to a ct6e-standard-4t host of v6e-16")
    assert "hyperdisk-balanced, hyperdisk-ml" in msg and "training_host.staging_storage_classes.v6e" in msg
    node_disk = OperatorSettings.model_validate(
        {"training_host": {"staging_volume": "emptyDir", "node_ephemeral_storage": "180Gi"}}
    )
    assert plan(v6e, node_disk).host.staging_volume == "emptyDir"
    assert plan(paper_run()).host.storage_class is None, "v5p attaches the default class's Persistent Disk"


def test_a_model_on_a_volume_is_read_in_place_with_the_same_memory():
    b = paper_run(
        finetune("pvc")
        .set("model", {"uri": "/models/gemma-4-31B-it", "preset": "gemma4-31b"})
        .set("storage", {"persistentVolumeClaim": "models", "mountPath": "/models"})
    )
    [pod] = pods(training.workload(plan(b), OperatorSettings(), None))
    [c] = pod["containers"]
    assert "TMPDIR" not in str(c["env"]) and not any(v["name"] == "staging" for v in pod["volumes"])
    assert gib(c["resources"]["limits"]["memory"]) * GIB > RELEASE_BYTES


def test_a_model_of_unknown_size_gets_the_settings_sizes():
    settings = OperatorSettings()
    p = plan(paper_run(finetune("any").set("model", {"uri": "gs://models/someone-else"})), settings)
    [pod] = pods(training.workload(p, settings, None))
    [c] = pod["containers"]
    assert c["resources"]["limits"]["memory"] == settings.resources.training_memory
    claim = next(v for v in pod["volumes"] if v["name"] == "staging")["ephemeral"]["volumeClaimTemplate"]["spec"]
    assert claim["resources"]["requests"]["storage"] == settings.training_host.unknown_model_size
    text = plan_text.as_text(p)
    assert "host memory:   model size unknown; pod memory 64Gi" in text


def test_a_host_without_the_memory_is_refused_with_the_numbers():
    small = OperatorSettings.model_validate({"training_host": {"memory": {"ct5p-hightpu-4t": "64Gi"}}})
    with pytest.raises(SpecError) as e:
        plan(paper_run(), small)
    [msg] = e.value.problems
    needed = (RELEASE_BYTES + EMBEDDING_BF16 + RUNTIME + SHM) / GIB
    assert msg.startswith("spec.tpu: gemma4-31b does not fit the host memory of a ct5p-hightpu-4t host of v5p-8 ")
    assert f"{needed:.1f} GiB of host memory needed (checkpoint {RELEASE_BYTES / GIB:.1f}," in msg
    assert f"vs {64 * 0.9:.1f} GiB available" in msg and "training_host.memory" in msg


def test_a_node_disk_too_small_to_stage_the_model_is_refused_with_the_numbers():
    # GKE's node-sizing page: a 100 GB boot disk leaves about 43.8 GiB of allocatable ephemeral storage.
    boot = OperatorSettings.model_validate({"training_host": {"staging_volume": "emptyDir"}})
    with pytest.raises(SpecError) as e:
        plan(paper_run(), boot)
    [msg] = e.value.problems
    assert msg.startswith("spec.model: staging gemma4-31b on the node disk of a ct5p-hightpu-4t host of v5p-8 ")
    assert f"GiB of local disk needed (checkpoint {RELEASE_BYTES / GIB:.1f}, headroom" in msg
    assert "vs 43.0 GiB available" in msg and "--disk-size" in msg


def test_gemma_tpu_plan_shows_host_memory_and_staging_and_refuses_a_small_host(tmp_path, capsys):
    doc = paper_run().obj()
    crs = tmp_path / "ft.yaml"
    crs.write_text(yaml.safe_dump(doc))
    assert cli.main_exit(["plan", "-f", str(crs)]) == 0
    out = capsys.readouterr().out
    assert "host memory:   77.8 GiB needed of 403.2 GiB (checkpoint 58.2, conversion 2.6, runtime 16.0" in out
    assert "staging:       62Gi on a volume claimed with the pod at /staging" in out
    assert cli.main_exit(["plan", "-o", "json", "-f", str(crs)]) == 0
    [p] = json.loads(capsys.readouterr().out)
    assert p["host"]["memoryRequest"] == "78Gi" and p["host"]["memory"]["fits"]
    assert p["host"]["staging"]["size"] == "62Gi" and p["host"]["staging"]["volume"] == "ephemeralVolume"
    settings = tmp_path / "settings.yaml"
    settings.write_text(yaml.safe_dump({"training_host": {"memory": {"ct5p-hightpu-4t": "48Gi"}}}))
    assert cli.main_exit(["plan", "--settings", str(settings), "-f", str(crs)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "77.8 GiB of host memory needed" in err and "vs 43.2 GiB available" in err


def test_the_merge_downloads_an_hf_base_onto_a_sized_disk_and_reads_gs_in_place():
    settings = OperatorSettings()
    job = merge.job(plan(paper_run()), settings, None)
    validate_object(job)
    [pod] = pods(job)
    [c] = pod["containers"]
    env = {e["name"]: e.get("value") for e in c["env"]}
    staging = next(m for m in c["volumeMounts"] if env["HF_HOME"].startswith(m["mountPath"] + "/"))
    volume = next(v for v in pod["volumes"] if v["name"] == staging["name"])
    claim = volume["ephemeral"]["volumeClaimTemplate"]["spec"]
    assert gib(claim["resources"]["requests"]["storage"]) * GIB > RELEASE_BYTES
    assert memory_backed_paths(pod) == []
    [pod] = pods(merge.job(plan(paper_run(finetune("gs"))), settings, None))
    assert "HF_HOME" not in str(pod["containers"][0]["env"]) and not any(v["name"] == "staging" for v in pod["volumes"])


@pytest.mark.parametrize("phase", ["train", "merge"])
def test_the_disks_a_workload_writes_are_its_own(phase):
    """A volume claimed with the pod (or a PVC) is mounted root-owned unless the pod sets fsGroup
    (Kubernetes docs, "Configure a Security Context for a Pod or Container"), and the workloads
    image runs as a non-root USER: without fsGroup the download to /staging fails with EACCES."""
    b = paper_run().set("storage", {"persistentVolumeClaim": "runs", "mountPath": "/runs"})
    p = plan(b.set("output", {"uri": "/runs/out"}))
    settings = OperatorSettings()
    workload = training.workload(p, settings, None) if phase == "train" else merge.job(p, settings, None)
    for pod in pods(workload):
        written = {v["name"] for v in pod["volumes"] if "ephemeral" in v or "persistentVolumeClaim" in v}
        assert written, "the 31B hf:// run stages on a claimed disk and writes to its PVC"
        security = pod["securityContext"]
        assert security["runAsNonRoot"] is True
        assert security["fsGroup"] == security["runAsGroup"] == settings.workload_user
