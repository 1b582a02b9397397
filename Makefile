# The two commands of the README: `make demo` and `make test`. Both create .venv on first use.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: demo test test-deps chaos lint bench clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[cloud,dashboard,postgres,dev]'
	@touch $(STAMP)

demo: $(STAMP)
	$(BIN)/onepool demo

# What tests need from outside Python is installed here, never inside a test.
test-deps:
	infra/test/install-chromium.sh

test: $(STAMP) test-deps
	$(BIN)/python -m pytest -q

# Not part of `make test`: kills servers, supervisors and agents CHAOS_KILLS times (default 100) under
# cloud faults, then checks every job completed once (tests/chaos/run.py).
chaos: $(STAMP)
	$(BIN)/python -m tests.chaos

lint: $(STAMP)
	$(BIN)/ruff check broker providers pricing dashboard tests examples bench

clean:
	rm -rf $(VENV) .onepool .pytest_cache build
