# Common tasks. Every target sets up .venv first (pip install -e '.[dev,launchers,sweepers]' from
# pyproject.toml: the sweep tests run the Ray, submitit and Optuna plugins).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: install run test test-slow test-all test-dashboard lint bench clean

# (sizes measured on a full install: 161 packages with pip and PyTorch's CUDA wheels, 6.4 GB)
$(BIN)/.installed: pyproject.toml
	@echo "Installing PyTorch and about 160 other packages into $(VENV)/ (about 6 GB, first time only):"
	@echo "a few minutes, with no output while pip works."
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev,launchers,sweepers]'
	touch $@
	@echo "Installed into $(VENV)/. In a new shell, activate it before the README's commands: source $(VENV)/bin/activate"

install: $(BIN)/.installed

## Default experiment: MLP on generated 2-D data (toy2d), prints its final metrics and what Laplace changed against the MAP.
run: install
	$(BIN)/python -m laplace_lab.train $(ARGS)

## Default test run (< 10 min on 2 CPU cores); real-data tests read LAPLACE_LAB_DATA_DIR.
test: install
	$(BIN)/python -m pytest -q

## Slow tests only (real-data training, bigger models).
test-slow: install
	$(BIN)/python -m pytest -q -m slow

## The sweep dashboard in headless Chromium; installs Debian's chromium package (apt-get, as root or
## with sudo) when no chromium is on PATH. `make test` only checks the page's HTML, and needs no apt.
SUDO := $(if $(filter 0,$(shell id -u)),,sudo)
test-dashboard: install
	@command -v chromium >/dev/null || command -v chromium-browser >/dev/null || { \
	  echo "Installing Debian's chromium package with apt-get (a few hundred MB) for the dashboard's browser test"; \
	  $(SUDO) apt-get update && $(SUDO) apt-get install -y --no-install-recommends chromium; }
	LAPLACE_LAB_REQUIRE_CHROMIUM=1 $(BIN)/python -m pytest -q -m "slow or not slow" tests/reporting/test_dashboard.py tests/reporting/test_dashboard_browser.py

test-all: install
	$(BIN)/python -m pytest -q -m "slow or not slow"

lint: install
	$(BIN)/ruff check src tests benchmarks

bench: install
	$(BIN)/python benchmarks/fit.py

clean:
	rm -rf $(VENV) outputs multirun
