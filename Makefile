# Two commands: `make run` (the embedded default) and `make test` (the whole suite).
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test install clean

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(VENV)/bin/gyre run --config configs/tiny-cpu.yaml

test: $(STAMP)
	$(PY) -m pytest -q

clean:
	rm -rf $(VENV) .gyre-cache runs
