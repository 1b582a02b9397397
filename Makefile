# The two commands of the README: `make demo` and `make test`. Both create .venv on first use.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: demo test lint bench clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[cloud,dashboard,dev]'
	@touch $(STAMP)

demo: $(STAMP)
	$(BIN)/onepool demo

test: $(STAMP)
	$(BIN)/python -m pytest -q

# The gates .ci/run applies before the tests: ruff over every package, mypy --strict where the
# code promises it (the pure policy, the provider contract), and the import contracts in
# pyproject.toml (broker/policy imports no IO; pricing imports nothing of broker).
lint: $(STAMP)
	$(BIN)/ruff check broker providers pricing dashboard tests bench examples
	$(BIN)/mypy --strict broker/policy providers/base.py
	$(BIN)/lint-imports

clean:
	rm -rf $(VENV) .onepool .pytest_cache
