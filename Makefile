# `make demo` and `make test` set up everything they need on a fresh machine; both are safe to re-run.
PYTHON ?= python3
VENV ?= .venv
VLLM_VENV ?= .venv-vllm
PIP_QUIET = --quiet --disable-pip-version-check
# The pip of some machines warns about unusable local indexes; keep the output readable.
PIP_FILTER = 2>&1 | (grep -v "is ignored: it is neither a file nor a directory" || true)
SHELL := /bin/bash
.SHELLFLAGS := -o pipefail -ec

.PHONY: demo test test-fast venv vllm-venv crds lint clean

venv: $(VENV)/.installed
$(VENV)/.installed: pyproject.toml
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install $(PIP_QUIET) --upgrade pip $(PIP_FILTER)
	# torch: the CPU wheel first, so that nothing later pulls a CUDA build.
	$(VENV)/bin/pip install $(PIP_QUIET) torch==2.13.0 $(PIP_FILTER)
	$(VENV)/bin/pip install $(PIP_QUIET) -e '.[operator,workloads,dev,test]' $(PIP_FILTER)
	$(VENV)/bin/python -c "import gemma_operator, gemma_workloads, jax, kopf, torch"
	touch $@

test: venv
	$(VENV)/bin/python -m pytest -q

test-fast: venv
	$(VENV)/bin/python -m pytest -q -m "not slow"

crds: venv
	$(VENV)/bin/gemma-tpu crds --out manifests/crds

clean:
	rm -rf $(VENV) $(VLLM_VENV) .demo .pytest_cache
