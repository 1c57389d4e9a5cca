"""The client of the local node agent and of the demo: the operator's `Kube`, plus the calls only a
scheduler, a kubelet or an installer makes."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import kubernetes

from gemma_devcluster.kinds import LOCAL_KINDS
from gemma_operator.kube import ApiError, Kube

NODE_AGENT = "gemma-tpu-node"  # the User-Agent of the node agent's requests
FIELD_MANAGER = "gemma-tpu-dev"
RETRY_PAUSES = (
    0.2,
    0.5,
    1.0,
    2.0,
)  # seconds before each new attempt at a transient answer  # the server-side apply field manager of what the demo installs


class NodeKube(Kube):
    """`Kube` over the local kinds (kinds.LOCAL_KINDS), with the node's and the installer's calls.
    A transient answer (429, 5xx, none) is asked again a few times: a real API server answers 429
    for a moment after a CRD is Established, and restarts."""

    async def _call(
        self,
        method: str,
        path: str,
        body: Any = None,
        query: dict | None = None,
        content_type: str = "application/json",
        raw: bool = False,
    ) -> Any:
        for pause in (*RETRY_PAUSES, None):
            try:
                return await super()._call(method, path, body, query, content_type, raw)
            except ApiError as e:
                if not e.transient or pause is None:
                    raise
                await asyncio.sleep(min(e.retry_after or pause, max(RETRY_PAUSES)))
        raise AssertionError("unreachable: the last attempt returns or raises")

    @classmethod
    def from_kubeconfig(cls, path: Path, user_agent: str = NODE_AGENT) -> NodeKube:
        return cls(kubernetes.config.new_client_from_config(config_file=str(path)), LOCAL_KINDS, user_agent)

    @classmethod
    def local(cls, url: str, user_agent: str = NODE_AGENT) -> NodeKube:
        """A client of the in-process API at `url` (plain HTTP, no credentials)."""
        cfg = kubernetes.client.Configuration()
        cfg.host = url.rstrip("/")
        return cls(kubernetes.client.ApiClient(cfg), LOCAL_KINDS, user_agent)

    @property
    def host(self) -> str:
        """The API server's URL."""
        return str(self._client.configuration.host)

    async def create(self, obj: dict) -> dict:
        """Create a namespaced object, or a cluster-scoped one (no metadata.namespace)."""
        return await self._call("POST", self._path(obj["kind"], obj["metadata"].get("namespace")), body=obj)

    async def get_cluster_scoped(self, kind: str, name: str) -> dict | None:
        try:
            return await self._call("GET", self._path(kind, None, name))
        except ApiError as e:
            if e.status == 404:
                return None
            raise

    async def patch_cluster_scoped(self, kind: str, name: str, patch: dict) -> dict:
        """A merge patch of a cluster-scoped object (a Node)."""
        return await self._call(
            "PATCH", self._path(kind, None, name), body=patch, content_type="application/merge-patch+json"
        )

    async def bind(self, pod: dict, node: str) -> None:
        """Assign the pod to `node` through its binding subresource, as a scheduler does (a pod's
        spec.nodeName cannot be set otherwise)."""
        meta = pod["metadata"]
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": meta["name"], "namespace": meta["namespace"], "uid": meta["uid"]},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        await self._call("POST", self._path("Pod", meta["namespace"], meta["name"], "binding"), body=body)

    async def patch_status(self, kind: str, namespace: str | None, name: str, status: dict) -> dict:
        """A merge patch of the status of an object, namespaced or not (a Node's)."""
        path = self._path(kind, namespace, name, "status")
        return await self._call("PATCH", path, body={"status": status}, content_type="application/merge-patch+json")

    async def delete_now(self, pod: dict) -> None:
        """Remove a pod whose containers have stopped: deletion with grace period 0, for this very pod
        (its uid), as the kubelet finalises a pod being deleted."""
        meta = pod["metadata"]
        body = {"gracePeriodSeconds": 0, "preconditions": {"uid": meta["uid"]}}
        try:
            await self._call("DELETE", self._path("Pod", meta["namespace"], meta["name"]), body=body)
        except ApiError as e:
            if e.status not in (404, 409):  # gone already, or a new pod of the same name
                raise

    async def apply(self, obj: dict, *, status: bool = False) -> dict:
        """Server-side apply of `obj` by this program's field manager, taking over fields others set."""
        meta = obj["metadata"]
        path = self._path(obj["kind"], meta.get("namespace"), meta["name"], "status" if status else None)
        return await self._call(
            "PATCH",
            path,
            body=json.dumps(obj),
            query={"fieldManager": FIELD_MANAGER, "force": "true"},
            content_type="application/apply-patch+yaml",
        )

    async def service_account_token(self, namespace: str, name: str, seconds: int) -> str:
        """A token of that ServiceAccount issued by the API server (TokenRequest), for this API server."""
        body = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"expirationSeconds": seconds},
        }
        path = self._path("ServiceAccount", namespace, name, "token")
        return (await self._call("POST", path, body=body))["status"]["token"]
