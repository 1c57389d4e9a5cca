"""`kubectl` works against the in-process API (as `gemma-tpu dev --keep-running` promises):
discovery in the API server's shape, server-side printing with ages, short names that resolve."""

import asyncio
import datetime
import json
import shutil
import subprocess
import urllib.request

import pytest

from gemma_devcluster.apiserver import write_kubeconfig
from gemma_devcluster.semantics import human_duration
from tests.support.builders import finetune
from tests.support.cluster import Cluster

KUBECTL = shutil.which("kubectl")

TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io, application/json"


def get(apiserver, path: str, accept: str = "application/json") -> dict:
    req = urllib.request.Request(str(apiserver.url).rstrip("/") + path, headers={"Accept": accept})
    with urllib.request.urlopen(req, timeout=5) as resp:
        return json.loads(resp.read())


async def test_discovery_has_the_api_servers_shape(apiserver):
    core = await asyncio.to_thread(get, apiserver, "/api/v1")
    assert core["groupVersion"] == "v1", "the core group is plain v1"
    by_name = {r["name"]: r for r in core["resources"]}
    assert by_name["pods"]["shortNames"] == ["po"] and "all" in by_name["pods"]["categories"]
    assert by_name["pods/status"]["shortNames"] == [] and sorted(by_name["pods/status"]["verbs"]) == [
        "get",
        "patch",
        "update",
    ]
    assert by_name["pods/log"]["verbs"] == ["get"]
    ours = await asyncio.to_thread(get, apiserver, "/apis/gemma-tpu.dev/v1alpha1")
    by_name = {r["name"]: r for r in ours["resources"]}
    assert ours["groupVersion"] == "gemma-tpu.dev/v1alpha1"
    assert by_name["gemmafinetunes"]["shortNames"] == ["gft"] and by_name["gemmafinetunes/status"]["shortNames"] == []
    groups = {g["name"] for g in (await asyncio.to_thread(get, apiserver, "/apis"))["groups"]}
    assert "metrics.k8s.io" not in groups, "only kinds the server stores are advertised"


async def test_tables_print_ages_and_the_crd_columns(apiserver):
    cluster = Cluster(apiserver)
    await cluster.apply(finetune("ft").obj())
    table = await asyncio.to_thread(
        get, apiserver, "/apis/gemma-tpu.dev/v1alpha1/namespaces/default/gemmafinetunes", TABLE
    )
    names = [c["name"] for c in table["columnDefinitions"]]
    assert names[0] == "Name" and "Phase" in names and names[-1] == "Age"
    [row] = table["rows"]
    assert row["cells"][0] == "ft" and row["cells"][-1] in ("0s", "1s", "2s"), row["cells"]


@pytest.mark.parametrize(
    "seconds,text",
    [
        (5, "5s"),
        (119, "119s"),
        (150, "2m30s"),
        (600, "10m"),
        (3 * 3600 + 120, "3h2m"),
        (30 * 3600, "30h"),
        (3 * 86400 + 3600, "3d1h"),
        (40 * 86400, "40d"),
    ],
)
def test_human_duration_matches_kubernetes(seconds, text):
    assert human_duration(datetime.timedelta(seconds=seconds)) == text


def kubectl_for(apiserver, tmp_path):
    """`kubectl ARGS -n default` against this API server, with its own kubeconfig and home."""
    config = write_kubeconfig(tmp_path / "kubeconfig", str(apiserver.url))
    env = {"KUBECONFIG": str(config), "HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}

    def kubectl(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([KUBECTL, *args, "-n", "default"], capture_output=True, text=True, env=env, timeout=60)

    return kubectl


@pytest.mark.usefixtures("kubectl_path")
async def test_kubectl_gets_our_kinds_and_the_built_in_ones(apiserver, tmp_path):
    cluster = Cluster(apiserver)
    await cluster.apply(finetune("ft").obj())
    await cluster.apply(
        {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": "ft.1", "namespace": "default"},
            "involvedObject": {"kind": "GemmaFineTune", "name": "ft"},
            "type": "Normal",
            "reason": "Created",
            "message": "created the training Job",
        }
    )
    kubectl = kubectl_for(apiserver, tmp_path)

    done = await asyncio.to_thread(kubectl, "get", "gft,gsv,po,deploy,svc,jobs,cm")
    assert done.returncode == 0 and "Warning" not in done.stderr, done.stderr
    assert "ft" in done.stdout and "PHASE" in done.stdout
    events = await asyncio.to_thread(kubectl, "get", "events")
    assert events.returncode == 0 and "created the training Job" in events.stdout, events.stdout + events.stderr

    job = await cluster.apply(
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": "train", "namespace": "default"},
            "spec": {"template": {"spec": {"containers": [{"name": "trainer", "image": "x"}]}}},
        }
    )
    for name, labels in (("other", {"app": "vllm"}), ("train-abcde", job["spec"]["template"]["metadata"]["labels"])):
        await cluster.apply(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name, "namespace": "default", "labels": labels},
                "spec": {"containers": [{"name": "trainer", "image": "x"}]},
            }
        )
        apiserver.pod_logs[("default", name)] = f"log of {name}\n"
    logs = await asyncio.to_thread(kubectl, "logs", "job/train")
    assert logs.returncode == 0 and logs.stdout == "log of train-abcde\n", logs.stdout + logs.stderr
