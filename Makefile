# guestagent: every target works on a fresh Debian 12 machine as root.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
WHEEL_STAMP := dist/.built
SOURCES := $(shell find guestagent protos -name '*.py' -o -name '*.proto' | grep -v _pb2) pyproject.toml setup.py

.PHONY: setup protos test unit vm run bench lint image wheel clean

setup: $(STAMP)

$(STAMP): pyproject.toml setup.py image/requirements.txt
	bash image/install-host-deps.sh
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c image/requirements.txt -e '.[test,dev,bench]'
	touch $@

# Regenerate guestagent/v1 after editing protos/ (an editable install does it too).
protos: $(STAMP)
	$(PY) -c 'from pathlib import Path; from setup import generate_protos; generate_protos(Path("."))'

wheel: $(WHEEL_STAMP)

$(WHEEL_STAMP): $(STAMP) $(SOURCES)
	rm -rf dist && mkdir -p dist
	$(PY) -m pip wheel -q --no-deps --no-build-isolation -w dist .
	touch $@

image: $(WHEEL_STAMP)
	$(MAKE) -C image image WHEEL=$(abspath $(wildcard dist/guestagent-*.whl))

# The README's test command: unit, integration and VM tests, the VM ones required.
test: image
	GUESTAGENT_VM_TESTS=required $(PY) -m pytest -q

unit: $(STAMP)
	$(PY) -m pytest -q tests/unit tests/integration

vm: image
	GUESTAGENT_VM_TESTS=required $(PY) -m pytest -q tests/vm

# The main job: boot the guest image in QEMU and show the agent at work.
run: image
	$(PY) -m guestagent.vm.demo

bench: image
	$(PY) -m tests.bench.run --out tests/bench/results/latest.json

lint: $(STAMP)
	$(VENV)/bin/ruff check guestagent tests
	$(VENV)/bin/ruff format --check guestagent tests
	$(VENV)/bin/mypy guestagent

clean:
	rm -rf $(VENV) dist build image/build
