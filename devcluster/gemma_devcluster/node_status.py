"""The local node as the API sees it: its Node object and status, and its heartbeat Lease, built the
way the kubelet builds them (pkg/kubelet/nodestatus/setters.go, pkg/kubelet/nodelease).

The node offers this machine's CPUs, memory and disk and no TPU, is reached at 127.0.0.1 (the API
server reads pod logs from its kubelet endpoint there), and renews a Lease in kube-node-lease as the
kubelet does, so that whatever watches node health sees it alive.
"""

from __future__ import annotations

import datetime
import os
import platform
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gemma_operator.clock import timestamp

LEASE_NAMESPACE = "kube-node-lease"
LEASE_SECONDS = 40  # the kubelet's nodeLeaseDurationSeconds default
RENEW_SECONDS = LEASE_SECONDS / 4  # pkg/kubelet/nodelease: it renews at a quarter of the duration
REPORT_SECONDS = 300  # the kubelet's nodeStatusReportFrequency: a full status at least this often
# Added by the API server's TaintNodesByCondition admission to every new Node, and removed by the node
# lifecycle controller once the node is Ready. No such controller runs beside this node: it removes it.
NOT_READY_TAINT = "node.kubernetes.io/not-ready"
ADDRESS = "127.0.0.1"
MAX_PODS = "110"  # the kubelet's maxPods default
ARCHITECTURES = {"x86_64": "amd64", "aarch64": "arm64"}  # uname -m -> GOARCH, as node labels name them
# The node's conditions: type -> (status, reason, message) as the kubelet reports a healthy node.
HEALTHY = {
    "MemoryPressure": ("False", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
    "DiskPressure": ("False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
    "PIDPressure": ("False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
    "Ready": ("True", "KubeletReady", "kubelet is posting ready status"),
}
# What the node lifecycle controller writes once a node's Lease has expired (pkg/controller/nodelifecycle).
GONE = ("Unknown", "NodeStatusUnknown", "Kubelet stopped posting node status.")


@dataclass(frozen=True)
class Machine:
    """What this machine is and has, for the Node's labels, capacity and nodeInfo."""

    cpus: int
    memory_kib: int
    disk_bytes: int
    arch: str
    kernel: str
    os_image: str
    boot_id: str
    machine_id: str


def _read(path: str) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return ""


def machine(workdir: Path) -> Machine:
    """This machine, its disk measured where the pods' folders are."""
    meminfo = dict(line.split(":", 1) for line in _read("/proc/meminfo").splitlines() if ":" in line)
    memory_kib = int((meminfo.get("MemTotal") or "0 kB").split()[0])
    workdir.mkdir(parents=True, exist_ok=True)
    os_release = dict(
        line.split("=", 1) for line in _read("/etc/os-release").splitlines() if "=" in line and not line.startswith("#")
    )
    return Machine(
        cpus=os.cpu_count() or 1,
        memory_kib=memory_kib,
        disk_bytes=shutil.disk_usage(workdir).total,
        arch=ARCHITECTURES.get(platform.machine(), platform.machine()),
        kernel=platform.release(),
        os_image=os_release.get("PRETTY_NAME", "").strip('"') or platform.system(),
        boot_id=_read("/proc/sys/kernel/random/boot_id"),
        machine_id=_read("/etc/machine-id"),
    )


def node_object(name: str, m: Machine) -> dict[str, Any]:
    """The Node the agent registers: the well-known labels a kubelet sets, no TPU label."""
    labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": m.arch}
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}, "spec": {}}


def capacity(m: Machine) -> dict[str, str]:
    """What the node offers pods: nothing is reserved for a system, so allocatable is the capacity."""
    return {
        "cpu": str(m.cpus),
        "memory": f"{m.memory_kib}Ki",
        "ephemeral-storage": str(m.disk_bytes),
        "pods": MAX_PODS,
    }


def node_status(m: Machine, port: int, at: datetime.datetime, conditions: dict | None = None) -> dict[str, Any]:
    """The Node's status: capacity, conditions (healthy unless `conditions` says otherwise), the address
    and port of its kubelet endpoint, and what the machine runs."""
    t = timestamp(at)
    return {
        "capacity": capacity(m),
        "allocatable": capacity(m),
        "conditions": [
            {
                "type": kind,
                "status": status,
                "reason": reason,
                "message": message,
                "lastHeartbeatTime": t,
                "lastTransitionTime": t,
            }
            for kind, (status, reason, message) in (conditions or HEALTHY).items()
        ],
        # Only the IP: the API server tries a Hostname address first, and this name need not resolve.
        "addresses": [{"type": "InternalIP", "address": ADDRESS}],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": port}},
        "nodeInfo": {
            "machineID": m.machine_id,
            "systemUUID": m.machine_id,
            "bootID": m.boot_id,
            "kernelVersion": m.kernel,
            "osImage": m.os_image,
            "containerRuntimeVersion": "local://processes",
            "kubeletVersion": "gemma-tpu-node",
            "kubeProxyVersion": "",
            "operatingSystem": "linux",
            "architecture": m.arch,
        },
    }


def gone_conditions() -> dict[str, tuple[str, str, str]]:
    return dict.fromkeys(HEALTHY, GONE)


def micro_time(at: datetime.datetime) -> str:
    """metav1.MicroTime, as a Lease's renewTime is written."""
    return at.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def lease(name: str, node_uid: str, at: datetime.datetime) -> dict[str, Any]:
    """The node's Lease, owned by its Node (so that deleting the Node removes it), held by the node."""
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": name,
            "namespace": LEASE_NAMESPACE,
            "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": name, "uid": node_uid}],
        },
        "spec": {"holderIdentity": name, "leaseDurationSeconds": LEASE_SECONDS, "renewTime": micro_time(at)},
    }
