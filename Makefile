# Everyday commands. `make serve` and `make test` are the README's two commands; CI runs
# `make test`, `make typecheck`, `make docs`, `make test-no-data`, `make audit`, `make
# test-slow`, `make test-ray`, `make fuzz`, `make test-clients` and then `make test-e2e`
# (.ci/run). `make mutate` measures the suite (mutation score), not part of CI: ~1-2 h.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
MODELS ?= models
PORT ?= 8080
# What ruff checks and formats.
PY_DIRS := demo heads service training tests benchmarks docs .ci
# setuptools' editable build warns on every install ("Editable installation. Please be careful
# with folders ... same name as your package"): 10 lines of noise before each `make serve`. The
# filter reaches the build backend's own process through the environment.
PIP_INSTALL := PYTHONWARNINGS="ignore:Editable installation" $(BIN)/pip install -q

.PHONY: help install install-dev test docs test-fresh test-no-data test-slow test-ray fuzz test-clients test-e2e mutate audit lock lint format typecheck models models-tasks serve clean docker-check docker-up docker-down

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

$(BIN)/python:
	@echo "[setup] creating the virtual environment $(VENV)/"
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

install: $(BIN)/python  ## the service only (CPU ONNX Runtime), no torch
	@echo "[setup] installing the service into $(VENV)/ (first time: about 30 s)"
	$(PIP_INSTALL) -e ".[cpu]"

# A stamp, so that later runs skip pip (~10 s of checking) until pyproject.toml changes.
$(VENV)/.installed-dev: pyproject.toml | $(BIN)/python
	@echo "[setup] installing the service, training, test and docs tools (torch CPU, transformers, mkdocs) into $(VENV)/ (first time: about 1-2 min, quiet)"
	$(PIP_INSTALL) -e ".[cpu,train,dev,docs]"
	@touch $@

install-dev: $(VENV)/.installed-dev  ## service + training + test and docs tools

test: install-dev  ## lint + the unit suite (minutes; what CI runs first)
	$(BIN)/ruff check $(PY_DIRS)
	$(BIN)/ruff format --check $(PY_DIRS)
	$(BIN)/python -m pytest -q

# The site of docs/*.md, with the parts docs/hooks.py makes at build time (the API reference
# from the OpenAPI schema, settings, metrics, benchmark tables). --strict: a broken link or
# anchor, a page left out of mkdocs.yml's nav, or an open code fence fails the build.
# (Not --quiet: it silences the warnings that --strict counts, and the build passes.)
docs: install-dev  ## the documentation site into build/site (mkdocs build --strict)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict
	@echo "[docs] build/site/index.html"

# As on a fresh clone without ../shared beside it (tests that need it skip; none may fail).
test-fresh: install-dev  ## the unit suite with ../shared hidden (what a user's clone runs)
	rm -rf build/no-shared-data && mkdir -p build/no-shared-data
	BERT_HEADS_TEST_DATA=$(CURDIR)/build/no-shared-data $(BIN)/python -m pytest -q -p no:cacheprovider

# What CI adds to `make test` for the same assurance in a fifth of the time: `make test` already
# fails a test that opens ../shared without asking for it (tests/conftest.py), so only the tests
# that ask can behave differently on a clone; here they run with the data hidden and must skip.
test-no-data: install-dev  ## the tests that read ../shared/data, with it hidden: they skip, none fails (CI)
	rm -rf build/no-shared-data && mkdir -p build/no-shared-data
	BERT_HEADS_TEST_DATA=$(CURDIR)/build/no-shared-data BERT_HEADS_ONLY_SHARED=1 $(BIN)/python -m pytest -q -p no:cacheprovider

test-slow: install-dev  ## the slow-marked tests: the docs' training commands, MiniLM end to end, a soak, the families over HTTP (CI runs it)
	$(BIN)/python -m pytest -q -m slow -p no:cacheprovider

# Ray is heavy (240 MB installed, and a local instance takes 20-60 s to start on 2 busy cores):
# its extra is installed here, not by install-dev, and its tests (marked `ray`) run only here.
test-ray: install-dev  ## the Ray Data stage on a local Ray: two actors, answers equal the server's (installs the ray extra)
	$(PIP_INSTALL) -e ".[ray]"
	$(BIN)/python -c "import ray.data"  # a broken install fails here, not as skipped tests
	$(BIN)/python -m pytest -q -m ray -p no:cacheprovider

# schemathesis against `python -m service` on tiny packages, seed 0 (tests/service/test_fuzz.py);
# the longer run with its tables is `python -m benchmarks.fuzz` (benchmarks/results/fuzz.md).
fuzz: install-dev  ## schema fuzzing of a live server: no 5xx, answers as documented (2-4 min; CI runs it)
	$(BIN)/python -m pytest -q -m fuzz -p no:cacheprovider

# The client libraries of requirements/clients.txt (openai, langchain-openai, cohere,
# huggingface_hub, tritonclient), pinned, in their own environment: their README calls,
# unmodified, against a real server on tiny packages, answers compared with the native routes.
CLIENTS_VENV := build/clients-venv
$(CLIENTS_VENV)/.installed: requirements/clients.txt
	rm -rf $(CLIENTS_VENV) && $(PY) -m venv $(CLIENTS_VENV)
	$(CLIENTS_VENV)/bin/pip install -q -r requirements/clients.txt
	$(CLIENTS_VENV)/bin/python -c "import openai, cohere, langchain_openai, huggingface_hub, tritonclient.http"
	@touch $@

test-clients: install-dev $(CLIENTS_VENV)/.installed  ## the client libraries (pinned, from PyPI) against a real server (1-2 min; CI runs it)
	BERT_HEADS_CLIENTS_PYTHON=$(CURDIR)/$(CLIENTS_VENV)/bin/python $(BIN)/python -m pytest -q -m clients -p no:cacheprovider tests/clients

# Deliberate defects in the modules where answers are made, each run against the tests that
# reach it as `make test-fresh` runs them: benchmarks/results/mutation.md lists the score per
# module and every surviving mutant. MUTATE="ner qa" for some modules only.
mutate: install-dev  ## mutation score of the suite (mutmut; ~1-2 h on 2 cores): benchmarks/results/mutation.md
	$(BIN)/python -m benchmarks.mutate $(if $(MUTATE),--only $(MUTATE))

models: install-dev  ## build the default model repository into ./models (MiniLM + demo heads)
	@echo "[models] the default models in $(MODELS)/: building the missing ones, if any"
	$(BIN)/python -m demo.models --out $(MODELS)

models-tasks: install-dev  ## also build the task demos: a reranker and an NLI model for zero-shot (about 3-4 min)
	@echo "[models] the task demos in $(MODELS)/ (demo-reranker, demo-nli): building the missing ones"
	$(BIN)/python -m demo.models --out $(MODELS) --tasks

# Ctrl-C drains the service, which exits 0; make gets the terminal's SIGINT too and dies of it
# (status 130; now and then 0, see tests/test_serve_signals.py), as any interrupted make does. A
# SIGTERM to the service's process: both exit 0 (docs/quickstart.md).
serve: install-dev models  ## install, build the default models if missing, serve on 127.0.0.1:8080
	@echo "[serve] starting on 127.0.0.1:$(PORT) (ready when /ready answers 200; Ctrl-C stops it)"
	$(BIN)/python -m service --model-dir $(MODELS) --port $(PORT)

test-e2e: models  ## the docs' answers from the real default and task builds, then Docker end to end: image, compose up, real requests (sets up Docker as root if absent)
	BERT_HEADS_DEMO_MODELS=$(abspath $(MODELS)) $(BIN)/python -m pytest -q -m 'tasks or demo' -p no:cacheprovider
	bash .ci/with-docker.sh $(BIN)/python -m pytest -q -m docker -p no:cacheprovider -s

# One line naming what is missing, instead of `docker: unknown command: docker compose` halfway
# through. $(error) stops make with that line alone.
docker-check:  ## check for Docker Engine (daemon running) and Compose v2
	$(if $(shell command -v docker),,$(error Docker is not installed: install Docker Engine, https://docs.docker.com/engine/install/))
	$(if $(shell docker info >/dev/null 2>&1 && echo ok),,$(error the Docker daemon is not reachable: start it (sudo systemctl start docker) or join the docker group; `docker info` says why))
	$(if $(shell docker compose version >/dev/null 2>&1 && echo ok),,$(error Docker Compose v2 is missing (`docker compose version` fails): install the docker-compose-plugin package))
	@echo "docker: $$(docker info --format '{{.ServerVersion}}' 2>/dev/null), $$(docker compose version --short 2>/dev/null)"

docker-up: docker-check models  ## build ./models if missing, then docker compose up -d --wait (127.0.0.1:8080)
	docker compose up -d --wait

docker-down: docker-check  ## stop the compose services
	docker compose down

lint: install-dev  ## ruff lint + format check
	$(BIN)/ruff check $(PY_DIRS)
	$(BIN)/ruff format --check $(PY_DIRS)

format:  ## ruff format + autofix
	$(BIN)/ruff format $(PY_DIRS)
	$(BIN)/ruff check --fix $(PY_DIRS)

audit: install-dev  ## pip-audit the pinned service dependencies (requirements/service.txt)
	$(BIN)/python .ci/audit.py requirements/service.txt

lock:  ## re-pin requirements/service.txt from a fresh install of the service (no dev tools)
	rm -rf build/lock-venv && $(PY) -m venv build/lock-venv
	build/lock-venv/bin/pip install -q ".[cpu]"
	head -3 requirements/service.txt > build/service.txt
	build/lock-venv/bin/pip freeze --exclude-editable | grep -iv '^bert-heads' >> build/service.txt
	mv build/service.txt requirements/service.txt

typecheck: install-dev  ## mypy on heads/, service/ and training/
	$(BIN)/mypy

clean:  ## remove the virtualenv and caches (not ./models)
	rm -rf $(VENV) .pytest_cache .ruff_cache .mypy_cache
