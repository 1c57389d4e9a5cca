"""The Helm chart rendered for real (helm-python-sdk: Helm's own Go code), every object checked
against the Kubernetes schemas in strict mode."""

from __future__ import annotations

import tomllib

import helm_python
import pytest
import yaml
from scripts.manifests import ROOT

from gemma_operator import api, crd
from gemma_operator.settings import OperatorSettings
from tests.support.chart import CHART, NAMESPACE, objects, one
from tests.support.validation import KUBE_VERSION, validate_builtin

VARIANTS = {
    "default": {},
    "namespaced": {"watchNamespaces": ["ml", "lab"], "crds": {"enabled": False}},
    "crds-disabled": {"crds": {"enabled": False}},
    "service-monitor": {"metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "prometheus"}}}},
    "replicas-2": {"replicas": 2},
    "workload-identity": {
        "serviceAccount": {"gcpServiceAccount": "gemma-operator@proj.iam.gserviceaccount.com"},
        "workloads": {
            "training": {"serviceAccount": {"gcpServiceAccount": "gemma-train@proj.iam.gserviceaccount.com"}},
            "serving": {"serviceAccount": {"gcpServiceAccount": "gemma-serve@proj.iam.gserviceaccount.com"}},
        },
    },
    "workload-namespaces": {"workloads": {"namespaces": ["ml"], "createNamespaces": True}},
}
WORKLOAD_ACCOUNTS = {"gemma-trainer", "gemma-server"}
CLUSTER_SCOPED = {"ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition", "Namespace"}


def validate(obj: dict) -> None:
    if obj["kind"] == "ServiceMonitor":  # a Prometheus Operator CRD: kubernetes-validate has no schema for it
        assert obj["apiVersion"] == "monitoring.coreos.com/v1"
        assert set(obj["spec"]) == {"selector", "namespaceSelector", "endpoints"}
        for endpoint in obj["spec"]["endpoints"]:
            assert set(endpoint) <= {"port", "path", "interval", "scrapeTimeout"}
        return
    validate_builtin(obj)


def container(objs: list[dict]) -> dict:
    return one(objs, "Deployment")["spec"]["template"]["spec"]["containers"][0]


def flag(c: dict, name: str) -> list[str]:
    return [a.split("=", 1)[1] for a in c["args"] if a.startswith(f"--{name}=")]


def test_lint_is_clean():
    report = helm_python.lint(str(CHART), strict=True, kube_version=f"v{KUBE_VERSION}")
    assert report["errors"] == [] and [m for m in report["messages"] if m["severity"] >= 2] == []


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_object_is_valid(variant):
    objs = objects(VARIANTS[variant])
    assert objs
    for obj in objs:
        validate(obj)
        assert obj["kind"] in CLUSTER_SCOPED or obj["metadata"].get("namespace"), f"{obj['kind']} without a namespace"


def test_default_install():
    objs = objects()
    kinds = sorted(o["kind"] for o in objs)
    assert kinds == sorted(
        ["CustomResourceDefinition"] * 2
        + [
            "ClusterRole",
            "ClusterRoleBinding",
            "ConfigMap",
            "Deployment",
            "Service",
            "ServiceAccount",
            "ServiceAccount",
            "ServiceAccount",
        ]
    )
    dep = one(objs, "Deployment")
    assert dep["spec"]["replicas"] == 1 and dep["spec"]["strategy"] == {"type": "Recreate"}
    c = container(objs)
    assert c["args"][:2] == ["operator", "--standalone"] and not flag(c, "leader-election-lease")
    assert c["image"] == "ghcr.io/gemma-tpu-operator/operator:0.1.0"
    binding = one(objs, "ClusterRoleBinding")
    assert binding["subjects"] == [
        {
            "kind": "ServiceAccount",
            "name": dep["spec"]["template"]["spec"]["serviceAccountName"],
            "namespace": NAMESPACE,
        }
    ]


def test_hardened_pod():
    pod = one(objects(), "Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": 65532,
        "runAsGroup": 65532,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    c = pod["containers"][0]
    assert c["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    assert (
        c["resources"]["requests"]["cpu"]
        and c["resources"]["requests"]["memory"]
        and c["resources"]["limits"]["memory"]
    )
    assert {m["mountPath"] for m in c["volumeMounts"]} == {"/etc/gemma-tpu", "/tmp"}, "writable /tmp only"


def test_probes_use_kopfs_health_endpoint():
    c = container(objects({"healthPort": 8181}))
    assert flag(c, "liveness") == ["http://0.0.0.0:8181/healthz"]
    assert {"name": "health", "containerPort": 8181} in c["ports"]
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert c[probe]["httpGet"] == {"path": "/healthz", "port": "health"}


def test_metrics_port_service_and_service_monitor():
    objs = objects({"metrics": {"port": 9100, "serviceMonitor": {"enabled": True, "labels": {"release": "prom"}}}})
    c = container(objs)
    assert flag(c, "metrics-port") == ["9100"] and {"name": "metrics", "containerPort": 9100} in c["ports"]
    svc, monitor = one(objs, "Service"), one(objs, "ServiceMonitor")
    assert svc["spec"]["ports"] == [{"name": "metrics", "port": 9100, "targetPort": "metrics", "protocol": "TCP"}]
    pod_labels = one(objs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= pod_labels.items()
    assert monitor["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [svc["metadata"]["namespace"]]}
    assert monitor["spec"]["endpoints"] == [
        {"port": "metrics", "path": "/metrics", "interval": "30s", "scrapeTimeout": "10s"}
    ]
    assert monitor["metadata"]["labels"]["release"] == "prom"
    assert not [o for o in objects() if o["kind"] == "ServiceMonitor"], "off by default"


def test_settings_are_operator_settings_with_the_workloads_service_accounts():
    objs = objects({"settings": {"kueue_queue": "team-a", "serving_node_pools": {"2x4": "v6e-pool"}}})
    cm = one(objs, "ConfigMap")
    settings = OperatorSettings.model_validate(yaml.safe_load(cm["data"]["settings.yaml"]))
    assert settings.kueue_queue == "team-a" and settings.serving_node_pools == {"2x4": "v6e-pool"}
    assert (settings.training_service_account, settings.serving_service_account) == ("gemma-trainer", "gemma-server")
    renamed = {"workloads": {"serving": {"serviceAccount": {"name": "vllm"}}}}
    settings = OperatorSettings.model_validate(
        yaml.safe_load(one(objects(renamed), "ConfigMap")["data"]["settings.yaml"])
    )
    assert settings.serving_service_account == "vllm" and settings.training_service_account == "gemma-trainer"
    assert "vllm" in {o["metadata"]["name"] for o in objects(renamed) if o["kind"] == "ServiceAccount"}
    c = container(objs)
    mount = next(m for m in c["volumeMounts"] if m["name"] == "settings")
    assert flag(c, "settings") == [f"{mount['mountPath']}/settings.yaml"]
    pod = one(objs, "Deployment")["spec"]["template"]
    assert (
        next(v for v in pod["spec"]["volumes"] if v["name"] == "settings")["configMap"]["name"]
        == cm["metadata"]["name"]
    )
    other = one(objects({"settings": {"kueue_queue": "team-b"}}), "Deployment")["spec"]["template"]
    assert pod["metadata"]["annotations"] != other["metadata"]["annotations"], "a settings change rolls the pods"


def test_values_show_the_operators_defaults():
    values = yaml.safe_load((CHART / "values.yaml").read_text())["settings"]
    defaults = OperatorSettings().model_dump()
    assert values == {k: defaults[k] for k in values}


def test_the_workload_service_accounts_have_no_rights_and_no_token():
    objs = objects({"watchNamespaces": ["ml", "lab"]})
    workloads = [o for o in objs if o["kind"] == "ServiceAccount" and o["metadata"]["name"] in WORKLOAD_ACCOUNTS]
    assert sorted((o["metadata"]["namespace"], o["metadata"]["name"]) for o in workloads) == [
        ("lab", "gemma-server"),
        ("lab", "gemma-trainer"),
        ("ml", "gemma-server"),
        ("ml", "gemma-trainer"),
    ], "both identities, created where the CRs live"
    assert all(o["automountServiceAccountToken"] is False for o in workloads)
    subjects = [s["name"] for o in objs if o["kind"].endswith("Binding") for s in o["subjects"]]
    assert not WORKLOAD_ACCOUNTS & set(subjects)


def test_workload_namespaces_are_created_only_when_asked_and_kept_on_uninstall():
    """`helm install` fails on an object in a namespace that does not exist (the API server answers
    404 NotFound for the namespace): workloads.createNamespaces creates them."""
    asked = objects(VARIANTS["workload-namespaces"])
    [namespace] = [o for o in asked if o["kind"] == "Namespace"]
    assert namespace["metadata"]["name"] == "ml"
    assert namespace["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
    assert {o["metadata"]["namespace"] for o in asked if o["kind"] == "ServiceAccount"} == {"ml", NAMESPACE}
    assert not [o for o in objects({"workloads": {"namespaces": ["ml"]}}) if o["kind"] == "Namespace"]
    release_ns = {"workloads": {"namespaces": [NAMESPACE], "createNamespaces": True}}
    assert not [o for o in objects(release_ns) if o["kind"] == "Namespace"], "helm --create-namespace makes that one"


def test_notes_say_where_the_identities_are_and_what_they_need():
    notes = render_notes({"workloads": {"namespaces": ["ml"]}})
    assert "Workload pods run in the namespaces ml (they must exist: or set workloads.createNamespaces=true)" in notes
    assert "gemma-trainer: training and merge pods; needs roles/storage.objectUser" in notes
    assert (
        "gemma-server: serving pods; needs roles/storage.objectViewer on the models and roles/storage.objectUser"
        in notes
    )
    assert "must exist" not in render_notes({"workloads": {"namespaces": ["ml"], "createNamespaces": True}})


def render_notes(values: dict) -> str:
    chart = helm_python.Chart.load(str(CHART))
    rendered = chart.render(values, name="gemma-tpu-operator", namespace=NAMESPACE, is_install=True)
    return next(text for path, text in rendered.items() if path.endswith("NOTES.txt"))


def test_workload_identity_annotations():
    objs = objects(VARIANTS["workload-identity"])
    annotation = "iam.gke.io/gcp-service-account"
    accounts = {
        o["metadata"]["name"]: o["metadata"].get("annotations", {}) for o in objs if o["kind"] == "ServiceAccount"
    }
    assert accounts["gemma-tpu-operator"][annotation] == "gemma-operator@proj.iam.gserviceaccount.com"
    assert accounts["gemma-trainer"][annotation] == "gemma-train@proj.iam.gserviceaccount.com"
    assert accounts["gemma-server"][annotation] == "gemma-serve@proj.iam.gserviceaccount.com"
    assert "annotations" not in one(objects(), "ServiceAccount", "gemma-trainer")["metadata"]


def test_namespaced_mode_has_no_cluster_scoped_rights():
    objs = objects(VARIANTS["namespaced"])
    assert {o["kind"] for o in objs} & CLUSTER_SCOPED == set()
    roles = [o for o in objs if o["kind"] in ("Role", "RoleBinding")]
    assert sorted((o["kind"], o["metadata"]["namespace"]) for o in roles) == [
        ("Role", "lab"),
        ("Role", "ml"),
        ("RoleBinding", "lab"),
        ("RoleBinding", "ml"),
    ]
    assert flag(container(objs), "namespace") == ["ml", "lab"]


def test_two_replicas_elect_a_leader_and_keep_one_through_drains():
    objs = objects({"replicas": 2})
    dep = one(objs, "Deployment")
    assert dep["spec"]["replicas"] == 2 and dep["spec"]["strategy"]["type"] == "RollingUpdate"
    c = container(objs)
    lease = one(objs, "Role")["rules"][1]["resourceNames"][0]
    assert flag(c, "leader-election-lease") == [f"{NAMESPACE}/{lease}"]
    assert c["env"] == [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]
    pdb = one(objs, "PodDisruptionBudget")
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"] == dep["spec"]["selector"]["matchLabels"]
    assert not [o for o in objects() if o["kind"] == "PodDisruptionBudget"], "none for a single replica"


def test_crds_are_the_generated_ones_kept_on_uninstall():
    objs = [o for o in objects() if o["kind"] == "CustomResourceDefinition"]
    assert len(objs) == len(api.KINDS)
    for obj in objs:
        kind = next(k for k in api.KINDS.values() if obj["metadata"]["name"] == f"{k.plural}.{api.GROUP}")
        checked_in = yaml.safe_load((ROOT / "manifests" / "crds" / crd.crd_filename(kind)).read_text())
        assert obj["metadata"].pop("annotations") == {"helm.sh/resource-policy": "keep"}
        assert obj == checked_in == crd.crd(kind)
    loose = [o for o in objects({"crds": {"keep": False}}) if o["kind"] == "CustomResourceDefinition"]
    assert loose and all("annotations" not in o["metadata"] for o in loose)
    assert not [o for o in objects(VARIANTS["crds-disabled"]) if o["kind"] == "CustomResourceDefinition"]
    assert not (CHART / "crds").exists(), "Helm never upgrades CRDs kept in crds/"


def test_versions_agree():
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert chart["appVersion"] == version
    assert OperatorSettings().images.workloads.endswith(f":{version}")


@pytest.mark.parametrize(
    "values, where",
    [
        ({"replicas": "two"}, "/replicas"),
        ({"replicas": 0}, "/replicas"),
        ({"watchNamespaces": "ml"}, "/watchNamespaces"),
        ({"watchNamespaces": ["Not_A_Namespace"]}, "/watchNamespaces/0"),
        ({"crds": {"enabled": "yes"}}, "/crds/enabled"),
        ({"image": {"pullPolicy": "Sometimes"}}, "/image/pullPolicy"),
        ({"metrics": {"port": 70000}}, "/metrics/port"),
        ({"metrics": {"serviceMonitor": {"interval": "often"}}}, "/metrics/serviceMonitor/interval"),
        ({"serviceAccount": {"gcpServiceAccount": "not-an-email"}}, "/serviceAccount/gcpServiceAccount"),
        ({"workloads": {"serviceAccount": {"name": "gemma-tpu-workloads"}}}, "/workloads"),
        ({"workloads": {"training": {"serviceAccount": {"name": ""}}}}, "/workloads/training/serviceAccount/name"),
        ({"workloads": {"createNamespaces": "yes"}}, "/workloads/createNamespaces"),
        ({"settings": {"prices_per_chip_hour": {"v5p": "cheap"}}}, "/settings/prices_per_chip_hour/v5p"),
        ({"settings": {"hbm_usable_fraction": 1.5}}, "/settings/hbm_usable_fraction"),
        ({"settings": {"imagez": {}}}, "/settings"),
        ({"replica": 2}, ""),
    ],
)
def test_the_schema_refuses_bad_values(values, where):
    chart = helm_python.Chart.load(str(CHART))
    with pytest.raises(helm_python.HelmValuesError) as e:
        chart.validate_schema(values)
    assert f"at '{where}'" in str(e.value)


def test_the_schema_accepts_the_variants():
    chart = helm_python.Chart.load(str(CHART))
    for values in VARIANTS.values():
        chart.validate_schema(values)
