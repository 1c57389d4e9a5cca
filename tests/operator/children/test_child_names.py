"""Child names against the rules a real cluster enforces, for every CR name the API server accepts.

A CR name is any DNS-1123 subdomain: up to 253 characters, dots, a leading digit. Each kind of
child has its own rule (cited where it is encoded below); every child, for every name, must pass
its kind's rule, and two CRs never share a child.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gemma_operator.children import common, merge_objects, serving_objects, training, training_objects
from gemma_operator.cli import _load_crs, plan_documents
from gemma_operator.plan import plan_finetune, plan_serve
from gemma_operator.settings import OperatorSettings
from tests.support.builders import finetune, serve

SETTINGS = OperatorSettings()
ROOT = Path(__file__).resolve().parents[3]

# kubernetes apimachinery pkg/util/validation/validation.go: IsDNS1035Label, IsDNS1123Label,
# IsDNS1123Subdomain and IsValidLabelValue.
DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def dns1035(name: str) -> bool:
    return len(name) <= 63 and bool(DNS1035.match(name))


def hostname(name: str) -> bool:
    return len(name) <= 63 and bool(DNS1123_LABEL.match(name))


def label_value(value: str) -> bool:
    return len(value) <= 63 and bool(LABEL_VALUE.match(value))


def cr_name(length: int, kind: str) -> str:
    """A valid DNS-1123 subdomain of this length and character class."""
    fill = {
        "letters": "gemmafinetune",
        "digit-first": "1chat",
        "dots": "my.chat",
        "hyphens": "team-a-gemma",
        "digits": "0123456789",
    }[kind]
    name = (fill * 253)[:length]
    if not name[-1].isalnum():
        name = name[:-1] + "z"
    assert len(name) == length and len(name) <= 253 and DNS1123_SUBDOMAIN.match(name), name
    return name


LENGTHS = [1, 2, 7, 20, 30, 32, 33, 34, 40, 44, 45, 46, 47, 48, 50, 52, 55, 58, 60, 62, 63, 64, 70, 100, 200, 253]
NAMES = [cr_name(n, kind) for kind in ("letters", "digit-first", "dots", "hyphens", "digits") for n in LENGTHS]
FT_SHAPES = {"v5p-8 Job": ("v5p", "2x2x1"), "v5p-16 JobSet": ("v5p", "2x2x2"), "v5p-128 JobSet": ("v5p", "4x4x4")}
SERVE_SHAPES = {"v6e-8 Deployment": "2x4", "v6e-16 LeaderWorkerSet": "4x4"}


def check_jobset(js: dict) -> list[str]:
    """kubernetes-sigs/jobset pkg/webhooks/jobset_webhook.go (ValidateCreate): the JobSet name is
    the default subdomain, a Service name (DNS-1035); each generated Job name and the longest pod
    name `<jobset>-<replicatedJob>-<jobIndex>-<podIndex>-<5 random>` are DNS-1035 labels."""
    name, problems = js["metadata"]["name"], []
    for rj in js["spec"]["replicatedJobs"]:
        job = f"{name}-{rj['name']}-{rj['replicas'] - 1}"
        pod = f"{job}-{rj['template']['spec']['completions'] - 1}-abcde"
        named = (("name", name), ("Job", job), ("pod", pod))
        problems += [f"JobSet {what} {n!r}" for what, n in named if not dns1035(n)]
    return problems


def check_lws(lws: dict) -> list[str]:
    """The LWS controller (kubernetes-sigs/lws pkg/controllers) makes a headless Service and a leader
    StatefulSet named after the LWS, and per group a worker StatefulSet `<lws>-<group>` whose pods
    are `<lws>-<group>-<index>` (hostnames). StatefulSet pods carry the label
    `controller-revision-hash=<statefulset>-<hash, up to 10>` (kubernetes pkg/controller/history)."""
    name, problems = lws["metadata"]["name"], []
    groups, size = 1000, lws["spec"]["leaderWorkerTemplate"]["size"]  # replicas <= 1000 (GemmaServeSpec)
    if not dns1035(name):
        problems.append(f"LeaderWorkerSet name {name!r}")
    for sts in (name, f"{name}-{groups - 1}"):
        if not label_value(f"{sts}-abcdefghij"):
            problems.append(f"controller-revision-hash of StatefulSet {sts!r}")
    if not hostname(f"{name}-{groups - 1}-{size - 1}"):
        problems.append(f"worker hostname of {name!r}")
    return problems


def check(obj: dict) -> list[str]:
    kind, meta = obj["kind"], obj["metadata"]
    problems = [f"{kind} label {k}={v!r}" for k, v in (meta.get("labels") or {}).items() if not label_value(v)]
    if kind == "JobSet":
        problems += check_jobset(obj)
    elif kind == "LeaderWorkerSet":
        problems += check_lws(obj)
    elif kind in ("Service", "Job"):
        # Service names are DNS-1035 labels (kubernetes pkg/apis/core/validation ValidateService);
        # a Job's name is its pods' `batch.kubernetes.io/job-name` label value (pkg/apis/batch/validation).
        ok = dns1035(meta["name"]) if kind == "Service" else label_value(meta["name"])
        problems += [] if ok else [f"{kind} name {meta['name']!r}"]
    if not DNS1123_SUBDOMAIN.match(meta["name"]) or len(meta["name"]) > 253:
        problems.append(f"{kind} name {meta['name']!r}")
    return problems


def children(name: str) -> list[dict]:
    objs = []
    for accelerator, topology in FT_SHAPES.values():
        b = finetune(name).tpu(accelerator, topology).training(batchSize=16)
        p = plan_finetune(name, "ns", b.spec, SETTINGS)
        objs += training_objects(p, SETTINGS) + merge_objects(p, SETTINGS)
    for topology in SERVE_SHAPES.values():
        b = serve(name).tpu("v6e", topology).set("metrics", {"podMonitor": True})
        b.set("autoscaling", {"maxReplicas": 1000})
        objs += serving_objects(plan_serve(name, "ns", b.spec, SETTINGS), SETTINGS)
    return objs


def test_every_child_of_every_cr_name_passes_its_kinds_rule():
    problems, owners = [], {}
    for name in NAMES:
        for obj in children(name):
            problems += [f"CR {name!r} ({len(name)} chars): {p}" for p in check(obj)]
            key = (obj["kind"], obj["metadata"]["name"])
            assert owners.setdefault(key, name) == name, f"{key} belongs to CRs {owners[key]!r} and {name!r}"
    assert not problems, "\n".join(problems[:20])


@pytest.mark.parametrize("name", ["gemma4-31b-verilog", "chat"])
def test_names_that_fit_stay_readable(name):
    assert common.child_name(name, "vllm") == f"{name}-vllm"
    p = plan_finetune(name, "ns", finetune(name).tpu("v5p", "2x2x2").spec, SETTINGS)
    assert training.names(p)[0] == f"{name}-train-{p.run}"


def test_a_shortened_name_keeps_the_full_cr_name_in_labels():
    name = cr_name(60, "dots")
    js = training.workload(plan_finetune(name, "ns", finetune(name).tpu("v5p", "2x2x2").spec, SETTINGS), SETTINGS, None)
    assert js["metadata"]["name"] != f"{name}-train" and js["metadata"]["labels"][common.FINETUNE_LABEL] == name


def test_every_example_renders_children_that_pass():
    docs = _load_crs([str(ROOT / "examples"), str(ROOT / "examples" / "quickstart")])
    plans, problems = plan_documents(docs, SETTINGS)
    assert not problems and len(plans) == len(docs) >= 6
    for kind, p in plans:
        fine_tune = kind == "GemmaFineTune"
        objs = training_objects(p, SETTINGS) + merge_objects(p, SETTINGS) if fine_tune else serving_objects(p, SETTINGS)
        for obj in objs:
            assert not check(obj), (p.name, check(obj))
