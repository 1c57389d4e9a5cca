"""Kueue queues per kind of workload: a training queue never reaches the merge or the servers.

Kueue admits a workload into the ClusterQueue behind the LocalQueue its `kueue.x-k8s.io/queue-name`
label names, and adds the admitting ResourceFlavor's nodeLabels to its pods' nodeSelector (Kueue
docs, concepts "Resource Flavor"): a CPU merge admitted by a TPU flavor waits for a TPU node it
does not tolerate, forever.
"""

from __future__ import annotations

from gemma_operator.children import merge_objects, serving_objects, training_objects
from gemma_operator.plan import plan_finetune, plan_serve
from gemma_operator.settings import OperatorSettings
from tests.support.builders import finetune, serve

QUEUE = "kueue.x-k8s.io/queue-name"


def queues(objs: list[dict]) -> dict[str, str | None]:
    """Each workload's queue label, checked to be the same on its pods."""
    out = {}
    for obj in objs:
        if obj["kind"] in ("ConfigMap", "Service"):
            continue
        out[obj["kind"]] = obj["metadata"]["labels"].get(QUEUE)
        template = obj["spec"].get("template") or obj["spec"].get("leaderWorkerTemplate", {}).get("leaderTemplate")
        if obj["kind"] in ("Deployment", "LeaderWorkerSet"):
            assert template["metadata"]["labels"].get(QUEUE) == out[obj["kind"]]
    return out


def fine_tune(settings: OperatorSettings, label: str | None) -> tuple[dict, dict]:
    b = finetune("ft").tpu("v5p")
    if label:
        b.label(QUEUE, label)
    p = plan_finetune(b.name, "ns", b.spec, settings, b.obj()["metadata"].get("labels"))
    return queues(training_objects(p, settings)), queues(merge_objects(p, settings))


def test_the_merge_never_inherits_the_training_queue():
    for settings, label in ((OperatorSettings(), "tpu-v5p"), (OperatorSettings(kueue_queue="tpu-v5p"), None)):
        train, merge = fine_tune(settings, label)
        assert train == {"Job": "tpu-v5p"} and merge == {"Job": None}


def test_the_merge_has_its_own_queue_setting():
    train, merge = fine_tune(OperatorSettings(kueue_queue="tpu-v5p", merge_kueue_queue="cpu-batch"), "team-tpu")
    assert train == {"Job": "team-tpu"} and merge == {"Job": "cpu-batch"}


def test_serving_has_its_own_queue_setting():
    for topology in ("2x4", "4x4"):

        def serving(settings, label=None, topology=topology):
            b = serve("s").tpu("v6e", topology)
            if label:
                b.label(QUEUE, label)
            labels = b.obj()["metadata"].get("labels")
            p = plan_serve(b.name, "ns", b.spec, settings, fine_tune_preset="gemma4-31b", labels=labels)
            return set(queues(serving_objects(p, settings)).values())

        assert serving(OperatorSettings(kueue_queue="tpu-v5p")) == {None}, "the training default stays with training"
        assert serving(OperatorSettings(kueue_queue="tpu-v5p", serving_kueue_queue="v6e-serving")) == {"v6e-serving"}
        own = serving(OperatorSettings(serving_kueue_queue="v6e-serving"), "mine")
        assert own == {"mine"}, "the CR's own label wins"
