"""The Dockerfiles (no container engine here to build them): pinned, non-root, the right extras,
and the entrypoints the chart and the operator run exist."""

from __future__ import annotations

import re
import shlex
import tomllib

import pytest
import yaml
from scripts.manifests import CHART, ROOT

from gemma_operator.children import merge_objects, training_objects
from gemma_operator.cli import build_parser, plan_documents
from gemma_operator.settings import OperatorSettings
from tests.support.chart import objects, one

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PYTHON = re.match(r">=(\d+\.\d+)", PYPROJECT["project"]["requires-python"]).group(1)


def instructions(path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Dockerfile, continuation lines joined, comments dropped."""
    text = re.sub(
        r"\\\n", " ", "\n".join(row for row in path.read_text().splitlines() if not row.lstrip().startswith("#"))
    )
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in text.splitlines() if line.strip()]


def only(path, name: str) -> list[str]:
    return [args for op, args in instructions(path) if op == name]


def makefile_var(name: str) -> str:
    return re.search(rf"^{name} \??= (\S+)$", (ROOT / "Makefile").read_text(), re.M).group(1)


DOCKERFILES = {"operator": ROOT / "operator" / "Dockerfile", "workloads": ROOT / "workloads" / "Dockerfile"}
EXTRAS = {"operator": "operator", "workloads": "workloads,tpu"}


@pytest.mark.parametrize("image", DOCKERFILES)
def test_base_image_pinned_by_tag_and_user_not_root(image):
    path = DOCKERFILES[image]
    assert only(path, "FROM") == [f"python:{PYTHON}-slim-bookworm"], "one stage, on a tagged slim base"
    user = only(path, "USER")[-1]
    uid, _, gid = user.partition(":")
    assert uid.isdigit() and int(uid) != 0 and gid.isdigit(), "a numeric non-root user, which runAsNonRoot can verify"
    if image == "operator":
        pod = one(objects(), "Deployment")["spec"]["template"]["spec"]["securityContext"]
        assert (pod["runAsUser"], pod["runAsGroup"]) == (int(uid), int(gid))


@pytest.mark.parametrize("image", DOCKERFILES)
def test_installs_exactly_its_extras(image):
    installs = [shlex.split(r) for r in only(DOCKERFILES[image], "RUN") if "pip install" in r]
    assert len(installs) == 1 and f".[{EXTRAS[image]}]" in installs[0]
    for extra in EXTRAS[image].split(","):
        assert extra in PYPROJECT["project"]["optional-dependencies"]


def test_the_operator_image_has_no_jax():
    assert "jax" not in DOCKERFILES["operator"].read_text().lower().replace("never jax", "")
    deps = PYPROJECT["project"]["dependencies"] + PYPROJECT["project"]["optional-dependencies"]["operator"]
    assert not [d for d in deps if d.lower().startswith(("jax", "flax", "torch"))]


@pytest.mark.parametrize("image", DOCKERFILES)
def test_no_image_ships_the_local_cluster(image):
    """pyproject installs the source roots that are present: an image that does not copy devcluster/
    has no gemma_devcluster, and no image installs the `dev` extra (kmock, the fake API server)."""
    sources = [shlex.split(c)[0] for c in only(DOCKERFILES[image], "COPY")]
    assert f"{image}/" in sources and "devcluster/" not in sources and "." not in sources
    assert "devcluster" in PYPROJECT["tool"]["setuptools"]["packages"]["find"]["where"]
    assert "dev" not in EXTRAS[image].split(",")


def test_the_operator_entrypoint_runs_what_the_chart_asks():
    assert only(DOCKERFILES["operator"], "ENTRYPOINT") == ['["gemma-tpu"]']
    assert PYPROJECT["project"]["scripts"]["gemma-tpu"] == "gemma_operator.cli:main"
    args = one(objects({"replicas": 2, "watchNamespaces": ["ml"]}), "Deployment")["spec"]["template"]["spec"][
        "containers"
    ][0]["args"]
    parsed = build_parser().parse_args(args)  # exits on an unknown flag
    assert parsed.command == "operator" and parsed.standalone and parsed.namespace == ["ml"]


def workload_commands() -> dict[str, list[str]]:
    """The commands of the pods the operator creates for the paper's fine-tune example."""
    docs = list(yaml.safe_load_all((ROOT / "examples" / "gemma4-31b-v5p8.yaml").read_text()))
    settings = OperatorSettings()
    plans, problems = plan_documents(docs, settings)
    assert not problems
    jobs = [
        o for _, p in plans for o in training_objects(p, settings) + merge_objects(p, settings) if o["kind"] == "Job"
    ]
    return {c["name"]: c["command"] for j in jobs for c in j["spec"]["template"]["spec"]["containers"]}


@pytest.mark.parametrize("container", ["trainer", "merge"])
def test_workload_entrypoints_exist_in_the_workloads_image(container):
    """`python -m gemma_workloads <workload>`: the package runs as a module and offers the workload."""
    from gemma_workloads.runner import WORKLOADS

    command = workload_commands()[container]
    assert command[:3] == ["python", "-m", "gemma_workloads"], "shipped by the workloads image (.[workloads])"
    assert (ROOT / "workloads" / "gemma_workloads" / "__main__.py").exists(), "gemma_workloads runs as a module"
    assert command[3] in WORKLOADS and command[4] == "--config", command


def test_the_images_named_are_the_images_built():
    registry, version = makefile_var("REGISTRY"), makefile_var("VERSION")
    assert version == PYPROJECT["project"]["version"]
    builds = dict(re.findall(r"docker build -f (\S+) -t (\S+) \.", (ROOT / "Makefile").read_text()))
    assert builds == {
        "operator/Dockerfile": "$(REGISTRY)/operator:$(VERSION)",
        "workloads/Dockerfile": "$(REGISTRY)/workloads:$(VERSION)",
    }
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["image"]["repository"] == f"{registry}/operator"
    assert (
        values["settings"]["images"]["workloads"]
        == OperatorSettings().images.workloads
        == f"{registry}/workloads:{version}"
    )
