"""GemmaServe's children: every serving feature rendered, and valid Kubernetes."""

import shlex

import pytest

from gemma_operator import plan_text
from gemma_operator.children import serving_objects
from gemma_operator.children.model_delivery import compile_cache_key
from gemma_operator.plan import SpecError, plan_serve
from gemma_operator.settings import OperatorSettings
from tests.support.builders import serve
from tests.support.validation import validate_object

SETTINGS = OperatorSettings()
# v6e VMs attach only Hyperdisk (Cloud TPU docs, "Storage options"): a download disk needs its class.
HYPERDISK = OperatorSettings.model_validate({"training_host": {"staging_storage_classes": {"v6e": "hd-balanced"}}})


def render(b, settings=SETTINGS, **kw):
    p = plan_serve(b.name, "ns", b.spec, settings, **kw)
    objs = serving_objects(p, settings)
    for obj in objs:
        if obj["kind"] != "PodMonitor":  # a prometheus-operator kind: its fields are checked below
            validate_object(obj)
    return p, {o["kind"]: o for o in objs}


def container(workload, role="leaderTemplate"):
    tmpl = (
        workload["spec"]["template"]
        if workload["kind"] == "Deployment"
        else workload["spec"]["leaderWorkerTemplate"][role]
    )
    return tmpl, tmpl["spec"]["containers"][0]


def test_v6e8_serves_a_merged_output_from_cloud_storage():
    _, objs = render(serve("s"), fine_tune_preset="gemma4-31b")
    dep = objs["Deployment"]
    tmpl, c = container(dep)
    assert c["resources"]["limits"]["google.com/tpu"] == "8" and "--tensor-parallel-size=8" in c["args"]
    assert tmpl["spec"]["nodeSelector"]["cloud.google.com/gke-tpu-topology"] == "2x4"
    assert "--model=/models/model" in c["args"] and "--served-model-name=s" in c["args"]
    ann = tmpl["metadata"]["annotations"]
    assert ann["gke-gcsfuse/volumes"] == "true" and ann["gke-gcsfuse/memory-limit"] == "0"
    vols = {v["name"]: v for v in tmpl["spec"]["volumes"]}
    attrs = vols["model"]["csi"]["volumeAttributes"]
    assert vols["model"]["csi"]["readOnly"] is True and attrs["bucketName"] == "models"
    assert attrs["mountOptions"] == "implicit-dirs,only-dir=merged" and attrs["fileCacheCapacity"] == "-1"
    assert vols["gke-gcsfuse-cache"] == {"name": "gke-gcsfuse-cache", "emptyDir": {"medium": "Memory"}}
    assert ann["prometheus.io/scrape"] == "true" and ann["prometheus.io/port"] == "8000"
    # Probes sized for XLA compilation: 15 minutes for 31B, readiness on /v1/models.
    assert c["startupProbe"]["httpGet"]["path"] == "/v1/models"
    assert c["startupProbe"]["periodSeconds"] * c["startupProbe"]["failureThreshold"] == 914 // 10 * 10
    assert c["readinessProbe"]["httpGet"]["path"] == "/v1/models" and c["livenessProbe"]["httpGet"]["path"] == "/health"
    assert dep["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}
    # Least privilege: no API token, read-only root, no privilege escalation, no capabilities.
    assert tmpl["spec"]["automountServiceAccountToken"] is False
    sc = c["securityContext"]
    assert (
        sc["readOnlyRootFilesystem"] and not sc["allowPrivilegeEscalation"] and sc["capabilities"] == {"drop": ["ALL"]}
    )
    assert {m["mountPath"] for m in c["volumeMounts"]} >= {"/tmp", "/cache", "/dev/shm", "/models/model"}
    assert "VLLM_XLA_CACHE_PATH" not in str(c["env"]), "no cache configured: restarts recompile"
    assert objs["Service"]["spec"]["selector"] == dep["spec"]["selector"]["matchLabels"]
    assert set(objs) == {"Deployment", "Service"}


def test_api_key_and_hf_token_come_from_secrets():
    b = serve("s").set("model", {"hfRepo": "google/gemma-4-31B-it", "hfTokenSecretRef": {"name": "hf"}})
    b.set("vllm", {"apiKeySecretRef": {"name": "vllm-key", "key": "k"}})
    _, objs = render(b, HYPERDISK)
    tmpl, c = container(objs["Deployment"])
    assert "--model=google/gemma-4-31B-it" in c["args"] and not any("key" in a for a in c["args"])
    assert {"name": "VLLM_API_KEY", "valueFrom": {"secretKeyRef": {"name": "vllm-key", "key": "k"}}} in c["env"]
    assert {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}} in c["env"]
    probe = c["readinessProbe"]["exec"]["command"][2]
    assert "/v1/models" in probe and "VLLM_API_KEY" in probe, "with a key, the probe presents it"
    assert (
        "volumes" not in str(tmpl["metadata"]["annotations"])
        and "gke-gcsfuse/volumes" not in tmpl["metadata"]["annotations"]
    )


@pytest.mark.parametrize("topology", ["2x4", "4x4"])  # a Deployment pod; every host of a LeaderWorkerSet group
def test_an_hf_model_is_downloaded_onto_a_disk_sized_for_it(topology):
    """vLLM downloads an hfRepo model (58.25 GB for the 31B release) before loading it. On the
    node's boot disk (100 GB by default on GKE, about 43Gi allocatable) that download fills it,
    and the kubelet evicts the pod under disk pressure (Kubernetes docs, "Node-pressure
    Eviction": nodefs.available); each host gets a volume sized from the model instead."""
    b = serve("s").tpu("v6e", topology).set("model", {"hfRepo": "google/gemma-4-31B-it"})
    p, objs = render(b, HYPERDISK)
    assert "download:      62Gi on a volume claimed with the pod at /staging" in plan_text.as_text(p)
    workload = objs.get("Deployment") or objs["LeaderWorkerSet"]
    for role in ("leaderTemplate", "workerTemplate") if topology == "4x4" else ("leaderTemplate",):
        tmpl, c = container(workload, role)
        env = {e["name"]: e.get("value") for e in c["env"]}
        mount = next(m for m in c["volumeMounts"] if env["HF_HOME"].startswith(m["mountPath"] + "/"))
        volume = next(v for v in tmpl["spec"]["volumes"] if v["name"] == mount["name"])
        claim = volume["ephemeral"]["volumeClaimTemplate"]["spec"]
        assert claim["storageClassName"] == "hd-balanced"
        assert float(claim["resources"]["requests"]["storage"].removesuffix("Gi")) * 2**30 > 58.25e9
    with pytest.raises(SpecError, match="training_host.staging_storage_classes.v6e"):
        render(b)
    tmpl, c = container(render(serve("s"), fine_tune_preset="gemma4-31b")[1]["Deployment"])
    assert "ephemeral" not in str(tmpl["spec"]["volumes"]), "a gs:// model is read through its mount"


def test_local_path_on_a_volume_claim():
    b = (
        serve("s")
        .set("model", {"uri": "/data/merged"})
        .set("storage", {"persistentVolumeClaim": "models", "mountPath": "/data"})
    )
    _, objs = render(b)
    tmpl, c = container(objs["Deployment"])
    assert "--model=/data/merged" in c["args"]
    assert {"name": "storage", "persistentVolumeClaim": {"claimName": "models"}} in tmpl["spec"]["volumes"]


@pytest.mark.parametrize(
    "cache,volume", [({"uri": "gs://xla/cache"}, "csi"), ({"pvc": "xla"}, "persistentVolumeClaim")]
)
def test_compilation_cache_persists_across_restarts(cache, volume):
    p, objs = render(serve("s").set("compilationCache", cache))
    tmpl, c = container(objs["Deployment"])
    vol = next(v for v in tmpl["spec"]["volumes"] if v["name"] == "xla-cache")
    assert volume in vol
    if volume == "csi":
        assert (
            vol["csi"]["readOnly"] is False
            and vol["csi"]["volumeAttributes"]["mountOptions"] == "implicit-dirs,only-dir=cache"
        )
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["VLLM_XLA_CACHE_PATH"] == f"/xla-cache/{compile_cache_key(p)}"
    other = plan_serve(
        "s", "ns", serve("s").set("compilationCache", cache).set("vllm", {"image": "vllm/vllm-tpu:v2"}).spec, SETTINGS
    )
    assert compile_cache_key(other) != compile_cache_key(p), "a new image never reads old compiled programs"


def test_cpu_profiles_compilation_cache_is_vllms_cache_root():
    # On the CPU vLLM keeps its torch.compile artefacts and its model registry's inspection of the
    # model's class under VLLM_CACHE_ROOT (vllm/envs.py; vllm/model_executor/models/registry.py,
    # `_LazyRegisteredModel`: VLLM_CACHE_ROOT/modelinfos); VLLM_XLA_CACHE_PATH is TPU only.
    p, objs = render(serve("s").tpu("cpu").set("compilationCache", {"pvc": "cache"}))
    _, c = container(objs["Deployment"])
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["VLLM_CACHE_ROOT"] == f"/xla-cache/{compile_cache_key(p)}" and "VLLM_XLA_CACHE_PATH" not in env
    assert {"name": "xla-cache", "mountPath": "/xla-cache"} in c["volumeMounts"]


def test_startup_budget_is_configurable_but_not_below_what_31b_needs():
    _, objs = render(serve("s").set("startupTimeoutSeconds", 1800), fine_tune_preset="gemma4-31b")
    _, c = container(objs["Deployment"])
    assert c["startupProbe"]["failureThreshold"] == 180
    with pytest.raises(SpecError, match=r"spec.startupTimeoutSeconds: 300 is too short for gemma4-31b"):
        plan_serve(
            "s", "ns", serve("s").set("startupTimeoutSeconds", 300).spec, SETTINGS, fine_tune_preset="gemma4-31b"
        )


def test_rollout_can_surge_when_capacity_allows_but_not_stall():
    _, objs = render(serve("s").set("rollout", {"maxSurge": 1, "maxUnavailable": 0}))
    assert objs["Deployment"]["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    with pytest.raises(SpecError, match="maxSurge and maxUnavailable cannot both be 0"):
        plan_serve("s", "ns", serve("s").set("rollout", {"maxSurge": 0, "maxUnavailable": 0}).spec, SETTINGS)


def test_multi_host_v6e_is_a_leader_worker_set():
    p, objs = render(serve("big").tpu("v6e", "4x4"), fine_tune_preset="gemma4-31b")
    lws = objs["LeaderWorkerSet"]
    assert "Deployment" not in objs and p.tensor_parallel == 16
    tmpl = lws["spec"]["leaderWorkerTemplate"]
    assert tmpl["size"] == 4 and tmpl["restartPolicy"] == "RecreateGroupOnPodRestart"
    assert lws["spec"]["rolloutStrategy"]["rollingUpdateConfiguration"] == {"maxSurge": 0, "maxUnavailable": 1}
    leader, worker = tmpl["leaderTemplate"]["spec"]["containers"][0], tmpl["workerTemplate"]["spec"]["containers"][0]
    assert leader["resources"]["limits"]["google.com/tpu"] == "4" == worker["resources"]["limits"]["google.com/tpu"]
    script = leader["command"][2]
    launcher = "bash /opt/vllm/multi-node-serving.sh"
    assert f"{launcher} leader --ray_cluster_size=$(LWS_GROUP_SIZE) --ray_init_timeout=914 ||" in script
    served = shlex.split(script.split("; exec ", 1)[1])
    assert served[:3] == ["python3", "-m", "vllm.entrypoints.openai.api_server"]
    assert "--tensor-parallel-size=16" in served and "--distributed-executor-backend=ray" in served
    assert "--ray_address=$(LWS_LEADER_ADDRESS)" in worker["command"][2] and "ports" not in worker
    assert tmpl["leaderTemplate"]["spec"]["nodeSelector"]["cloud.google.com/gke-tpu-topology"] == "4x4"
    assert objs["Service"]["spec"]["selector"]["gemma-tpu.dev/role"] == "leader"
    assert tmpl["leaderTemplate"]["metadata"]["labels"]["gemma-tpu.dev/role"] == "leader"


def test_each_multi_host_group_is_scheduled_into_one_slice():
    """A multi-host TPU node pool is one slice, and a group's hosts must share its interconnect.
    LWS pins a group's workers to its leader's node pool, and gives each group a pool of its own,
    only when the LeaderWorkerSet carries the exclusive-topology annotation (kubernetes-sigs/lws
    pkg/controllers/pod_controller.go: worker node selectors; pkg/webhooks/pod_webhook.go:
    SetExclusiveAffinities). Without it the 4 hosts of a replica may straddle two 4x4 slices."""
    _, objs = render(serve("big").tpu("v6e", "4x4").set("replicas", 2), fine_tune_preset="gemma4-31b")
    annotations = objs["LeaderWorkerSet"]["metadata"]["annotations"]
    assert annotations["leaderworkerset.sigs.k8s.io/exclusive-topology"] == "cloud.google.com/gke-nodepool"
    _, objs = render(serve("small"), fine_tune_preset="gemma4-31b")
    assert "annotations" not in objs["Deployment"]["metadata"], "one host per replica: nothing to keep together"


def test_autoscaling_and_pod_monitor():
    b = serve("s").set("autoscaling", {"minReplicas": 1, "maxReplicas": 4, "targetAverageValue": 2.5})
    b.set("metrics", {"podMonitor": True})
    _, objs = render(b)
    hpa = objs["HorizontalPodAutoscaler"]
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "s-vllm"}
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (1, 4)
    assert hpa["spec"]["metrics"][0]["pods"] == {
        "metric": {"name": "vllm:num_requests_waiting"},
        "target": {"type": "AverageValue", "averageValue": "2500m"},
    }
    assert "replicas" not in objs["Deployment"]["spec"], "the HPA owns the replica count"
    pm = objs["PodMonitor"]
    assert pm["apiVersion"] == "monitoring.coreos.com/v1"
    assert pm["spec"]["selector"]["matchLabels"] == objs["Deployment"]["spec"]["selector"]["matchLabels"]
    assert pm["spec"]["podMetricsEndpoints"] == [{"port": "http", "path": "/metrics", "interval": "30s"}]
    _, lws = render(serve("b").tpu("v6e", "4x4").set("autoscaling", {"maxReplicas": 2}))
    assert lws["HorizontalPodAutoscaler"]["spec"]["scaleTargetRef"]["kind"] == "LeaderWorkerSet"


def test_cpu_profile_runs_vllms_cpu_build_with_the_same_command_line():
    tpu_p, tpu_objs = render(serve("s"))
    cpu_p, cpu_objs = render(serve("s").tpu("cpu"))
    _, c = container(cpu_objs["Deployment"])
    tmpl, _ = container(cpu_objs["Deployment"])
    assert c["image"] == SETTINGS.images.serving_cpu and "google.com/tpu" not in str(c["resources"])
    assert "tolerations" not in tmpl["spec"] and "nodeSelector" not in tmpl["spec"]
    cpu_only = ("--dtype=bfloat16", "--enforce-eager", "--distributed-executor-backend=uni")
    assert set(cpu_only) <= set(c["args"])
    _, t = container(tpu_objs["Deployment"])
    shared = [a for a in t["args"] if not a.startswith(("--tensor-parallel-size", "--disable-chunked-mm-input"))]
    assert shared == [a for a in c["args"] if a not in cpu_only]
    assert c["command"] == t["command"]
