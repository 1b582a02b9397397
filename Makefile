# The two commands of the README: `make demo` and `make test`. Both create .venv on first use.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: demo test test-deps chaos lint bench clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[server,cloud,dashboard,postgres,dev]'
	@touch $(STAMP)

demo: $(STAMP)
	$(BIN)/onepool demo

# What tests need from outside Python is installed here, never inside a test.
test-deps: $(STAMP)
	infra/test/install-chromium.sh
	infra/test/install-prometheus.sh
	infra/test/install-podman.sh
	$(BIN)/python -c "from tests.postgres import ensure_installed; ensure_installed()"
	tests/slurm/start_slurm.sh || echo "the Slurm test cluster cannot run here: its tests will be skipped" >&2

# Two workers (pytest-xdist); the Slurm tests share one test cluster, so they stay on one.
test: $(STAMP) test-deps
	$(BIN)/python -m pytest -q -n 2 --dist loadgroup

# Not part of `make test`: kills servers, supervisors and agents CHAOS_KILLS times (default 100) under
# cloud faults, then checks every job completed once (tests/chaos/run.py).
chaos: $(STAMP)
	$(BIN)/python -m tests.chaos

# The gates .ci/run applies before the tests: ruff over every package, mypy --strict where the
# code promises it (the pure policy and the simulator, which bench/compiled.py compiles with
# mypyc; the provider contract), and the import contracts in
# pyproject.toml (broker/policy imports no IO; pricing imports nothing of broker).
lint: $(STAMP)
	$(BIN)/ruff check broker providers pricing dashboard tests bench examples
	$(BIN)/mypy --strict broker/policy broker/sim providers/base.py
	$(BIN)/lint-imports

clean:
	rm -rf $(VENV) .onepool .pytest_cache build
