"""The API semantics the operator relies on, on both API servers (conftest.py): the in-process one must
answer as kube-apiserver 1.36 does. Requests go through the operator's own client (`Kube`), as the
operator makes them."""

from __future__ import annotations

import asyncio
import json
import time

import kubernetes
import pytest

from gemma_operator.kube import ApiError, Kube
from tests.support.builders import finetune
from tests.support.cluster import PATIENCE, TEST_AGENT


def kube(backend) -> Kube:
    return Kube(backend.client, user_agent=TEST_AGENT)


def config_map(namespace: str, name: str, **metadata) -> dict:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": namespace, **metadata}}


async def eventually(check, message: str):
    """The real controllers act asynchronously (the garbage collector, say); the in-process API at once."""
    deadline = time.monotonic() + PATIENCE
    while not (value := await check()):
        assert time.monotonic() < deadline, f"timed out waiting for {message}"
        await asyncio.sleep(0.1)
    return value


async def test_status_is_a_subresource_defaults_apply_and_generation_counts_spec_changes(backend):
    k, ns = kube(backend), backend.namespace()
    obj = finetune("a", ns).obj()
    obj["spec"]["unknownField"] = 1
    obj["status"] = {"phase": "Succeeded"}
    created = await k.create(obj)
    meta = created["metadata"]
    assert meta["uid"] and meta["generation"] == 1 and int(meta["resourceVersion"]) > 0
    assert "status" not in created, "status is not written through the main resource"
    assert "unknownField" not in created["spec"], "unknown fields are pruned (no fieldValidation: Warn)"
    assert created["spec"]["lora"]["rank"] == 16, "the CRD's defaults are applied"

    patched = await k.patch("GemmaFineTune", ns, "a", {"spec": {"suspend": True}, "status": {"phase": "Failed"}})
    assert patched["metadata"]["generation"] == 2 and "status" not in patched
    st = await k.patch(
        "GemmaFineTune",
        ns,
        "a",
        {"status": {"phase": "Training", "notInSchema": 1}, "spec": {"suspend": False}},
        status=True,
    )
    assert st["status"]["phase"] == "Training" and "notInSchema" not in st["status"]
    assert st["spec"]["suspend"] is True and st["metadata"]["generation"] == 2, "spec is not written through status"

    with pytest.raises(ApiError) as e:
        await k.create(finetune("a", ns).obj())
    assert (e.value.status, e.value.reason) == (409, "AlreadyExists")
    bad = finetune("b", ns).obj()
    bad["spec"]["lora"] = {"rank": 0}
    with pytest.raises(ApiError) as e:
        await k.create(bad)
    assert e.value.status == 422 and "spec.lora.rank" in e.value.message


async def test_a_write_carrying_a_stale_resource_version_is_a_conflict(backend):
    k, ns = kube(backend), backend.namespace()
    first = await k.create({**config_map(ns, "cm"), "data": {"v": "1"}})
    await k.patch("ConfigMap", ns, "cm", {"data": {"v": "2"}})
    with pytest.raises(ApiError) as e:
        await k.patch(
            "ConfigMap",
            ns,
            "cm",
            {"metadata": {"resourceVersion": first["metadata"]["resourceVersion"]}, "data": {"v": "3"}},
        )
    assert (e.value.status, e.value.reason) == (409, "Conflict")
    assert (await k.get("ConfigMap", ns, "cm"))["data"] == {"v": "2"}


async def test_a_json_patch_whose_test_fails_changes_nothing(backend):
    """RFC 6902 `test`, which the operator's status writes use to keep other writers' conditions."""
    k, ns = kube(backend), backend.namespace()
    await k.create({**config_map(ns, "cm"), "data": {"v": "1"}})
    with pytest.raises(ApiError) as e:
        await k.patch_json(
            "ConfigMap",
            ns,
            "cm",
            [{"op": "test", "path": "/data/v", "value": "9"}, {"op": "replace", "path": "/data/v", "value": "4"}],
        )
    assert e.value.status == 422
    applied = await k.patch_json(
        "ConfigMap",
        ns,
        "cm",
        [{"op": "test", "path": "/data/v", "value": "1"}, {"op": "replace", "path": "/data/v", "value": "4"}],
    )
    assert applied["data"] == {"v": "4"}


@pytest.mark.parametrize(
    ("selector", "names"),
    [
        ("app=x", {"a", "b"}),
        ("app!=x", {"c", "d"}),  # != also matches objects without the label
        ("app in (x,y)", {"a", "b", "c"}),
        ("app notin (x)", {"c", "d"}),
        ("tier", {"a", "c"}),
        ("!tier", {"b", "d"}),
        ("app=x,tier=web", {"a"}),
    ],
)
async def test_label_selectors(backend, selector, names):
    """The selector grammar of k8s.io/apimachinery pkg/labels (equality, set-based, existence)."""
    k, ns = kube(backend), backend.namespace()
    for name, labels in {
        "a": {"app": "x", "tier": "web"},
        "b": {"app": "x"},
        "c": {"app": "y", "tier": "db"},
        "d": {},
    }.items():
        await k.create(config_map(ns, name, labels=labels))
    assert {o["metadata"]["name"] for o in await k.list("ConfigMap", ns, label_selector=selector)} == names


async def test_a_watch_resumes_from_a_resource_version_and_an_expired_one_is_gone(backend):
    k, ns = kube(backend), backend.namespace()
    core = kubernetes.client.CoreV1Api(backend.client)
    await k.create(config_map(ns, "a", labels={"x": "1"}))
    listing = await asyncio.to_thread(core.list_namespaced_config_map, ns, label_selector="x=1")
    since = listing.metadata.resource_version
    await k.create(config_map(ns, "b", labels={"x": "1"}))
    await k.create(config_map(ns, "c", labels={"x": "2"}))

    def watch(resource_version: str) -> list[tuple[str, str]]:
        stream = kubernetes.watch.Watch().stream(
            core.list_namespaced_config_map,
            ns,
            resource_version=resource_version,
            label_selector="x=1",
            timeout_seconds=1,
        )
        return [(e["type"], e["object"].metadata.name) for e in stream]

    assert await asyncio.to_thread(watch, since) == [("ADDED", "b")]
    await backend.restart_watch_cache()  # what a restarted kube-apiserver's watch cache forgets
    with pytest.raises(kubernetes.client.ApiException) as e:  # the client raises the watch's 410 ERROR event
        await asyncio.to_thread(watch, since)
    assert e.value.status == 410


async def test_strict_field_validation_refuses_unknown_fields_that_otherwise_are_pruned(backend):
    """fieldValidation=Strict, what kubectl sends by default since 1.27; without it the field is dropped."""
    k, ns = kube(backend), backend.namespace()
    obj = finetune("s", ns).obj()
    obj["spec"]["trainng"] = {}
    obj["metadata"]["owner"] = "me"
    path = k._path("GemmaFineTune", ns)
    with pytest.raises(ApiError) as e:
        await k._call("POST", path, body=obj, query={"fieldValidation": "Strict"})
    assert e.value.status == 400
    assert 'strict decoding error: unknown field "metadata.owner", unknown field "spec.trainng"' in e.value.message
    created = await k._call("POST", path, body=obj)
    assert "trainng" not in created["spec"] and "owner" not in created["metadata"]
    cm = {**config_map(ns, "cm"), "metadata": {"name": "cm", "namespace": ns, "owner": "me"}}
    with pytest.raises(ApiError) as e:
        await k._call("POST", k._path("ConfigMap", ns), body=cm, query={"fieldValidation": "Strict"})
    assert e.value.status == 400 and 'unknown field "metadata.owner"' in e.value.message


async def test_the_garbage_collector_follows_owner_references(backend):
    k, ns = kube(backend), backend.namespace()
    owner = await k.create(config_map(ns, "owner"))
    ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner["metadata"]["uid"]}
    await k.create(config_map(ns, "child", ownerReferences=[ref]))
    await k.create(config_map(ns, "other"))
    await k.delete("ConfigMap", ns, "owner")

    async def collected():
        return {c["metadata"]["name"] for c in await k.list("ConfigMap", ns)} - {"kube-root-ca.crt"} == {"other"}

    await eventually(collected, "the owned ConfigMap collected")


async def test_service_account_admission_refuses_a_pod_whose_account_is_missing(backend):
    """kube-apiserver's ServiceAccount admission plugin (plugin/pkg/admission/serviceaccount): a pod
    names `default` when it names none; one whose ServiceAccount does not exist is Forbidden, the
    message naming the pod by its generateName while it has no name. The serviceaccount controller
    keeps `default` in every namespace."""
    k, ns = kube(backend), backend.namespace()
    containers = [{"name": "c", "image": "i"}]
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"generateName": "trainer-", "namespace": ns}}
    pod["spec"] = {"serviceAccountName": "gemma-trainer", "containers": containers}
    with pytest.raises(ApiError) as e:
        await k.create(pod)
    assert e.value.status == 403
    assert e.value.message == (
        f'pods "trainer-" is forbidden: error looking up service account {ns}/gemma-trainer: '
        'serviceaccount "gemma-trainer" not found'
    )
    sa = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "gemma-trainer", "namespace": ns}}
    await k._call("POST", f"/api/v1/namespaces/{ns}/serviceaccounts", body=sa)
    created = await k.create(pod)
    assert (
        created["metadata"]["name"].startswith("trainer-") and created["spec"]["serviceAccountName"] == "gemma-trainer"
    )
    plain = await k.create(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "p", "namespace": ns},
            "spec": {"containers": containers},
        }
    )
    assert plain["spec"]["serviceAccountName"] == "default"


async def test_a_job_selects_its_own_pods_by_its_uid(backend):
    """The Job's defaulting (pkg/registry/batch/job/strategy.go): a selector on the controller-uid label,
    and the labels on the pod template the Job controller's pods will carry."""
    k, ns = kube(backend), backend.namespace()
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j", "namespace": ns}}
    job["spec"] = {
        "template": {
            "metadata": {"labels": {"app": "x"}},
            "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "i"}]},
        }
    }
    created = await k.create(job)
    uid = created["metadata"]["uid"]
    assert created["spec"]["selector"] == {"matchLabels": {"batch.kubernetes.io/controller-uid": uid}}
    labels = created["spec"]["template"]["metadata"]["labels"]
    assert labels["app"] == "x" and labels["batch.kubernetes.io/controller-uid"] == uid
    assert labels["job-name"] == labels["batch.kubernetes.io/job-name"] == "j"


async def test_server_side_tables_print_the_crd_columns(backend):
    """What `kubectl get gft` asks for (Accept: ...;as=Table): the CRD's additionalPrinterColumns."""
    k, ns = kube(backend), backend.namespace()
    await k.create(finetune("a", ns).obj())
    await k.patch(
        "GemmaFineTune",
        ns,
        "a",
        {"status": {"phase": "Training", "progress": {"step": 3, "totalSteps": 10}}},
        status=True,
    )
    path = k._path("GemmaFineTune", ns)

    def table() -> dict:
        c = backend.client
        accept = "application/json;as=Table;v=v1;g=meta.k8s.io"
        method, url, headers, body, _ = c.param_serialize(
            "GET", path, header_params={"Accept": accept}, auth_settings=["BearerToken"]
        )
        raw = c.call_api(method, url, header_params=headers, body=body)
        raw.read()
        return json.loads(raw.data)

    got = await asyncio.to_thread(table)
    assert got["kind"] == "Table" and [c["name"] for c in got["columnDefinitions"]][:4] == [
        "Name",
        "Phase",
        "Step",
        "Total",
    ]
    assert got["rows"][0]["cells"][:4] == ["a", "Training", 3, 10]
