# guestagent: every target works on a fresh Debian 12 machine as root.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
WHEEL_STAMP := dist/.built
SOURCES := $(shell find guestagent protos -name '*.py' -o -name '*.proto' | grep -v _pb2) pyproject.toml setup.py

VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
# ARCH=arm64 builds the bundle and the extension for aarch64 guests (docs/arm64.md).
ARCH ?= x86_64
MACHINE := $(if $(filter arm64 aarch64,$(ARCH)),aarch64,x86_64)
IMAGE_BUILD := image/build$(if $(filter aarch64,$(MACHINE)),/arm64)
BUNDLE := dist/guestagent-bundle-$(VERSION)-$(MACHINE).tar.xz
EXTENSION := dist/guestagent-extension-$(VERSION)-$(MACHINE)
NODE := dist/guestagent-node-$(VERSION)-$(MACHINE)

.PHONY: setup protos test unit vm vm-stress run bench lint image image-arm64 bundle extension \
	node-bundle node-image wheel clean

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
	$(MAKE) -C image image WHEEL=$(abspath $(wildcard dist/guestagent-*.whl)) ARCH=$(ARCH)

# The aarch64 guest the arm64 smoke suite boots (tests/vm/test_arm64.py).
image-arm64: $(WHEEL_STAMP)
	$(MAKE) -C image image WHEEL=$(abspath $(wildcard dist/guestagent-*.whl)) ARCH=arm64

# The extension bundle for any systemd guest image (docs/guest-image.md says how to add it).
bundle: $(WHEEL_STAMP)
	$(MAKE) -C image bundle WHEEL=$(abspath $(wildcard dist/guestagent-*.whl)) ARCH=$(ARCH)
	cp $(IMAGE_BUILD)/guestagent-bundle.tar.xz $(BUNDLE)

# The node daemon for a host: its own runtime, a systemd unit and the policy's defaults
# (docs/node.md).
node-bundle: $(WHEEL_STAMP)
	$(MAKE) -C image node-bundle WHEEL=$(abspath $(wildcard dist/guestagent-*.whl)) ARCH=$(ARCH)
	cp $(IMAGE_BUILD)/guestagent-node.tar.xz $(NODE).tar.xz

# The node daemon for a cluster: an OCI image archive of the same tree, for
# image/node/daemonset.yaml (docs/node.md).
node-image: $(WHEEL_STAMP)
	$(MAKE) -C image node-image WHEEL=$(abspath $(wildcard dist/guestagent-*.whl)) ARCH=$(ARCH)
	cp $(IMAGE_BUILD)/guestagent-node.oci $(NODE).oci

# The Kata guest extension image, its verity params and the runtime's configuration entry
# (docs/kata-extension.md).
extension: $(WHEEL_STAMP)
	$(MAKE) -C image extension WHEEL=$(abspath $(wildcard dist/guestagent-*.whl)) \
		PYTHON=$(abspath $(PY)) ARCH=$(ARCH)
	cp $(IMAGE_BUILD)/guestagent-extension.img $(EXTENSION).img
	cp $(IMAGE_BUILD)/guestagent-extension.verity-params $(EXTENSION).verity-params
	$(PY) -m guestagent.build.extension snippet $(abspath $(EXTENSION).img)

# The README's test command: unit, integration and VM tests, the VM ones required, the VM
# files in TEST_LANES parallel lanes (tests/run.py says why that is safe). The images (the
# guests' and the node daemon's) build in a lane of their own, beside the tests that need no
# guest; the wheel first, as its build writes the protobuf modules those tests import.
TEST_LANES ?= 2
test: $(WHEEL_STAMP)
	GUESTAGENT_VM_TESTS=required $(PY) -m tests.run --lanes $(TEST_LANES) \
		--build '$(MAKE) --no-print-directory image image-arm64 node-image'

# The quick loop: the slow fuzz tests run in `make test`.
unit: $(STAMP)
	$(PY) -m pytest -q -m 'not slow' tests/unit tests/integration

vm: image image-arm64
	GUESTAGENT_VM_TESTS=required $(PY) -m pytest -q tests/vm

# The VM suite with one host core kept busy by a hog that ends with the suite (or after
# VM_STRESS_SECONDS, or if make is interrupted), as on a loaded CI host.
VM_STRESS_SECONDS ?= 5400
vm-stress: image image-arm64
	$(PY) -m tests.stress.cpuhog --seconds $(VM_STRESS_SECONDS) --parent $$$$ & hog=$$!; \
	GUESTAGENT_VM_TESTS=required $(PY) -m pytest -q tests/vm; status=$$?; \
	kill $$hog; exit $$status

# The main job: boot the guest image in QEMU and show the agent at work.
run: image
	$(PY) -m guestagent.vm.demo

# HOSTILE_SECONDS shortens the hostile soak (default 600).
HOSTILE_SECONDS ?= 600
bench: image
	$(PY) -m tests.bench.run --out tests/bench/results/latest.json --hostile-seconds $(HOSTILE_SECONDS)

lint: $(STAMP)
	$(VENV)/bin/ruff check guestagent tests
	$(VENV)/bin/ruff format --check guestagent tests
	$(VENV)/bin/mypy guestagent
	$(VENV)/bin/mypy tests  # not strict there: see pyproject.toml
	$(PY) -m pytest -q -p no:cacheprovider tests/unit/test_layout.py  # the import contracts

clean:
	rm -rf $(VENV) dist build image/build
