"""What `gemma-tpu dev` installs on a real API server before it applies the quickstart, as a platform
team installs the chart: both CRDs by server-side apply (then Established), the operator's
namespace and ServiceAccount bound to the chart's ClusterRole (its rules are rbac.py's, the ones the
chart renders), and the workload ServiceAccounts the chart creates, which mount no API token. The
operator then runs with a token the API server issued to its ServiceAccount, never the admin's.

A second run on the same server starts from nothing, as a first one: the quickstart's CRs of an
earlier run are deleted, and the run waits until the garbage collector has removed what the
operator made for them (their children have the same names and would be taken for the new ones').
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from gemma_devcluster.client import NodeKube
from gemma_devcluster.control_plane import with_token
from gemma_operator import api, crd, rbac
from gemma_operator.children.common import MANAGED_BY, label_value
from gemma_operator.kube import ApiError
from gemma_operator.settings import OperatorSettings

NAMESPACE = "gemma-tpu-system"  # the chart's and the plain install's namespace
NAME = "gemma-tpu-operator"  # its ServiceAccount, ClusterRole and ClusterRoleBinding
LABELS = {"app.kubernetes.io/name": NAME, "app.kubernetes.io/instance": NAME, "app.kubernetes.io/part-of": "gemma-tpu"}
TOKEN_SECONDS = 24 * 3600
# The kinds the operator creates for a CR, all labelled with its name (children/common.py).
CHILD_KINDS = ("Job", "Deployment", "Service", "ConfigMap", "Pod")


class InstallError(RuntimeError):
    """The server did not take what was installed; the message says what and why."""


def operator_objects() -> list[dict]:
    """The operator's namespace, ServiceAccount and cluster-wide RBAC, as the chart renders them by default."""
    meta = {"name": NAME, "labels": LABELS}
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {**meta, "namespace": NAMESPACE}},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": meta,
            "rules": rbac.cluster_rules(),
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": meta,
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": NAME},
            "subjects": [{"kind": "ServiceAccount", "name": NAME, "namespace": NAMESPACE}],
        },
    ]


def workload_accounts(docs: list[dict], settings: OperatorSettings) -> list[dict]:
    """The ServiceAccounts the CRs' pods run as (the chart's in each workload namespace, and any other a
    CR names), with no API token mounted, as the chart makes them."""
    defaults = {api.FINETUNE.kind: settings.training_service_account, api.SERVE.kind: settings.serving_service_account}
    found = {
        (
            d["metadata"].get("namespace") or "default",
            (d.get("spec") or {}).get("serviceAccountName") or defaults[d["kind"]],
        )
        for d in docs
        if d.get("kind") in defaults
    }
    return [
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": name, "namespace": namespace},
            "automountServiceAccountToken": False,
        }
        for namespace, name in sorted(found)
        if name and name != "default"
    ]


async def crds(kube: NodeKube, timeout: float = 60) -> None:
    """Both CRDs by server-side apply, then wait until the server serves them (Established)."""
    for definition in crd.all_crds():
        await kube.apply(definition)
    deadline = time.monotonic() + timeout
    for definition in crd.all_crds():
        name = definition["metadata"]["name"]
        while True:
            got = await kube.get_cluster_scoped("CustomResourceDefinition", name)
            conditions = {c["type"]: c for c in ((got or {}).get("status") or {}).get("conditions") or []}
            if conditions.get("Established", {}).get("status") == "True":
                break
            if time.monotonic() > deadline:
                raise InstallError(f"CRD {name} not Established after {timeout:.0f} s: {list(conditions.values())}")
            await asyncio.sleep(0.2)


async def operator_identity(kube: NodeKube, docs: list[dict], settings: OperatorSettings) -> None:
    for obj in [*operator_objects(), *workload_accounts(docs, settings)]:
        await kube.apply(obj)


async def operator_kubeconfig(kube: NodeKube, admin: Path, path: Path) -> Path:
    """A kubeconfig of the same server with a token of the operator's ServiceAccount (TokenRequest)."""
    token = await kube.service_account_token(NAMESPACE, NAME, TOKEN_SECONDS)
    return with_token(admin, token, path)


async def delete_earlier(kube: NodeKube, docs: list[dict]) -> list[str]:
    """Delete the CRs of `docs` an earlier run left; returns what was deleted."""
    deleted = []
    for doc in docs:
        meta = doc["metadata"]
        namespace = meta.get("namespace") or "default"
        if await kube.get(doc["kind"], namespace, meta["name"]) is not None:
            await kube.delete(doc["kind"], namespace, meta["name"])
            deleted.append(f"{doc['kind']}/{meta['name']}")
    return deleted


async def wait_children_gone(kube: NodeKube, docs: list[dict], timeout: float = 120) -> None:
    """Wait until the garbage collector has removed what the operator made for the CRs of `docs`
    (their pods need a node to finalise their deletion: the local node runs meanwhile)."""
    deadline = time.monotonic() + timeout
    while left := await _children(kube, docs):
        if time.monotonic() > deadline:
            raise InstallError(f"an earlier run's objects are still there after {timeout:.0f} s: {', '.join(left)}")
        await asyncio.sleep(0.5)


def namespaces(docs: list[dict]) -> list[str]:
    """The namespaces the demo's CRs live in: where its pods run."""
    return sorted({d["metadata"].get("namespace") or "default" for d in docs})


async def enforce_restricted(kube: NodeKube, names: list[str]) -> None:
    """Label the namespaces so that the API server admits there only pods of Pod Security's
    `restricted` level, as a platform team would for tenants."""
    labels = {f"pod-security.kubernetes.io/{mode}": "restricted" for mode in ("enforce", "warn")}
    for name in names:
        await kube.patch_cluster_scoped("Namespace", name, {"metadata": {"labels": labels}})


async def _children(kube: NodeKube, docs: list[dict]) -> list[str]:
    left = []
    for namespace in namespaces(docs):
        names = ",".join(sorted({label_value(d["metadata"]["name"]) for d in docs}))
        selector = f"app.kubernetes.io/managed-by={MANAGED_BY},app.kubernetes.io/instance in ({names})"
        for kind in CHILD_KINDS:
            try:
                left += [f"{kind}/{o['metadata']['name']}" for o in await kube.list(kind, namespace, selector)]
            except ApiError as e:
                if e.status != 404:
                    raise
    return left
