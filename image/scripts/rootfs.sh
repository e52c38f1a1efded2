#!/bin/sh
# Assemble the guest root filesystem from the cached layers and write it as an ext4 image
# with mkfs.ext4 -d (no loop mount, so no privileges beyond file ownership are needed).
# FLAVOUR is fast (PID 1 is image/init, a shell script) or systemd (PID 1 is systemd, the agent
# a unit, as in Kata's guest images).
# Usage: rootfs.sh FLAVOUR BASE_STAMP KERNEL_DIR BUNDLE WHEEL IMAGE_DIR OUTPUT
# (BASE_STAMP holds the cached base tarball's path; BUNDLE is the `make bundle` tarball)
set -eu
flavour=$1 base=$(cat "$2") kernel=$3 bundle=$4 wheel=$5 image=$6 output=$7

staging=$output.d
rm -rf "$staging"
mkdir -p "$staging"
tar -C "$staging" -xf "$base"

# Kernel modules: those loaded at boot, plus the small directories the agent may modprobe
# from on demand (zram compressors, virtio_mem, ...); the rest of the 90 MB tree stays out.
kver=$(cat "$kernel/version")
modules=lib/modules/$kver
(cd "$kernel/root" && {
    sed 's|^/||' "$kernel/boot.list"
    find "$modules"/kernel/arch/*/crypto "$modules/kernel/crypto" "$modules/kernel/lib" \
        "$modules/kernel/mm" "$modules/kernel/drivers/virtio" "$modules/kernel/drivers/block" \
        -name '*.ko'
    ls "$modules"/modules.builtin* "$modules/modules.order"
} | sort -u | cpio --quiet -pdm "$staging/usr")
depmod -b "$staging/usr" "$kver"

# The agent: the bundle's venv, unit and defaults, exactly as an operator would unpack them.
tar -C "$staging" -xJf "$bundle"
# Test tooling, never in the bundle: guestctl in the guest, the whole package (host side
# included) run by the bundle's interpreter.
mkdir -p "$staging/usr/local/lib/guestctl" "$staging/usr/local/bin"
python3 -c 'import sys, zipfile; z = zipfile.ZipFile(sys.argv[1]); z.extractall(sys.argv[2], [n for n in z.namelist() if n.startswith("guestagent/")])' \
    "$wheel" "$staging/usr/local/lib/guestctl"
printf '%s\n' '#!/opt/guestagent/bin/python3.11 -IBXutf8' 'import sys' \
    'sys.path.insert(0, "/usr/local/lib/guestctl")' 'from guestagent.host.ctl import main' \
    'sys.exit(main())' > "$staging/usr/local/bin/guestctl"
chmod 755 "$staging/usr/local/bin/guestctl"
install -m 755 "$image/testexec.py" "$staging/usr/local/sbin/guestagent-testexec"
install -m 755 "$image/standin-agent.py" "$staging/usr/local/sbin/guestagent-standin"
for applet in poweroff reboot halt; do ln -sf /bin/busybox "$staging/usr/local/sbin/$applet"; done
case $flavour in
    fast)
        install -m 755 "$image/init" "$staging/sbin/guestagent-init"
        ;;
    systemd)
        # Test-only units: the command channel (only with guestagent.testexec=1 on the kernel
        # command line) and the address QEMU's user network forwards the agent's tcp port to.
        for unit in "$image"/systemd/*.service; do
            install -m 644 "$unit" "$staging/etc/systemd/system/${unit##*/}"
        done
        # The test harness reaches the agent over tcp too: host-to-guest vsock is not
        # available everywhere the tests run.
        install -m 644 "$image/systemd/guestagent.default" "$staging/etc/default/guestagent"
        systemctl --root="$staging" --quiet enable guestagent.service \
            guestagent-testexec.service guestagent-testnet.service
        ;;
    *)
        echo "rootfs.sh: unknown flavour '$flavour' (fast or systemd)" >&2
        exit 1
        ;;
esac

# Keep the kernel's eth0 name: udev's default link policy would rename it.
mkdir -p "$staging/etc/systemd/network"
ln -sf /dev/null "$staging/etc/systemd/network/99-default.link"
echo guest > "$staging/etc/hostname"

"$image/scripts/ext4-image.sh" "$staging" guestroot "$output"
