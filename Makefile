# Two entry points (see README): `make run` and `make test`. Both install what they need.
# `make check` is the fast lane (lint, then the tests that need no model, server or browser);
# CI runs it before the whole suite.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

$(STAMP): requirements.txt requirements-assets.txt requirements-dev.txt requirements-ray.txt pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -r requirements.txt -r requirements-dev.txt -r requirements-ray.txt
	$(BIN)/python -m pip install -q --no-deps --ignore-requires-python -r requirements-assets.txt
	$(BIN)/python -m pip install -q --no-deps -e .
	# the bytecode an installed package has (an editable install writes it at the first run,
	# unless PYTHONDONTWRITEBYTECODE is set, as on this project's machines: then every command
	# compiled layerswap's sources again, about 0.1 s of `layerswap merge`'s start-up)
	$(BIN)/python -m compileall -q layerswap_core
	touch $(STAMP)

install: $(STAMP)

# the Hub stays allowed: MGSM downloads on first use when the network is there (offline the
# app says so and evaluates GSM-Symbolic); the tests run offline
run: $(STAMP)
	$(BIN)/python app.py

test: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q -ra --durations=15

# Picked by measuring `--durations` (2026-11-28): together 33-55 s on 2 cores shared at load 7
# (about 30 s of CPU, a third of it importing torch and gradio).
CHECK_TESTS := tests/test_architecture.py tests/test_cli.py tests/test_data.py \
	tests/test_methods_registry.py tests/test_plan.py tests/test_mgsm_hub.py \
	tests/test_space.py tests/test_dependencies.py

# The conformance table over every decoder-only causal-LM type of the pinned transformers
# (tests/test_conformance.py; `make test` runs the 21 types issue #65 names): writes the table into
# docs/models.md and the count into the README. LAYERSWAP_CONFORMANCE_BUDGET: seconds (600).
conformance: $(STAMP)
	HF_HUB_OFFLINE=1 LAYERSWAP_CONFORMANCE=all LAYERSWAP_CONFORMANCE_WRITE=1 \
		$(BIN)/python -m pytest -q -ra tests/test_conformance.py

check: $(STAMP)
	$(BIN)/ruff check .
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q -ra -m "not slow and not browser and not timing" $(CHECK_TESTS)

.PHONY: install run test check conformance
