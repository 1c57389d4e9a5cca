"""What only the in-process API does: pod logs it holds for the tests, and its selector and merge-patch
rules in isolation. The semantics it shares with kube-apiserver are tested on both in tests/api_semantics."""

import asyncio

import kubernetes

from gemma_devcluster.semantics import label_selector_matches, merge_patch


def client(apiserver) -> kubernetes.client.ApiClient:
    cfg = kubernetes.client.Configuration()
    cfg.host = str(apiserver.url).rstrip("/")
    return kubernetes.client.ApiClient(cfg)


async def call(fn, *args, **kwargs):
    return await asyncio.to_thread(fn, *args, **kwargs)


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
