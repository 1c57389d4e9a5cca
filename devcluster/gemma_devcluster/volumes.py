"""Pod volumes on the local machine, for the node agent that runs pods as processes.

There are no containers here, so a mount is emulated by a directory of the pod's working folder
plus a path translation: every string the process receives (command, args, env values, and the
files of mounted ConfigMaps and Secrets, e.g. a workload config naming /data/...) has each mount
path replaced by its local directory. PersistentVolumeClaims map to folders given to the agent;
emptyDirs and the termination-message file get fresh folders per pod.

A projected volume (the one ServiceAccount admission adds for a pod's API token) gets the files of
its ConfigMap, Secret and downward API sources that exist; its token and any ConfigMap the cluster
does not have (kube-root-ca.crt where no controller publishes it; OpenShift's service CA) are left
out: the pods' processes run here and do not call the API server.
"""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TERMINATION_LOG = "/dev/termination-log"


class VolumeError(Exception):
    """A volume the local node cannot provide (the pod fails to start, with this message)."""


@dataclass
class Mounts:
    """mount path -> local path, applied to strings longest path first."""

    paths: dict[str, Path] = field(default_factory=dict)

    def translate(self, text: str) -> str:
        """Replace every mount path in one pass (a local path may itself contain a mount path)."""
        if not self.paths:
            return text
        # Whole path components only: /data matches /data and /data/x, not /database or /x/data.
        alternatives = "|".join(re.escape(m) for m in sorted(self.paths, key=len, reverse=True))
        pattern = rf"(?<![\w./-])({alternatives})(?=/|$|[^\w.-])"
        return re.sub(pattern, lambda m: str(self.paths[m.group(1)]), text)

    def translate_all(self, items: list[str]) -> list[str]:
        return [self.translate(x) for x in items]

    def untranslate(self, text: str) -> str:
        """Local folders back to mount paths: what the process reports (its termination message,
        its log) names the paths the pod sees, as it would in a container."""
        local = {str(p): m for m, p in self.paths.items() if m != TERMINATION_LOG and not p.is_file()}
        if not local:
            return text
        alternatives = "|".join(re.escape(p) for p in sorted(local, key=len, reverse=True))
        return re.sub(rf"({alternatives})(?=/|$|[^\w.-])", lambda m: local[m.group(1)], text)


def materialize(
    pod: dict[str, Any],
    container: dict[str, Any],
    workdir: Path,
    claims: dict[str, Path],
    config_maps: dict[str, dict],
    secrets: dict[str, dict],
) -> Mounts:
    """Create the container's mounts under `workdir` and return the translation for them."""
    volumes = {v["name"]: v for v in pod["spec"].get("volumes") or []}
    mounts = Mounts()
    files_to_translate: list[Path] = []
    for m in container.get("volumeMounts") or []:
        volume = volumes.get(m["name"])
        if volume is None:
            raise VolumeError(f"volumeMount {m['name']!r} has no volume")
        target = workdir / "volumes" / m["name"]
        if "configMap" in volume:
            cm = config_maps.get(volume["configMap"]["name"])
            if cm is None:
                raise VolumeError(f'configmap "{volume["configMap"]["name"]}" not found')
            files_to_translate += _write(target, cm.get("data") or {})
        elif "secret" in volume:
            secret = secrets.get(volume["secret"]["secretName"])
            if secret is None:
                raise VolumeError(f'secret "{volume["secret"]["secretName"]}" not found')
            _write(target, {k: base64.b64decode(v).decode() for k, v in (secret.get("data") or {}).items()})
        elif "projected" in volume:
            _write(target, projected(volume["projected"], pod, config_maps, secrets))
        elif "emptyDir" in volume:
            target.mkdir(parents=True, exist_ok=True)
        elif "persistentVolumeClaim" in volume:
            claim = volume["persistentVolumeClaim"]["claimName"]
            if claim not in claims:
                raise VolumeError(
                    f'persistentvolumeclaim "{claim}" is not provided by this node; known: {sorted(claims)}'
                )
            target = claims[claim]
            target.mkdir(parents=True, exist_ok=True)
        else:
            kind = next((k for k in volume if k != "name"), "?")
            raise VolumeError(f"volume {m['name']!r}: {kind} volumes are not available on the local node")
        mounts.paths[m["mountPath"].rstrip("/") or "/"] = target.resolve()
    log = workdir / "termination-log"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("")
    mounts.paths[container.get("terminationMessagePath") or TERMINATION_LOG] = log.resolve()
    for path in files_to_translate:  # configs name mount paths: point them at the local folders
        path.write_text(mounts.translate(path.read_text()))
    return mounts


def _items(data: dict[str, str], items: list[dict] | None) -> dict[str, str]:
    """A ConfigMap's or Secret's keys as files: all of them, or the listed items at their paths."""
    if not items:
        return dict(data)
    return {i["path"]: data[i["key"]] for i in items if i["key"] in data}


# The downward API fields a projected file may name that the local node knows.
_FIELDS = {"metadata.namespace", "metadata.name", "metadata.uid"}


def projected(
    spec: dict[str, Any], pod: dict[str, Any], config_maps: dict[str, dict], secrets: dict[str, dict]
) -> dict[str, str]:
    """The files of a projected volume (path -> content) from the sources that exist here."""
    files: dict[str, str] = {}
    meta = pod["metadata"]
    for source in spec.get("sources") or []:
        if "configMap" in source and (cm := config_maps.get(source["configMap"]["name"])):
            files |= _items(cm.get("data") or {}, source["configMap"].get("items"))
        elif "secret" in source and (secret := secrets.get(source["secret"]["name"])):
            data = {k: base64.b64decode(v).decode() for k, v in (secret.get("data") or {}).items()}
            files |= _items(data, source["secret"].get("items"))
        elif "downwardAPI" in source:
            for item in source["downwardAPI"].get("items") or []:
                field_path = (item.get("fieldRef") or {}).get("fieldPath", "")
                if field_path in _FIELDS:
                    files[item["path"]] = str(meta.get(field_path.split(".", 1)[1], ""))
    return files


def _write(target: Path, files: dict[str, str]) -> list[Path]:
    target.mkdir(parents=True, exist_ok=True)
    written = []
    for key, content in files.items():
        path = target / key
        path.parent.mkdir(parents=True, exist_ok=True)  # an item's path may name a subfolder
        path.write_text(content)
        written.append(path)
    return written
