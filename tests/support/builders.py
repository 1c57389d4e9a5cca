"""Test builders for CRs: `finetune("x").tpu("v5p", "2x2x1").lora(rank=64).obj()`, `.gpu("nvidia-h100-80gb", 2)`."""

from __future__ import annotations

import copy
from typing import Any


class _Builder:
    kind = ""

    def __init__(self, name: str, namespace: str = "default") -> None:
        self._obj: dict[str, Any] = {
            "apiVersion": "gemma-tpu.dev/v1alpha1",
            "kind": self.kind,
            "metadata": {"name": name, "namespace": namespace},
            "spec": {},
        }

    def set(self, path: str, value: Any) -> _Builder:
        node = self._obj["spec"]
        *parents, leaf = path.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
        return self

    def tpu(self, accelerator: str, topology: str | None = None, **kw: Any) -> _Builder:
        self._obj["spec"]["tpu"] = {"accelerator": accelerator, **({"topology": topology} if topology else {}), **kw}
        return self

    def gpu(self, gpu_type: str, count: int | None = None, **kw: Any) -> _Builder:
        self._obj["spec"]["gpu"] = {"type": gpu_type, **({"count": count} if count else {}), **kw}
        return self

    def label(self, key: str, value: str) -> _Builder:
        self._obj["metadata"].setdefault("labels", {})[key] = value
        return self

    @property
    def name(self) -> str:
        return self._obj["metadata"]["name"]

    @property
    def spec(self) -> dict[str, Any]:
        return copy.deepcopy(self._obj["spec"])

    def obj(self) -> dict[str, Any]:
        return copy.deepcopy(self._obj)


class finetune(_Builder):  # noqa: N801 (reads like the CR kind)
    kind = "GemmaFineTune"

    def __init__(self, name: str, namespace: str = "default") -> None:
        super().__init__(name, namespace)
        self._obj["spec"] = {
            "model": {"uri": "gs://models/gemma-4-31B-it", "preset": "gemma4-31b"},
            "dataset": {"uri": "gs://data/train.jsonl", "maxSeqLen": 2048},
            "output": {"uri": f"gs://out/{name}"},
            "training": {"steps": 100},
        }

    def lora(self, **kw: Any) -> finetune:
        self._obj["spec"]["lora"] = kw
        return self

    def training(self, **kw: Any) -> finetune:
        self._obj["spec"]["training"].update(kw)
        return self

    def cpu_tiny(self, root: str = "/data") -> finetune:
        """The tiny model on the cpu profile, paths under a PVC mounted at root."""
        self._obj["spec"].update(
            {
                "model": {"uri": f"{root}/model", "preset": "tiny", "dtype": "float32"},
                "dataset": {"uri": f"{root}/data.jsonl", "maxSeqLen": 64},
                "output": {"uri": f"{root}/out"},
                "tpu": {"accelerator": "cpu"},
                "storage": {"persistentVolumeClaim": "data", "mountPath": root},
            }
        )
        return self


class serve(_Builder):  # noqa: N801
    kind = "GemmaServe"

    def __init__(self, name: str, namespace: str = "default") -> None:
        super().__init__(name, namespace)
        self._obj["spec"] = {"model": {"uri": "gs://models/merged"}}

    def fine_tune(self, name: str) -> serve:
        self._obj["spec"]["model"] = {"fineTuneRef": {"name": name}}
        return self
