"""The in-process API behaves like the API server where the operator depends on it."""

import asyncio
import json

import kubernetes
import pytest
from kubernetes.client.rest import ApiException

from gemma_devcluster.semantics import label_selector_matches, merge_patch
from tests.support.builders import finetune


def client(apiserver) -> kubernetes.client.ApiClient:
    cfg = kubernetes.client.Configuration()
    cfg.host = str(apiserver.url).rstrip("/")
    return kubernetes.client.ApiClient(cfg)


async def call(fn, *args, **kwargs):
    return await asyncio.to_thread(fn, *args, **kwargs)


async def test_metadata_status_split_generation_and_pruning(apiserver):
    api = kubernetes.client.CustomObjectsApi(client(apiserver))
    obj = finetune("a").obj()
    obj["spec"]["unknownField"] = 1
    obj["status"] = {"phase": "Succeeded"}
    created = await call(
        api.create_namespaced_custom_object, "gemma-tpu.dev", "v1alpha1", "default", "gemmafinetunes", obj
    )
    meta = created["metadata"]
    assert meta["uid"] and meta["generation"] == 1 and int(meta["resourceVersion"]) > 0
    assert "status" not in created, "status is ignored on create"
    assert "unknownField" not in created["spec"], "unknown fields are pruned"
    assert created["spec"]["lora"]["rank"] == 16, "schema defaults are applied"

    patched = await call(
        api.patch_namespaced_custom_object,
        "gemma-tpu.dev",
        "v1alpha1",
        "default",
        "gemmafinetunes",
        "a",
        {"spec": {"suspend": True}, "status": {"phase": "Failed"}},
    )
    assert patched["metadata"]["generation"] == 2 and "status" not in patched
    st = await call(
        api.patch_namespaced_custom_object_status,
        "gemma-tpu.dev",
        "v1alpha1",
        "default",
        "gemmafinetunes",
        "a",
        {"status": {"phase": "Training", "notInSchema": 1}, "spec": {"suspend": False}},
    )
    assert st["status"] == {"phase": "Training", "conditions": []} or st["status"]["phase"] == "Training"
    assert "notInSchema" not in st["status"] and st["spec"]["suspend"] is True
    assert st["metadata"]["generation"] == 2

    with pytest.raises(ApiException) as e:
        await call(
            api.create_namespaced_custom_object,
            "gemma-tpu.dev",
            "v1alpha1",
            "default",
            "gemmafinetunes",
            finetune("a").obj(),
        )
    assert e.value.status == 409
    bad = finetune("b").obj()
    bad["spec"]["lora"] = {"rank": 0}
    with pytest.raises(ApiException) as e:
        await call(api.create_namespaced_custom_object, "gemma-tpu.dev", "v1alpha1", "default", "gemmafinetunes", bad)
    assert e.value.status == 422 and "rank" in e.value.body


async def test_garbage_collection_follows_owner_references(apiserver):
    core = kubernetes.client.CoreV1Api(client(apiserver))
    owner = await call(core.create_namespaced_config_map, "default", {"metadata": {"name": "owner"}})
    ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner.metadata.uid}
    await call(core.create_namespaced_config_map, "default", {"metadata": {"name": "child", "ownerReferences": [ref]}})
    await call(core.create_namespaced_config_map, "default", {"metadata": {"name": "other"}})
    await call(core.delete_namespaced_config_map, "owner", "default")
    names = [c.metadata.name for c in (await call(core.list_namespaced_config_map, "default")).items]
    assert names == ["other"]


async def test_watch_resumes_from_a_resource_version_and_filters_labels(apiserver):
    core = kubernetes.client.CoreV1Api(client(apiserver))
    await call(core.create_namespaced_config_map, "default", {"metadata": {"name": "a", "labels": {"x": "1"}}})
    listing = await call(core.list_namespaced_config_map, "default", label_selector="x=1")
    rv = listing.metadata.resource_version
    await call(core.create_namespaced_config_map, "default", {"metadata": {"name": "b", "labels": {"x": "1"}}})
    await call(core.create_namespaced_config_map, "default", {"metadata": {"name": "c", "labels": {"x": "2"}}})

    def watch():
        w = kubernetes.watch.Watch()
        return [
            (e["type"], e["object"].metadata.name)
            for e in w.stream(
                core.list_namespaced_config_map, "default", resource_version=rv, label_selector="x=1", timeout_seconds=1
            )
        ]

    assert await asyncio.to_thread(watch) == [("ADDED", "b")]


async def test_pod_logs(apiserver):
    core = kubernetes.client.CoreV1Api(client(apiserver))
    await call(
        core.create_namespaced_pod,
        "default",
        {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "i"}]}},
    )
    apiserver.pod_logs[("default", "p")] = "one\ntwo\nthree\n"
    assert await call(core.read_namespaced_pod_log, "p", "default", tail_lines=2) == "two\nthree\n"


def test_selector_and_merge_patch_semantics():
    labels = {"a": "1", "b": "2"}
    assert label_selector_matches("a=1,b", labels) and label_selector_matches("a in (1,3),!c", labels)
    assert not label_selector_matches("a!=1", labels) and not label_selector_matches("c notin (1),c", labels)
    assert merge_patch({"a": {"b": 1, "c": 2}, "d": [1]}, {"a": {"b": None, "e": 3}, "d": [2]}) == {
        "a": {"c": 2, "e": 3},
        "d": [2],
    }


async def test_kubectl_get_gets_the_printer_columns(apiserver):
    api = kubernetes.client.CustomObjectsApi(client(apiserver))
    await call(
        api.create_namespaced_custom_object,
        "gemma-tpu.dev",
        "v1alpha1",
        "default",
        "gemmafinetunes",
        finetune("a").obj(),
    )
    await call(
        api.patch_namespaced_custom_object_status,
        "gemma-tpu.dev",
        "v1alpha1",
        "default",
        "gemmafinetunes",
        "a",
        {"status": {"phase": "Training", "progress": {"step": 3, "totalSteps": 10}}},
    )
    raw = await call(
        client(apiserver).call_api,
        "GET",
        f"{str(apiserver.url).rstrip('/')}/apis/gemma-tpu.dev/v1alpha1/namespaces/default/gemmafinetunes",
        header_params={"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io"},
    )
    raw.read()
    table = __import__("json").loads(raw.data)
    names = [c["name"] for c in table["columnDefinitions"]]
    assert table["kind"] == "Table" and names[:4] == ["Name", "Phase", "Step", "Total"]
    assert table["rows"][0]["cells"][:4] == ["a", "Training", 3, 10]


async def test_service_account_admission_refuses_a_pod_whose_account_is_missing(apiserver):
    """kube-apiserver's ServiceAccount admission plugin (plugin/pkg/admission/serviceaccount): a pod
    names `default` when it names none; one whose ServiceAccount does not exist is Forbidden, the
    message naming the pod by its generateName while it has no name. The serviceaccount controller
    keeps `default` in every namespace."""
    core = kubernetes.client.CoreV1Api(client(apiserver))
    containers = [{"name": "c", "image": "i"}]
    pod = {
        "metadata": {"generateName": "trainer-"},
        "spec": {"serviceAccountName": "gemma-trainer", "containers": containers},
    }
    with pytest.raises(ApiException) as e:
        await call(core.create_namespaced_pod, "ml", pod)
    assert e.value.status == 403
    assert json.loads(e.value.body)["message"] == (
        'pods "trainer-" is forbidden: error looking up service account ml/gemma-trainer: '
        'serviceaccount "gemma-trainer" not found'
    )
    await call(core.create_namespaced_service_account, "ml", {"metadata": {"name": "gemma-trainer"}})
    created = await call(core.create_namespaced_pod, "ml", pod)
    assert created.metadata.name.startswith("trainer-") and created.spec.service_account_name == "gemma-trainer"

    plain = await call(
        core.create_namespaced_pod, "lab", {"metadata": {"name": "p"}, "spec": {"containers": containers}}
    )
    assert plain.spec.service_account_name == "default"
    accounts = await call(core.list_namespaced_service_account, "lab")
    assert [a.metadata.name for a in accounts.items] == ["default"]
