# pitlab — every target creates the virtual environment first if it is missing.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PITLAB_DATA_ROOT ?= $(abspath ../shared/data)
export PITLAB_DATA_ROOT
PYTEST_ARGS ?=

.PHONY: install demo test validate clean help

help:  ## show the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'

$(BIN)/.installed: pyproject.toml
	@test -d "$(PITLAB_DATA_ROOT)" || { echo "error: shared data not found at $(PITLAB_DATA_ROOT); set PITLAB_DATA_ROOT=/path/to/shared/data"; exit 2; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test]'
	@touch $@

install: $(BIN)/.installed  ## create .venv and install pitlab with its test extras

demo: $(BIN)/.installed  ## run the local example: PIT training on FOMC statements + leakage eval on the S&P 500
	$(BIN)/pitlab run examples/local-sp500-fomc.yaml --overwrite

validate: $(BIN)/.installed  ## validate every example spec
	@for f in examples/*.yaml; do $(BIN)/pitlab validate $$f || exit 1; done

test: $(BIN)/.installed  ## run the test suite
	$(BIN)/python -m pytest $(PYTEST_ARGS)

clean:  ## remove outputs (keeps .venv)
	rm -rf out .pytest_cache
