# The Kata guest extension and the Kata-like guest that boots it (included by image/Makefile).
# build/guestagent-extension.img is `make extension`'s image; build/guestagent-extension-test.img
# differs only in components.toml, where the agent also admits vsock loopback peers (CID 1):
# the test guest's socat relay reaches it that way. build/rootfs-kata.img is the guest root.
PYTHON ?= $(CURDIR)/../.venv/bin/python
VERSION ?= $(shell sed -n 's/^version = "\(.*\)"/\1/p' ../pyproject.toml)
EXTENSION_INPUTS := $(BUILD)/extension/runtime-debs.path $(BUILD)/deps.path $(BUILD)/wheel.sha256 \
	$(wildcard ../guestagent/build/*.py) guestagent.service
EXTENSION_BUILD = cd .. && $(PYTHON) -m guestagent.build.extension build \
	--debs "$$(cat $(BUILD)/extension/runtime-debs.path)/root" --site "$$(cat $(BUILD)/deps.path)" \
	--wheel "$(WHEEL)" --version $(VERSION) --machine $(MACHINE)

.PHONY: extension kata
extension: $(BUILD)/guestagent-extension.img
kata: $(BUILD)/rootfs-kata.img $(BUILD)/guestagent-extension-test.img
ifeq ($(DEB_ARCH),amd64)
image: kata
endif

$(BUILD)/extension/runtime-debs.path: runtime-packages.txt scripts/runtime-debs.sh
	mkdir -p $(@D)
	scripts/runtime-debs.sh runtime-packages.txt $(CACHE) $@ $(DEB_ARCH)

$(BUILD)/guestagent-extension.img: $(EXTENSION_INPUTS)
	$(EXTENSION_BUILD) --out $@

$(BUILD)/guestagent-extension-test.img: $(EXTENSION_INPUTS)
	$(EXTENSION_BUILD) --agent-arg=--allow-cid=1 --out $@

$(BUILD)/rootfs-kata.img: $(wildcard kata/*) scripts/ext4-image.sh
	kata/rootfs.sh $(CACHE) kata $@
