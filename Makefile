# Two commands: `make run` (the embedded default) and `make test` (the whole suite). Each installs what
# it needs first: the Python environment (.venv, from pyproject.toml) and the system packages
# (scripts/system-deps.sh: installed when run as root, else it stops with the one apt command).
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test install system-deps clean

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

system-deps:
	bash scripts/system-deps.sh

run: $(STAMP) system-deps
	$(VENV)/bin/gyre run --config configs/tiny-cpu.yaml

test: $(STAMP) system-deps
	PREFECT_SERVER_ANALYTICS_ENABLED=false GYRE_REQUIRE_SANDBOX=1 $(PY) -m pytest -q

clean:
	rm -rf $(VENV) .gyre-cache runs
