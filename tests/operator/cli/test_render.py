"""Every object of every example renders and is valid Kubernetes, checked offline."""

import json
from pathlib import Path

import pytest
import yaml

from gemma_operator import cli
from gemma_operator.children import benchmark, merge_objects, serving_objects, training_objects
from gemma_operator.settings import OperatorSettings
from tests.support.validation import pod_templates, validate_cr, validate_object

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
EXAMPLE_FILES = sorted(p for p in EXAMPLES.rglob("*.yaml") if "gitops" not in p.parts)  # gitops/: Argo CD and Flux


def all_plans():
    docs = cli._load_crs([str(EXAMPLES), str(EXAMPLES / "quickstart")])
    plans, problems = cli.plan_documents(docs, OperatorSettings())
    assert not problems
    return docs, plans


def test_every_example_is_valid_against_the_crd_schema():
    docs, _ = all_plans()
    assert len(docs) == len(EXAMPLE_FILES) >= 5
    for doc in docs:
        validate_cr(doc)


def test_every_child_of_every_example_is_valid_kubernetes():
    _, plans = all_plans()
    settings = OperatorSettings()
    kinds = set()
    for kind, plan in plans:
        if kind == "GemmaFineTune":
            objects = training_objects(plan, settings) + merge_objects(plan, settings)
        else:
            objects = serving_objects(plan, settings)
        for obj in objects:
            if obj["kind"] != "PodMonitor":  # prometheus-operator kind, checked in test_serving_children
                validate_object(obj)
            kinds.add(obj["kind"])
    assert kinds == {
        "ConfigMap",
        "Job",
        "JobSet",
        "Deployment",
        "Service",
        "LeaderWorkerSet",
        "HorizontalPodAutoscaler",
        "PodMonitor",
    }


def test_render_cli_prints_the_first_phase(capsys):
    assert cli.main_exit(["render", "-f", str(EXAMPLES / "gemma4-31b-v5p8.yaml")]) == 0
    objs = list(yaml.safe_load_all(capsys.readouterr().out))
    assert [o["kind"] for o in objs] == ["ConfigMap", "Job"]
    assert cli.main_exit(["render", "-f", str(EXAMPLES / "gemma4-31b-v5p8.yaml"), "--phase", "merge"]) == 0
    objs = list(yaml.safe_load_all(capsys.readouterr().out))
    assert [o["kind"] for o in objs] == ["ConfigMap", "Job"]
    assert objs[1]["spec"]["template"]["spec"]["containers"][0]["command"][:4] == [
        "python",
        "-m",
        "gemma_workloads",
        "merge",
    ]


def test_render_writes_every_object_in_full(capsys):
    """PyYAML's dumper writes a dict met twice as an anchor and aliases (`&id001` ... `*id001`);
    the leader and worker containers of a LeaderWorkerSet share their securityContext."""
    assert cli.main_exit(["render", "-f", str(EXAMPLES / "serve-v6e16-multihost.yaml")]) == 0
    out = capsys.readouterr().out
    assert "&id" not in out and "*id" not in out
    lws = next(o for o in yaml.safe_load_all(out) if o["kind"] == "LeaderWorkerSet")["spec"]["leaderWorkerTemplate"]
    worker = lws["workerTemplate"]["spec"]["containers"][0]
    assert worker["securityContext"]["capabilities"] == {"drop": ["ALL"]}


def _write(tmp_path, spec):
    path = tmp_path / "cr.yaml"
    path.write_text(
        yaml.safe_dump(
            {"apiVersion": "gemma-tpu.dev/v1alpha1", "kind": "GemmaFineTune", "metadata": {"name": "x"}, "spec": spec}
        )
    )
    return str(path)


BASE = {"model": {"uri": "gs://bkt/m"}, "dataset": {"uri": "gs://bkt/d"}, "output": {"uri": "gs://bkt/o"}}


@pytest.mark.parametrize("command", ["render", "plan"])
def test_bad_input_exits_2_with_one_line_per_problem_and_nothing_on_stdout(tmp_path, capsys, command):
    path = _write(tmp_path, {**BASE, "lora": {"rank": 0}, "trainng": {}})
    assert cli.main_exit([command, "-f", path]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines() == [  # the CRD schema's refusals, as the API server would refuse them
        "GemmaFineTune/x: spec.lora.rank: 0 must be at least 1",
        "GemmaFineTune/x: spec.trainng: unknown field",
    ]

    path = _write(tmp_path, {**BASE, "model": {"uri": "/models/m"}, "tpu": {"topology": "9x9x9"}})
    assert cli.main_exit([command, "-f", path]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert len(err.splitlines()) == 2
    assert err.splitlines()[0].startswith(
        "GemmaFineTune/x: spec.tpu.topology: v5p has no topology '9x9x9'; allowed: 2x2x1,"
    )
    assert "spec.model.uri: /models/m is a local path" in err.splitlines()[1]


def test_unreadable_and_malformed_documents_are_refused(tmp_path, capsys):
    assert cli.main_exit(["render", "-f", str(tmp_path / "missing.yaml")]) == 2
    assert "missing.yaml" in capsys.readouterr().err
    path = tmp_path / "cr.yaml"
    path.write_text("apiVersion: gemma-tpu.dev/v1beta1\nkind: GemmaFineTune\nmetadata: {name: p}\n---\njust text\n")
    assert cli.main_exit(["render", "-f", str(path)]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "gemma-tpu.dev/v1beta1 GemmaFineTune: not a gemma-tpu.dev/v1alpha1 GemmaFineTune or GemmaServe",
        "'just text': not a Kubernetes object",
    ]


def test_plan_refuses_what_cannot_fit(tmp_path, capsys):
    spec = {
        **BASE,
        "model": {"hfRepo": "google/gemma-4-31B-it"},
        "dataset": {"uri": "gs://bkt/d", "maxSeqLen": 8192},
        "tpu": {"accelerator": "v6e", "topology": "2x2"},
    }
    assert cli.main_exit(["plan", "-f", _write(tmp_path, spec)]) == 2
    err = capsys.readouterr().err
    assert "gemma4-31b does not fit v6e-4 (2x2) for training" in err and "GiB per chip needed" in err


def test_plan_json_gives_the_derived_values(capsys):
    assert cli.main_exit(["plan", "-o", "json", "-f", str(EXAMPLES / "gemma4-31b-v5p16-multihost.yaml")]) == 0
    [p] = __import__("json").loads(capsys.readouterr().out)
    assert p["slice"] == {
        "accelerator": "v5p",
        "name": "v5p-16",
        "topology": "2x2x2",
        "hosts": 2,
        "chipsPerHost": 4,
        "chips": 8,
        "machineType": "ct5p-hightpu-4t",
    }
    assert p["workload"] == "JobSet" and p["mesh"] == {"fsdp": 2, "tp": 4} and p["gradientAccumulation"] == 4
    assert p["hbmPerChip"]["fits"] and p["estimate"]["chipHours"] > 0


def test_render_reads_integers_and_names_as_the_server_gets_them(tmp_path, capsys):
    """kubectl sends `seed: 0o10` as 8 (Go's integer syntax) and the server names a CR with only a
    generateName itself: render takes both, and says what stands for the server's random characters."""
    text = (EXAMPLES / "quickstart" / "finetune.yaml").read_text()
    text = text.replace("  name: tiny-capitals\n", "  generateName: tiny-\n").replace("steps: 200", "steps: 0o310")
    (tmp_path / "cr.yaml").write_text(text)
    assert cli.main_exit(["render", "-f", str(tmp_path / "cr.yaml")]) == 0
    captured = capsys.readouterr()
    config = next(d for d in yaml.safe_load_all(captured.out) if d["kind"] == "ConfigMap")
    assert config["metadata"]["name"].startswith("tiny-xxxxx-")
    assert json.loads(config["data"]["train.json"])["steps"] == 200
    assert "the API server names it 'tiny-' and 5 random characters" in captured.err


def test_every_pod_runs_restricted_and_carries_the_platform_tolerations():
    """Each pod template of every example's children: the pod security context of Pod Security's
    `restricted` level (held to a real API server by tests/control_plane/test_pod_security.py), and
    settings.pod_tolerations after the placement's own."""
    extra = {"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}
    settings = OperatorSettings.model_validate({"pod_tolerations": [extra]})
    docs = cli._load_crs([str(EXAMPLES), str(EXAMPLES / "quickstart")])
    plans, _ = cli.plan_documents(docs, settings)
    objects = []
    for kind, plan in plans:
        if kind == "GemmaFineTune":
            objects += training_objects(plan, settings) + merge_objects(plan, settings)
        else:
            objects += serving_objects(plan, settings) + (
                [benchmark.job(plan, settings, None)] if plan.spec.benchmark else []
            )
    templates = [(o["metadata"]["name"], where, t["spec"]) for o in objects for where, t in pod_templates(o)]
    assert {where.split()[0] for _, where, _ in templates} == {"Job", "JobSet", "Deployment", "LWS"}
    for name, where, spec in templates:
        assert spec["securityContext"]["runAsNonRoot"] and spec["securityContext"]["runAsUser"] == 65532, (name, where)
        assert spec["tolerations"][-1] == extra, (name, where, spec["tolerations"])
