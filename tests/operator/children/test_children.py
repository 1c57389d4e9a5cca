"""The child objects: what GKE, JobSet and Kueue need to see on them."""

import json

from gemma_operator import failure_policy
from gemma_operator.children import common, merge, training
from gemma_operator.plan import plan_finetune
from gemma_operator.settings import OperatorSettings
from gemma_workloads.config import MergeConfig, TrainConfig
from tests.support.builders import finetune
from tests.support.validation import validate_object

SETTINGS = OperatorSettings()
OWNER = common.owner_reference(__import__("gemma_operator.api", fromlist=["FINETUNE"]).FINETUNE, "x", "uid-1")


def ft_plan(b):
    return plan_finetune(b.name, "ns", b.spec, SETTINGS, b.obj()["metadata"].get("labels"))


def pod_spec(obj):
    if obj["kind"] == "JobSet":
        return obj["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    return obj["spec"]["template"]["spec"]


def test_single_host_v5p8_is_one_pod_with_four_chips():
    p = ft_plan(finetune("ft").tpu("v5p", "2x2x1", spot=True))
    job = training.workload(p, SETTINGS, OWNER)
    assert job["kind"] == "Job" and job["metadata"]["ownerReferences"] == [OWNER]
    spec = pod_spec(job)
    [c] = spec["containers"]
    assert c["resources"]["limits"]["google.com/tpu"] == "4" == c["resources"]["requests"]["google.com/tpu"]
    assert spec["nodeSelector"] == {
        "cloud.google.com/gke-tpu-accelerator": "tpu-v5p-slice",
        "cloud.google.com/gke-tpu-topology": "2x2x1",
        "cloud.google.com/gke-spot": "true",
    }
    assert {"key": "google.com/tpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
    assert spec["restartPolicy"] == "Never" and c["terminationMessagePolicy"] == "FallbackToLogsOnError"
    assert c["command"] == ["python", "-m", "gemma_workloads", "train", "--config", "/etc/gemma-tpu/train.json"]
    assert {"name": "XLA_FLAGS", "value": "--xla_llvm_disable_expensive_passes=true"} in c["env"]
    rules = job["spec"]["podFailurePolicy"]["rules"]
    assert rules[0] == {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}
    assert rules[1]["onExitCodes"] == {"containerName": "trainer", "operator": "In", "values": [42]}
    assert rules[2]["action"] == "FailJob" and 1 not in rules[2]["onExitCodes"]["values"]
    assert 143 in rules[2]["onExitCodes"]["values"]  # SIGTERM/SIGKILL are retried, counted
    validate_object(job)


def test_multi_host_v5p16_is_a_jobset_gang():
    p = ft_plan(finetune("ft").tpu("v5p", "2x2x2").training(microBatchSize=2))
    js = training.workload(p, SETTINGS, OWNER)
    assert js["apiVersion"] == "jobset.x-k8s.io/v1alpha2" and js["kind"] == "JobSet"
    assert (
        js["metadata"]["annotations"]["alpha.jobset.sigs.k8s.io/exclusive-topology"] == "cloud.google.com/gke-nodepool"
    )
    assert js["spec"]["network"] == {"enableDNSHostnames": True, "publishNotReadyAddresses": True}
    [rj] = js["spec"]["replicatedJobs"]
    job_spec = rj["template"]["spec"]
    assert rj["replicas"] == 1
    assert (job_spec["parallelism"], job_spec["completions"], job_spec["completionMode"], job_spec["backoffLimit"]) == (
        2,
        2,
        "Indexed",
        0,
    )
    [c] = pod_spec(js)["containers"]
    assert c["resources"]["limits"]["google.com/tpu"] == "4" and c["ports"] == [{"containerPort": 8471, "name": "jax"}]
    policy = js["spec"]["failurePolicy"]
    assert policy["maxRestarts"] == 3
    assert [r["action"] for r in policy["rules"]] == ["RestartJobSetAndIgnoreMaxRestarts", "FailJobSet"]
    assert policy["rules"][0]["onJobFailureMessagePatterns"] == [failure_policy.PREEMPTION_MESSAGE]
    assert all(r["action"] == "FailJob" for r in job_spec["podFailurePolicy"]["rules"])
    cfg = TrainConfig.model_validate_json(training.config_map(p, OWNER)["data"]["train.json"])
    assert cfg.num_hosts == 2 and cfg.mesh.fsdp == 2 and cfg.mesh.tp == 4
    validate_object(js)


def test_preemption_message_pattern_matches_what_the_job_controller_writes():
    import re

    msg = "Container trainer for pod ml/x-0 failed with exit code 42 matching FailJob rule at index 1"
    assert re.search(failure_policy.PREEMPTION_MESSAGE, msg)
    assert re.search(
        failure_policy.PREEMPTION_MESSAGE, "Pod ml/x-0 has condition DisruptionTarget matching FailJob rule at index 0"
    )
    assert not re.search(failure_policy.PREEMPTION_MESSAGE, msg.replace("index 1", "index 2").replace("42", "1"))


def test_exit_code_table():
    assert failure_policy.action_for(42) is failure_policy.Action.RESTART
    assert failure_policy.action_for(137) is failure_policy.Action.RETRY
    assert failure_policy.action_for(1) is failure_policy.Action.FAIL
    assert failure_policy.action_for(2) is failure_policy.Action.FAIL
    assert failure_policy.action_for(77) is failure_policy.Action.FAIL


def test_kueue_label_and_secrets_are_passed_by_reference():
    b = (
        finetune("ft")
        .tpu("v5p")
        .label("kueue.x-k8s.io/queue-name", "lq")
        .set("model", {"hfRepo": "google/gemma-4-31B-it", "hfTokenSecretRef": {"name": "hf", "key": "tok"}})
    )
    job = training.workload(ft_plan(b), SETTINGS, OWNER)
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "lq"
    [c] = pod_spec(job)["containers"]
    assert {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "tok"}}} in c["env"]


def test_suspend_is_passed_to_the_workload():
    assert training.workload(ft_plan(finetune("ft").tpu("v5p").set("suspend", True)), SETTINGS, None)["spec"]["suspend"]


def test_names_are_deterministic_and_short():
    long = "a" * 60
    p = ft_plan(finetune(long).tpu("v5p"))
    name, cm = training.names(p)
    assert name == cm and len(name) <= 63 and name.endswith(f"-train-{p.run}")
    assert training.names(p) == training.names(ft_plan(finetune(long).tpu("v5p")))
    assert training.names(p, attempt=2)[0].endswith(f"-train-{p.run}-2")
    assert len(merge.name(p)) <= 63


def test_merge_job_runs_on_cpu_sized_from_the_model():
    p = ft_plan(finetune("ft").tpu("v5p").lora(rank=64, alpha=64))
    cm = merge.config_map(p, OWNER, checkpoint_step=1244)
    cfg = MergeConfig.model_validate_json(cm["data"]["merge.json"])
    assert cfg.step == 1244 and cfg.output_dir.endswith(p.merged_dir.removeprefix("gs://"))
    assert cfg.dtype is None, "unset: each merged tensor keeps the base's dtype"
    job = merge.job(p, OperatorSettings(merge_node_selector={"pool": "cpu"}), OWNER)
    spec = pod_spec(job)
    [c] = spec["containers"]
    assert "google.com/tpu" not in json.dumps(job) and "tolerations" not in spec
    assert spec["nodeSelector"] == {"pool": "cpu"}
    assert c["resources"]["limits"]["memory"] == f"{p.merge_memory_gib}Gi" and 4 < p.merge_memory_gib < 16
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    validate_object(job)


def test_a_gs_output_reaches_the_merge_through_cloud_storage_fuse():
    p = ft_plan(finetune("ft").tpu("v5p"))
    cfg = MergeConfig.model_validate_json(merge.config_map(p, OWNER)["data"]["merge.json"])
    assert p.merged_dir.startswith("gs://out/ft/runs/")
    assert cfg.output_dir == "/gcs/" + p.merged_dir.removeprefix("gs://")
    assert cfg.checkpoint_dir.startswith("gs://"), "Orbax reads checkpoints from gs:// itself"
    job = merge.job(p, SETTINGS, OWNER)
    tmpl = job["spec"]["template"]
    assert tmpl["metadata"]["annotations"]["gke-gcsfuse/volumes"] == "true"
    [vol] = [v for v in tmpl["spec"]["volumes"] if v["name"] == "output"]
    assert vol["csi"]["readOnly"] is False and vol["csi"]["volumeAttributes"]["bucketName"] == "out"
    assert {"name": "output", "mountPath": "/gcs/out"} in tmpl["spec"]["containers"][0]["volumeMounts"]
    validate_object(job)
    local = ft_plan(finetune("ft").cpu_tiny())
    assert "annotations" not in merge.job(local, SETTINGS, OWNER)["spec"]["template"]["metadata"]


def test_tpu_training_stages_models_on_disk_and_local_runs_do_not_stage():
    [c] = pod_spec(training.workload(ft_plan(finetune("ft").tpu("v5p")), SETTINGS, OWNER))["containers"]
    assert {"name": "TMPDIR", "value": "/staging"} in c["env"]
    [c] = pod_spec(training.workload(ft_plan(finetune("ft").cpu_tiny()), SETTINGS, OWNER))["containers"]
    assert "TMPDIR" not in str(c["env"])


def test_the_trainer_knows_the_pods_grace_period():
    p = ft_plan(finetune("ft").tpu("v5p"))
    cfg = TrainConfig.model_validate_json(training.config_map(p, OWNER)["data"]["train.json"])
    spec = pod_spec(training.workload(p, SETTINGS, OWNER))
    assert cfg.termination_grace_seconds == spec["terminationGracePeriodSeconds"] == SETTINGS.termination_grace_seconds


# The checks of the Pod Security Standards' "restricted" profile (kubernetes.io, "Pod Security
# Standards"; enforced by the PodSecurity admission plugin of a namespace labelled
# pod-security.kubernetes.io/enforce=restricted) that a pod spec can fail.
RESTRICTED_VOLUMES = {
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
    "name",
}


def restricted_violations(spec: dict) -> list[str]:
    out = [f"volume {v['name']}" for v in spec.get("volumes", []) if set(v) - RESTRICTED_VOLUMES]
    pod = spec.get("securityContext") or {}
    for c in spec["containers"] + spec.get("initContainers", []):
        sc = c.get("securityContext") or {}
        if not sc.get("runAsNonRoot", pod.get("runAsNonRoot")):
            out.append(f"{c['name']}: runAsNonRoot")
        if sc.get("allowPrivilegeEscalation") is not False:
            out.append(f"{c['name']}: allowPrivilegeEscalation")
        if "ALL" not in (sc.get("capabilities") or {}).get("drop", []):
            out.append(f"{c['name']}: capabilities.drop ALL")
        seccomp = sc.get("seccompProfile") or pod.get("seccompProfile") or {}
        if seccomp.get("type") not in ("RuntimeDefault", "Localhost"):
            out.append(f"{c['name']}: seccompProfile")
    return out


def test_training_and_merge_pods_pass_the_restricted_pod_security_profile():
    for b in (
        finetune("ft").tpu("v5p"),
        finetune("ft").tpu("v5p", "2x2x2").training(microBatchSize=2),
        finetune("ft").cpu_tiny(),
    ):
        p = ft_plan(b)
        assert restricted_violations(pod_spec(training.workload(p, SETTINGS, OWNER))) == []
        assert restricted_violations(pod_spec(merge.job(p, SETTINGS, OWNER))) == []
