"""The merge writes its output through Cloud Storage FUSE as a non-root user: what the CSI driver
and gcsfuse need for that to work, for every shard size."""

from __future__ import annotations

import pytest

from gemma_operator.children import merge
from gemma_operator.fit import parse_size
from gemma_operator.plan import plan_finetune
from gemma_operator.settings import OperatorSettings
from gemma_workloads.config import MERGE_SHARD_WRITERS
from tests.support.builders import finetune
from tests.support.validation import validate_object

SETTINGS = OperatorSettings()
GI = 2**30
DRIVER_DEFAULT_SIDECAR_STORAGE = 5 * GI  # gcs-fuse-csi-driver cmd/webhook/main.go: sidecar-ephemeral-storage-limit


def quantity(text: str) -> int:
    assert text.endswith("Gi"), text
    return int(text[:-2]) * GI


def options(volume: dict) -> dict[str, str]:
    pairs = (o.partition("=") for o in volume["csi"]["volumeAttributes"]["mountOptions"].split(","))
    return {k: v for k, _, v in pairs}


@pytest.mark.parametrize("shard_size", ["5GB", "10GB", "500MB", "2Gi"])
def test_the_merge_can_write_through_fuse_as_its_own_user(shard_size):
    b = finetune("ft").tpu("v5p").set("merge", {"shardSize": shard_size})
    p = plan_finetune(b.name, "ns", b.spec, SETTINGS)
    job = merge.job(p, SETTINGS, None)
    validate_object(job)
    pod = job["spec"]["template"]
    security = pod["spec"]["securityContext"]
    assert security["runAsNonRoot"] is True
    [volume] = [v for v in pod["spec"]["volumes"] if v["name"] == "output"]
    opts = options(volume)
    # gcs-fuse-csi-driver README: a non-root container needs uid, gid, file-mode and dir-mode (or
    # fsGroup), else the mount is root's and every write fails with "Permission denied".
    assert (int(opts["uid"]), int(opts["gid"])) == (security["runAsUser"], security["runAsGroup"]) == (65532, 65532)
    assert int(opts["file-mode"], 8) & 0o600 == 0o600 and int(opts["dir-mode"], 8) & 0o700 == 0o700
    # gcsfuse's rename-dir-limit defaults to 0: the merge publishes its folder by a rename.
    assert int(opts["rename-dir-limit"]) >= 1000 and "implicit-dirs" in opts
    # With fsGroup the driver passes it as the gid (gcs-fuse-csi-driver README): it must agree.
    assert security.get("fsGroup", security["runAsGroup"]) == security["runAsGroup"]
    # The sidecar stages each file being written: it must hold every shard in flight.
    annotations = pod["metadata"]["annotations"]
    storage = quantity(annotations["gke-gcsfuse/ephemeral-storage-limit"])
    assert storage >= MERGE_SHARD_WRITERS * parse_size(shard_size)
    assert quantity(annotations["gke-gcsfuse/memory-limit"]) > 256 * 2**20  # the driver's default
    if shard_size == "5GB":
        assert storage > DRIVER_DEFAULT_SIDECAR_STORAGE, "two 5 GB shards do not fit the driver's default"
